"""``append_many``: several turns of one session in as few round trips as it can, and
exactly what the same appends one by one would store.

The promise: whatever the turns are (kinds, sizes, retried turn ids, turns a session
bound refuses, a session that expires between calls, partition pressure that evicts or
sweeps other sessions) and whatever other clients do between the calls, ``append_many``
stores a prefix of its turns in order -- the turns that ``append`` of each in turn,
stopping at the first error, would store -- with the same receipts, and raises that same
first error with ``stored`` naming the prefix.  One ``append_turn`` call takes up to 16
turns: the first takes the script's whole path, the others its common path, and a turn
that needs more (a sweep due, partition pressure) ends the call before it.  The
adversaries: two generated model comparisons (one key appended one by one, a twin key by
``append_many``, on every backend and both APIs; the second with other sessions filling,
expiring and being evicted from both twins' partitions alike), other clients acting
between the calls of one ``append_many``, and the script driven directly (its early ends,
malformed batches that write nothing).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import memfixtures
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from memhelpers import Clock, key, sync_store
from roundtrips import ROUND_TRIP_BACKENDS, Writes

import memtier.engine
from memtier import AgentResponse, AvatarMessage, ConversationKey, ConversationStore, ToolSummary
from memtier import limits as memtier_limits
from memtier.errors import MemtierError, ScriptError, SessionFullError, ValidationError
from memtier.memory.models import AppendReceipt

make_store = memfixtures.make_store

TTL_MS = 60_000
_avatars = itertools.count(1)

# (kind 0 avatar / 1 agent / 2 tool, size, turn id from a small pool or fresh)
TURN = st.tuples(st.integers(0, 2), st.integers(1, 700), st.one_of(st.none(), st.integers(0, 5)))
# a batch of turns, or ("expire",): the sessions' TTL passes before the next batch
OPS = st.lists(
    st.one_of(st.lists(TURN, min_size=1, max_size=7), st.just(("expire",))),
    min_size=1,
    max_size=6,
)


def _turn(kind: int, size: int, pool_id: int | None, n: int) -> Any:
    tid = f"p{pool_id}" if pool_id is not None else f"u{n}"
    text = f"{n} " + "x" * size
    if kind == 0:
        return AvatarMessage(text=text, turn_id=tid)
    if kind == 1:
        return AgentResponse(text=text, turn_id=tid)
    return ToolSummary(tool="search", summary=text, turn_id=tid)


def _receipt(r: AppendReceipt, sessions: dict[str, int]) -> tuple[Any, ...]:
    # session ids are random: compare which session (in order of first sight) instead
    session = sessions.setdefault(r.session_id, len(sessions))
    return (
        session,
        r.seq,
        r.timestamp,
        r.bytes,
        r.rotated,
        r.session_bytes,
        r.turn_count,
        r.duplicate,
        r.truncated,
        r.redactions,
        r.evicted,
        r.swept,
    )


def _error(exc: BaseException) -> tuple[Any, ...]:
    assert isinstance(exc, MemtierError), exc
    details = {k: v for k, v in exc.details.items() if k != "stored"}
    return (type(exc), exc.code, tuple(sorted(details.items())))


def _stored(store: Any, k: ConversationKey, raw: Any) -> tuple[Any, ...]:
    """The session's turns and summary, whether a compaction job is queued for it, and
    its turn-id claims (id -> seq)."""
    ctx = store.context(k)
    sk = store.core.partition_for(k).session(k.member)
    queued = raw.hexists(sk.session, "cq")
    claims = raw.zrange(sk.turn_ids, 0, -1, withscores=True)
    turns = tuple((t.seq, t.kind, t.turn_id, dict(t.fields)) for t in ctx.turns)
    return (ctx.summary, turns, queued, claims)


def _one_by_one(store: Any, k: ConversationKey, turns: Sequence[Any]) -> Any:
    """What ``append`` of each turn in turn stores: receipts, and the first error."""
    receipts: list[AppendReceipt] = []
    for turn in turns:
        try:
            receipts.append(store.append(k, turn))
        except MemtierError as exc:
            return receipts, exc
    return receipts, None


def _at_once(store: Any, k: ConversationKey, turns: Sequence[Any]) -> Any:
    try:
        return store.append_many(k, turns), None
    except MemtierError as exc:
        assert exc.details.get("stored") is not None, exc.details
        return None, exc


def _twin_keys(store: Any) -> tuple[ConversationKey, ConversationKey]:
    """Two fresh keys in different partitions: an append sweeps its own partition's
    expired sessions, so twins sharing one would sweep each other."""
    one = key(next(_avatars))
    home = store.core.partition_for(one).partition
    for _ in range(1_000):
        many = key(next(_avatars))
        if store.core.partition_for(many).partition != home:
            return one, many
    raise AssertionError("no key in another partition")


def _fillers(store: Any, twins: Sequence[ConversationKey], n: int) -> list[list[ConversationKey]]:
    """``n`` fresh keys in each twin's partition, every third on the im channel (by
    position, so that both partitions get the same channels)."""
    found: list[list[ConversationKey]] = []
    for twin in twins:
        home = store.core.partition_for(twin).partition
        keys: list[ConversationKey] = []
        for j in range(n):
            channel = "im" if j % 3 == 2 else "public"
            for _ in range(1_000):
                k = key(next(_avatars), channel)
                if store.core.partition_for(k).partition == home:
                    keys.append(k)
                    break
            else:
                raise AssertionError("no key in the twin's partition")
        found.append(keys)
    return found


def _compare(store: Any, clock: Clock, ops: list[Any], raw: Any) -> None:
    """Each op on both twins alike: a batch (one by one against ``append_many``), a fill
    of their partitions, or the TTL passing; after each, the same state on both sides."""
    one, many = _twin_keys(store)
    seen_one: dict[str, int] = {}
    seen_many: dict[str, int] = {}
    fill_one: list[ConversationKey] = []
    fill_many: list[ConversationKey] = []
    count = 0
    for op in ops:
        if op == ("expire",):
            clock.advance(TTL_MS)
        elif op[0] == "fill":
            _, n, size = op
            a, b = _fillers(store, (one, many), n)
            for ka, kb in zip(a, b, strict=True):
                clock.advance(1)  # distinct LRU scores: the same victims on both sides
                for k in (ka, kb):
                    with contextlib.suppress(MemtierError):
                        store.append(k, AvatarMessage(text="f" * size))
            fill_one += a
            fill_many += b
        else:
            turns = [_turn(kind, size, pid, count + i) for i, (kind, size, pid) in enumerate(op)]
            count += len(turns)
            want, want_error = _one_by_one(store, one, turns)
            got, got_error = _at_once(store, many, turns)
            if want_error is None:
                assert got_error is None, got_error
                assert [_receipt(r, seen_many) for r in got] == [
                    _receipt(r, seen_one) for r in want
                ]
            else:
                assert got_error is not None, "append_many stored past the first refusal"
                assert _error(got_error) == _error(want_error)
                assert got_error.details["stored"] == len(want)
                seen_one.clear()
                seen_many.clear()
            clock.advance(1)
        assert _stored(store, many, raw) == _stored(store, one, raw)
        # the other sessions of both partitions: the same ones live, with the same turns
        assert [len(store.context(k).turns) for k in fill_many] == [
            len(store.context(k).turns) for k in fill_one
        ]


def _fresh_store(
    backend: Any, make_store: Any, clock: Clock, inline: bool, partitions: int, **conv: Any
) -> Any:
    """A store on a clean namespace (expired sessions of earlier examples would be swept,
    and counted in ``swept``, by whichever twin appends first), with small session bounds
    so that batches are refused mid-way."""
    if backend.is_fake:
        backend.sync_client().flushall()
    else:
        backend.delete_namespace()
    return make_store(
        backend,
        clock,
        inline_compaction=inline,
        partitions=partitions,
        conversation={
            "max_turns_per_session": 5,
            "max_session_bytes": 1024,
            "max_turn_bytes": 600,
            "max_tool_results": 2,
            "public_ttl_seconds": TTL_MS // 1000,
            **conv,
        },
    )


def test_append_many_stores_what_appends_one_by_one_store(backend: Any, make_store: Any) -> None:
    """The model comparison: small session bounds so that batches are refused mid-way;
    inline compaction on and off."""

    @settings(max_examples=15, deadline=None)
    @given(ops=OPS, inline=st.booleans())
    # a bound refuses the third turn of a batch: the two before it stay, none after it
    @example(ops=[[(0, 5, None)] * 6], inline=False)
    # the same with inline compaction: compacted, then the rest in order
    @example(ops=[[(0, 5, None)] * 7, [(1, 5, None)] * 4], inline=True)
    # a tool bound, a retried id inside one batch, then the sessions expire
    @example(
        ops=[[(2, 3, None), (2, 3, 1), (0, 3, 1), (2, 3, None)], ("expire",), [(1, 9, 1)]],
        inline=False,
    )
    # compacted inline (the folded turns' ids keep receipts), then a batch's second turn
    # retries a folded turn: answered from its receipt
    @example(
        ops=[[(0, 5, i) for i in range(5)] + [(0, 5, None)], [(1, 5, None), (0, 5, 0)]], inline=True
    )
    # a batch whose first turn is answered from a receipt, the rest stored after it
    @example(
        ops=[[(0, 5, i) for i in range(5)] + [(0, 5, None)], [(0, 5, 0), (1, 5, None)]], inline=True
    )
    # the first turn rotates the expired session; the others go into the new one
    @example(
        ops=[[(0, 5, None)], ("expire",), [(0, 5, None), (2, 5, None), (1, 5, None)]], inline=False
    )
    # a turn larger than the session's byte bound, mid-batch
    @example(ops=[[(0, 5, None), (1, 500, None), (1, 500, None), (0, 5, None)]], inline=False)
    def check(ops: list[Any], inline: bool) -> None:
        clock = Clock()
        store = _fresh_store(backend, make_store, clock, inline, partitions=8)
        _compare(store, clock, ops, backend.sync_client())

    check()


# --- the model comparison under partition pressure ------------------------------------------
# a batch of turns; ("fill", n, size): n new sessions in each twin's partition alike;
# ("expire",): every session's TTL passes
PRESSURE_OPS = st.lists(
    st.one_of(
        st.lists(TURN, min_size=1, max_size=7),
        st.tuples(st.just("fill"), st.integers(1, 10), st.integers(1, 400)),
        st.just(("expire",)),
    ),
    min_size=1,
    max_size=7,
)


def test_append_many_under_partition_pressure(backend: Any, make_store: Any) -> None:
    """The model comparison with other sessions in both twins' partitions: batches that
    evict them (for bytes and for the session count), sweep them when they expired (a
    full sweep batch ends a call early), and are refused when nothing can be evicted."""

    @settings(max_examples=12, deadline=None)
    @given(ops=PRESSURE_OPS, inline=st.booleans())
    # byte pressure at a batch's second turn: the call ends, the next evicts first
    @example(ops=[("fill", 4, 400), [(0, 300, None)] * 4], inline=False)
    # the session count at its ceiling, then a new session's batch evicts one
    @example(ops=[("fill", 8, 5), [(1, 5, None)] * 3], inline=True)
    # more expired sessions than one sweep takes: the first turn's sweep ends the call
    @example(ops=[("fill", 9, 5), ("expire",), [(0, 5, None)] * 5], inline=False)
    # nothing evictable: the batch's own session holds the partition's bytes
    @example(ops=[[(1, 500, None), (1, 500, None), (0, 5, None)], [(0, 500, None)]], inline=True)
    def check(ops: list[Any], inline: bool) -> None:
        clock = Clock()
        store = _fresh_store(
            backend,
            make_store,
            clock,
            inline,
            partitions=2,
            max_active_sessions=2 * 9,
            max_aggregate_bytes=2 * 2_400,
            im_ttl_seconds=TTL_MS // 1000,
        )
        _compare(store, clock, ops, backend.sync_client())

    check()


# --- the script driven directly -------------------------------------------------------------
def _state(store: ConversationStore, k: ConversationKey) -> tuple[Any, ...]:
    """Everything append_turn may write for ``k``: its session's keys and the partition's."""
    client, part = store.client, store.core.partition_for(k)
    sk = part.session(k.member)
    return (
        client.hgetall(sk.session),
        client.lrange(sk.turns, 0, -1),
        client.zrange(sk.turn_ids, 0, -1, withscores=True),
        client.hgetall(part.meta),
        client.hgetall(part.index),
        client.zrange(part.lru(k.channel.value), 0, -1, withscores=True),
        client.xlen(part.events),
    )


def _call(store: ConversationStore, k: ConversationKey, turns: Sequence[Any]) -> Any:
    """One append_turn call of ``turns`` (a batch's first and its others), its raw reply."""
    core = store.core
    prepared = [core.prepare_turn(k, t) for t in turns]
    return store.executor.execute(core.append_call(prepared[0], more=prepared[1:]))


def test_a_malformed_batch_call_writes_nothing(backend: Any) -> None:
    store = sync_store(backend, Clock())
    k = key(next(_avatars) + 10_000)
    store.append(k, AvatarMessage(text="first", turn_id="a"))
    core = store.core
    good = core.append_call(
        core.prepare_turn(k, AvatarMessage(text="b", turn_id="b")),
        more=[core.prepare_turn(k, AvatarMessage(text="c", turn_id="c"))],
    )
    base, extra = good.args[:23], good.args[23:]
    bad_extras = {
        "a value short": extra[:3],
        "an empty turn id": ("", *extra[1:]),
        "turn bytes not canonical": (*extra[:2], "07", extra[3]),
        "bad flags": (*extra[:3], "2v1"),
        # one turn past the client's bound, which is the script's own ceiling too
        "too many turns": extra * memtier_limits.APPEND_BATCH_TURNS,
    }
    for name, args in bad_extras.items():
        before = _state(store, k)
        call = memtier.engine.ScriptCall(good.script, good.keys, (*base, *args))
        with pytest.raises(ScriptError, match="malformed ARGV"):
            store.executor.execute(call)
        assert _state(store, k) == before, name
    most = memtier_limits.APPEND_BATCH_TURNS
    full = core.append_call(
        core.prepare_turn(k, AvatarMessage(text="b", turn_id="b")),
        more=[core.prepare_turn(k, AvatarMessage(text=f"x{i}")) for i in range(most - 1)],
    )
    assert len(store.executor.execute(full)) == most  # the ceiling itself is taken


def test_a_call_ends_before_a_turn_that_needs_a_sweep(backend: Any) -> None:
    """The first turn's sweep finds a full batch (so another is due at once): the call
    ends after it, and append_many sends the rest in a new call that sweeps first."""
    clock = Clock()
    store = sync_store(backend, clock, partitions=1, conversation={"public_ttl_seconds": 60})
    base = next(_avatars) + 60_000
    for i in range(memtier_limits.SWEEP_PER_WRITE + 3):
        store.append(key(base + i), AvatarMessage(text="old"))
    k = key(base + 100)
    clock.advance(60_000)
    reply = _call(store, k, [AvatarMessage(text=f"t{i}", turn_id=f"t{i}") for i in range(3)])
    assert len(reply) == 1 and int(reply[0][0]) == 0  # only the first turn was handled
    assert int(reply[0][11]) == memtier_limits.SWEEP_PER_WRITE  # it swept a full batch
    assert store.client.zscore(store.core.partition_for(k).session(k.member).turn_ids, "t1") is None
    got = store.append_many(k, [AvatarMessage(text=f"t{i}", turn_id=f"t{i}") for i in range(3)])
    assert [(r.seq, r.duplicate) for r in got] == [(1, True), (2, False), (3, False)]
    assert got[1].swept == 3  # the rest of the expired sessions, in the new call


def test_a_call_ends_before_a_turn_that_needs_eviction(backend: Any) -> None:
    """Partition pressure at a batch's second turn: the call ends before it and gives its
    turn id back; the next call evicts first, as the same append alone would."""
    clock = Clock()
    store = sync_store(
        backend,
        clock,
        partitions=1,
        conversation={"max_aggregate_bytes": 2_048, "max_session_bytes": 1_024},
    )
    base = next(_avatars) + 70_000
    old, mid = key(base), key(base + 1)
    store.append(old, AvatarMessage(text="o" * 1_000))
    clock.advance(5)
    store.append(mid, AvatarMessage(text="m" * 500))
    clock.advance(5)
    k = key(base + 2)
    # 1,500 bytes stored, 1,800 with the first turn: the second passes 2,048
    turns = [AvatarMessage(text="n" * 300, turn_id=f"n{i}") for i in range(2)]
    reply = _call(store, k, turns)
    assert len(reply) == 1 and int(reply[0][0]) == 0
    assert store.client.zscore(store.core.partition_for(k).session(k.member).turn_ids, "n1") is None
    got = store.append_many(k, turns)
    assert [(r.seq, r.duplicate, r.evicted) for r in got] == [(1, True, 0), (2, False, 1)]
    assert store.context(old).turns == ()  # the least recently active
    assert len(store.context(mid).turns) == 1


def test_the_id_window_trims_inside_a_batch(backend: Any) -> None:
    """A session past the id window (1,024 turn ids): each turn a batch stores drops the
    oldest id, so a later turn of the same batch that retries it is stored again, as it
    is one by one."""
    store = sync_store(
        backend,
        Clock(),
        partitions=2,
        conversation={"max_turns_per_session": 1_100, "max_session_bytes": 65_536},
    )
    one, many = _twin_keys(store)
    window = memtier_limits.IDEMPOTENCY_WINDOW
    first = [AvatarMessage(text="x", turn_id=f"w{i}") for i in range(window)]
    then = [AvatarMessage(text="y", turn_id="new"), *first[:3]]
    for turns in (first, then):
        want, want_error = _one_by_one(store, one, turns)
        got, got_error = _at_once(store, many, turns)
        assert want_error is None and got_error is None
        seen_one: dict[str, int] = {}
        seen_many: dict[str, int] = {}
        assert [_receipt(r, seen_many) for r in got] == [_receipt(r, seen_one) for r in want]
    assert [(r.seq, r.duplicate) for r in got] == [(window + i, False) for i in range(1, 5)]
    raw = backend.sync_client()
    assert _stored(store, many, raw) == _stored(store, one, raw)


def test_a_stale_id_claim_is_taken_over_inside_a_batch(backend: Any) -> None:
    """A turn id claimed at a seq no stored turn reached (a call that failed after its
    claim) is taken over by the batch's turn that carries it, as one by one."""
    store = sync_store(backend, Clock(), partitions=2)
    one, many = _twin_keys(store)
    raw = backend.sync_client()
    turns = [AvatarMessage(text=f"t{i}", turn_id=f"t{i}") for i in range(3)]
    for k in (one, many):
        store.append(k, AvatarMessage(text="first", turn_id="first"))
        raw.zadd(store.core.partition_for(k).session(k.member).turn_ids, {"t1": 99})
    want, _ = _one_by_one(store, one, turns)
    got, _ = _at_once(store, many, turns)
    seen_one: dict[str, int] = {}
    seen_many: dict[str, int] = {}
    assert [_receipt(r, seen_many) for r in got] == [_receipt(r, seen_one) for r in want]
    assert [(r.seq, r.duplicate) for r in got] == [(2, False), (3, False), (4, False)]
    assert _stored(store, many, raw) == _stored(store, one, raw)


# --- other clients between the calls of one append_many -------------------------------------
Adversary = Callable[[ConversationStore, Sequence[ConversationKey], Clock], None]


def _drop(other: ConversationStore, keys: Sequence[ConversationKey], clock: Clock) -> None:
    for k in keys:
        other.delete(k)


def _another_writer(
    other: ConversationStore, keys: Sequence[ConversationKey], clock: Clock
) -> None:
    for k in keys:
        other.append(k, AgentResponse(text="from another worker", turn_id="other"))


def _script_flush(other: ConversationStore, keys: Sequence[ConversationKey], clock: Clock) -> None:
    other.client.script_flush()


def _expire(other: ConversationStore, keys: Sequence[ConversationKey], clock: Clock) -> None:
    # the sessions' last activity a TTL ago: the next append rotates them
    for k in keys:
        other.client.hset(
            other.core.partition_for(k).session(k.member).session, "last", clock.now - TTL_MS
        )


@pytest.mark.parametrize(
    "adversary", [_drop, _another_writer, _script_flush, _expire], ids=lambda f: f.__name__
)
@pytest.mark.parametrize("after", [1, 3])
@pytest.mark.parametrize("backend", ROUND_TRIP_BACKENDS, indirect=True)
def test_other_clients_between_the_calls(
    backend: Any, monkeypatch: pytest.MonkeyPatch, adversary: Adversary, after: int
) -> None:
    """``append_many`` of six turns goes in calls of ``after`` turns, and another client
    acts after the first call, on the batch's session and on a twin session that gets the
    same turns one by one (the first ``after`` before, the rest after): both must hold
    the same."""
    clock = Clock()
    conv = {"public_ttl_seconds": TTL_MS // 1000}
    store = sync_store(backend, clock, conversation=conv)
    other = sync_store(backend, clock, conversation=conv)
    n = next(_avatars) + 20_000
    one, many = key(n), key(n + 50_000)
    turns = [AvatarMessage(text=f"turn {i}", turn_id=f"t{i}") for i in range(6)]
    for k in (one, many):
        store.append(k, AvatarMessage(text="before", turn_id="t-1"))
    for turn in turns[:after]:
        store.append(one, turn)

    monkeypatch.setattr(memtier_limits, "APPEND_BATCH_TURNS", after)
    real = store.core.append_call
    calls = {"n": 0}

    def between_calls(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:  # the first call's replies are in: the second is not sent
            adversary(other, (one, many), clock)
        return real(*args, **kwargs)

    monkeypatch.setattr(store.core, "append_call", between_calls)
    got = store.append_many(many, turns)
    assert calls["n"] >= 2
    for turn in turns[after:]:
        store.append(one, turn)
    want = store.context(one).turns
    assert [(t.seq, t.turn_id) for t in store.context(many).turns] == [
        (t.seq, t.turn_id) for t in want
    ]
    assert len(got) == len(turns)
    seqs = {t.turn_id: t.seq for t in store.context(many).turns}
    for turn, receipt in zip(turns, got, strict=True):
        assert receipt.seq == seqs.get(turn.turn_id, receipt.seq)


# --- round trips, bounds, bad input ----------------------------------------------------------
@pytest.mark.parametrize("backend", ROUND_TRIP_BACKENDS, indirect=True)
def test_a_batch_is_one_round_trip(
    backend: Any, monkeypatch: pytest.MonkeyPatch, make_store: Any
) -> None:
    """One ``append_turn`` call of up to 16 turns, standalone and Cluster."""
    store = make_store(backend, Clock())
    k = key(next(_avatars) + 30_000)
    # connect first (a new connection writes its handshake)
    store.append_many(k, [AvatarMessage(text="connect"), AvatarMessage(text="first")])
    writes = Writes(monkeypatch)
    receipts = store.append_many(k, [AvatarMessage(text=f"t{i}") for i in range(8)])
    assert writes.count == 1
    assert [r.seq for r in receipts] == list(range(3, 11))
    writes.count = 0
    many = memtier_limits.APPEND_BATCH_TURNS * 2 + 3
    store.append_many(k, [AgentResponse(text=f"a{i}") for i in range(many)])
    assert writes.count == 3  # 16 + 16 + 3
    same_size = [AgentResponse(text="y" * 90, turn_id=f"y{i}") for i in range(4)]
    payload = len(store.core.prepare_turn(k, same_size[0]).payload)
    monkeypatch.setattr(memtier_limits, "APPEND_BATCH_BYTES", 2 * payload)
    writes.count = 0
    store.append_many(k, same_size)
    assert writes.count == 2  # two turns fit the byte bound, a third would not


def test_bad_input_stores_nothing(backend: Any) -> None:
    store = sync_store(backend, Clock())
    k = key(next(_avatars) + 40_000)
    bad = ToolSummary.model_construct(tool="not a name!", summary="x", turn_id=None)
    with pytest.raises(ValidationError):
        store.append_many(k, [AvatarMessage(text="fine"), bad, AvatarMessage(text="fine")])
    too_many = [AvatarMessage(text="x")] * (memtier_limits.MAX_APPEND_MANY_TURNS + 1)
    with pytest.raises(ValidationError) as caught:
        store.append_many(k, too_many)
    assert caught.value.code == "invalid_request"
    assert store.context(k).turns == ()
    assert store.append_many(k, []) == []


def test_the_error_names_the_turns_stored_before_it(backend: Any) -> None:
    store = sync_store(
        backend, Clock(), inline_compaction=False, conversation={"max_turns_per_session": 4}
    )
    k = key(next(_avatars) + 50_000)
    with pytest.raises(SessionFullError) as caught:
        store.append_many(k, [AvatarMessage(text=f"t{i}", turn_id=f"t{i}") for i in range(6)])
    assert caught.value.details["stored"] == 4
    assert [t.turn_id for t in store.context(k).turns] == ["t0", "t1", "t2", "t3"]
