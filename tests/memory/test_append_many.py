"""``append_many``: several turns of one session in as few round trips as it can, and
exactly what the same appends one by one would store.

The promise: whatever the turns are (kinds, sizes, retried turn ids, turns a session
bound refuses, a session that expires between calls) and whatever other clients do
between the pipelined calls, ``append_many`` stores a prefix of its turns in order --
the turns that ``append`` of each in turn, stopping at the first error, would store --
with the same receipts, and raises that same first error with ``stored`` naming the
prefix.  The adversaries: a generated model comparison (one key appended one by one, a
twin key by ``append_many``, on every backend and both APIs), other clients acting
between the calls of one pipeline (a drop of the session, another writer, a script
flush), and the order guard of ``append_turn`` driven directly (a missing predecessor
writes nothing).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import memfixtures
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from memhelpers import Clock, key, sync_store
from roundtrips import PIPELINED_BACKENDS, Writes

import memtier.executor
from memtier import AgentResponse, AvatarMessage, ConversationKey, ConversationStore, ToolSummary
from memtier import limits as memtier_limits
from memtier.errors import MemtierError, SessionFullError, ValidationError
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


def _stored(store: Any, k: ConversationKey) -> tuple[Any, ...]:
    ctx = store.context(k)
    return (ctx.summary, tuple((t.seq, t.kind, t.turn_id, dict(t.fields)) for t in ctx.turns))


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


def _compare(store: Any, clock: Clock, ops: list[Any]) -> None:
    one, many = _twin_keys(store)
    seen_one: dict[str, int] = {}
    seen_many: dict[str, int] = {}
    count = 0
    for op in ops:
        if op == ("expire",):
            clock.advance(TTL_MS)
            continue
        turns = [_turn(kind, size, pid, count + i) for i, (kind, size, pid) in enumerate(op)]
        count += len(turns)
        want, want_error = _one_by_one(store, one, turns)
        got, got_error = _at_once(store, many, turns)
        if want_error is None:
            assert got_error is None, got_error
            assert [_receipt(r, seen_many) for r in got] == [_receipt(r, seen_one) for r in want]
        else:
            assert got_error is not None, "append_many stored past the first refusal"
            assert _error(got_error) == _error(want_error)
            assert got_error.details["stored"] == len(want)
            # the refused batch's receipts are not returned: start both session maps anew
            seen_one.clear()
            seen_many.clear()
        assert _stored(store, many) == _stored(store, one)


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
    # a turn larger than the session's byte bound, mid-batch
    @example(ops=[[(0, 5, None), (1, 500, None), (1, 500, None), (0, 5, None)]], inline=False)
    def check(ops: list[Any], inline: bool) -> None:
        # a clean namespace: expired sessions of earlier examples would be swept (and
        # counted in `swept`) by whichever twin appends first
        if backend.is_fake:
            backend.sync_client().flushall()
        else:
            backend.delete_namespace()
        clock = Clock()
        store = make_store(
            backend,
            clock,
            inline_compaction=inline,
            partitions=8,
            conversation={
                "max_turns_per_session": 5,
                "max_session_bytes": 1024,
                "max_turn_bytes": 600,
                "max_tool_results": 2,
                "public_ttl_seconds": TTL_MS // 1000,
            },
        )
        _compare(store, clock, ops)

    check()


# --- the order guard, driven directly --------------------------------------------------------
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


def test_a_call_whose_predecessor_is_not_stored_writes_nothing(backend: Any) -> None:
    clock = Clock()
    store = sync_store(backend, clock)
    k = key(next(_avatars) + 10_000)
    new = key(next(_avatars) + 10_000)
    store.append(k, AvatarMessage(text="first", turn_id="a"))
    core = store.core
    for target, after in ((k, "never-stored"), (new, "a"), (k, "b")):
        prepared = core.prepare_turn(target, AvatarMessage(text="next", turn_id="b"))
        before = _state(store, target)
        reply = store.executor.execute(core.append_call(prepared, after=after))
        assert [int(x) for x in reply] == [-4]
        assert _state(store, target) == before
    # a stored predecessor lets it through; a retry of a stored turn too
    prepared = core.prepare_turn(k, AvatarMessage(text="next", turn_id="b"))
    assert (
        core.decode_append(
            prepared, store.executor.execute(core.append_call(prepared, after="a"))
        ).seq
        == 2
    )
    again = core.decode_append(
        prepared, store.executor.execute(core.append_call(prepared, after="a"))
    )
    assert again.duplicate and again.seq == 2


# --- other clients between the calls of one pipeline -----------------------------------------
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
    # the sessions' last activity a TTL ago: the next append rotates them (the batch's
    # calls carry the clock they were built with, so moving the clock would not do it)
    for k in keys:
        other.client.hset(
            other.core.partition_for(k).session(k.member).session, "last", clock.now - TTL_MS
        )


@pytest.mark.parametrize(
    "adversary", [_drop, _another_writer, _script_flush, _expire], ids=lambda f: f.__name__
)
@pytest.mark.parametrize("after", [1, 3])
@pytest.mark.parametrize("backend", PIPELINED_BACKENDS, indirect=True)
def test_other_clients_between_the_pipelined_calls(
    backend: Any, monkeypatch: pytest.MonkeyPatch, adversary: Adversary, after: int
) -> None:
    """One pipeline of ``append_many`` is split after ``after`` calls and another client
    acts there, on the batch's session and on a twin session that gets the same turns
    one by one (the first ``after`` before, the rest after): both must hold the same."""
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

    real = memtier.executor.run_script_batch
    split = {"done": False}

    def split_batch(lean: Any, client: Any, items: Any) -> list[Any]:
        if split["done"]:
            return real(lean, client, items)
        split["done"] = True
        head = real(lean, client, items[:after])
        adversary(other, (one, many), clock)
        return head + real(lean, client, items[after:])

    monkeypatch.setattr(memtier.executor, "run_script_batch", split_batch)
    got = store.append_many(many, turns)
    assert split["done"]
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
@pytest.mark.parametrize("backend", PIPELINED_BACKENDS, indirect=True)
def test_a_batch_is_one_round_trip(
    backend: Any, monkeypatch: pytest.MonkeyPatch, make_store: Any
) -> None:
    """On standalone clients (a cluster client sends a batch's calls one by one)."""
    store = make_store(backend, Clock())
    k = key(next(_avatars) + 30_000)
    # connect first (a batch's connection comes from the pool: a new one writes its
    # handshake)
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
