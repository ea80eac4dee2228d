"""The context read's fast path builds exactly what the general path builds (issue 12:
"decode context into plain objects on the fast path; validate only at the boundary").

:func:`~memtier.memory.contextdecode.decode_turns` decodes the records of one read in one
pass, with a per-key cache of the last read; anything it does not recognise goes to the
general path (``decode_record`` per record, then ``project``).  An adversary checks:

* records written by the real ``append_turn`` on real Redis (standalone and Cluster),
  generated turns of every kind with delimiter look-alikes, all take the fast path, and
  the context equals the general path's in value, JSON, repr and fields set -- cold,
  from the cache (the same instances: what a read returned cannot be changed);
* generated malformed records (and valid ones beside them): the fast path never accepts
  what the general path refuses, raises exactly the same error, or builds the same value;
* its inlined untrusted-data wrapping equals :func:`wrap_untrusted` for any text,
  near-miss delimiters included, and stays unforgeable;
* the cache keeps its hard bounds and forgets a key whose session is gone.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import memfixtures
import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from memhelpers import T0, Clock, key
from test_fast_decode_equivalence import assert_same_model, raw_records
from untrusted_judge import adversarial_text, delimiter_problems

from memtier import ActionResult, AgentResponse, AvatarMessage, ConversationStore, ToolSummary
from memtier.config import MemtierConfig
from memtier.memory import contextdecode
from memtier.memory.contextdecode import (
    MAX_CACHED_KEYS,
    MAX_CACHED_TURNS,
    ReadCache,
    decode_turns,
)
from memtier.memory.core import MemoryCore
from memtier.memory.delimiters import untrusted_opening, wrap_untrusted
from memtier.memory.models import Context
from memtier.memory.turncodec import StoredTurn

fake_or_real = memfixtures.fake_or_real  # the fixture, in this module's namespace
CORE = MemoryCore(MemtierConfig.load())
HEAD = [0, b"ses_x", b""]  # context_head's reply: live, its id, no summary


def general(core: MemoryCore, k: Any, replies: list[Any]) -> Context:
    """The reference: every record through decode_record, then project."""
    head, raws = replies
    return core._general_context(k, head[1].decode(), head[2].decode(), raws)


def assert_same_context(fast: Context, reference: Context) -> None:
    assert_same_model(fast, reference)
    for fast_turn, ref_turn in zip(fast.turns, reference.turns, strict=True):
        assert_same_model(fast_turn, ref_turn)
    for fast_msg, ref_msg in zip(fast.messages, reference.messages, strict=True):
        assert_same_model(fast_msg, ref_msg)


# --- records written by the real append_turn ----------------------------------------------

_names = st.sampled_from(["search", "web.fetch", "a:b-c_d", "x" * 64])
_texts = st.one_of(adversarial_text, st.text(max_size=40), st.just("plain ascii text"))
_turns = st.lists(
    st.one_of(
        st.builds(AvatarMessage, text=_texts),
        st.builds(AgentResponse, text=_texts),
        st.builds(ToolSummary, tool=_names, summary=_texts),
        st.builds(ActionResult, action=_names, outcome=_texts),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=15, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=_turns, limit=st.sampled_from([0, 3, 20]))
@example(turns=[AvatarMessage(text="a </untrusted-data> b"), AgentResponse(text="<")], limit=0)
def test_real_records_take_the_fast_path_and_equal_the_general_path(
    backend_no_fake: Any, turns: list[Any], limit: int
) -> None:
    store = ConversationStore(
        backend_no_fake.sync_client(), backend_no_fake.config(), clock=Clock()
    )
    k = key(41)
    store.delete(k)
    for turn in turns:
        store.append(k, turn)
    replies = store.executor.execute(store.core.context_call(k, limit))
    raws = list(replies[1])
    assert raws and decode_turns(k.member, raws, ReadCache()) is not None  # fast path taken
    reference = general(store.core, k, replies)
    cold = store.core.decode_context(k, replies)
    assert_same_context(cold, reference)
    # What a read returned cannot be changed, so the next read (served by the cache)
    # hands out the same instances.
    with pytest.raises(TypeError):
        cold.turns[0].fields.clear()
    warm = store.core.decode_context(k, replies)
    assert_same_context(warm, reference)
    assert warm.turns[0] is cold.turns[0] and warm.messages[0] is cold.messages[0]
    # And the store's own read (one round trip) is the same context.
    assert_same_context(store.context(k, limit=limit), general(store.core, k, replies))


# --- generated malformed records ----------------------------------------------------------


@st.composite
def current_records(draw: st.DrawFn, seq: int) -> bytes:
    """A record as append_turn writes it now (raw_records draws the first format)."""
    turn = StoredTurn.parse(draw(raw_records(seq)))
    version = draw(st.integers(1, 3))
    return replace(turn, redactor_version=version, rotated=draw(st.booleans())).encode()


def _mutations(raw: bytes) -> list[Any]:
    *head_parts, payload = raw.split(b"|", 5)
    head = b"|".join(head_parts)
    seq, rest = raw.split(b"|", 1)
    loaded = orjson.loads(payload)
    body = loaded if isinstance(loaded, list) else [0, loaded["id"], "t"]  # first format
    return [
        raw,
        raw.decode(),  # a str reply (decode_responses clients)
        bytearray(raw),
        raw[: len(raw) // 2],
        raw + b"x",
        head + b"|" + orjson.dumps([*body, "extra"]),
        head + b"|" + orjson.dumps(body[:-1]),
        head + b"|" + orjson.dumps([True, *body[1:]]),
        head + b"|" + orjson.dumps([float(body[0]), *body[1:]]),
        head + b"|" + orjson.dumps([body[0] + 4, *body[1:]]),
        head + b"|" + orjson.dumps([body[0], 7, *body[2:]]),
        head + b"|" + orjson.dumps([body[0], body[1], None, *body[3:]]),
        head + b"|" + orjson.dumps([body[0], body[1], *body[2:-1], 5]),
        head + b"|" + orjson.dumps({"k": "avatar", "id": "i", "f": {"text": "t"}}),
        head + b"|" + orjson.dumps({"k": "avatar", "id": "i", "f": {"other": "t"}}),
        head + b"|" + orjson.dumps("a string"),
        head + b"|" + b"[0,",
        b"x" + raw,
        b" " + raw,  # int() strips the blank: both paths accept it
        "\u0661".encode() + raw,  # an Arabic-Indic digit: int() of the str accepts it
        seq + b"\xff|" + rest,  # not UTF-8
        b"1|2|99999999999999999999|3|0v1|" + payload,  # out of datetime's range
        b"1|2|3",
    ]


@st.composite
def reply_records(draw: st.DrawFn) -> list[Any]:
    n = draw(st.integers(1, 5))
    out = []
    for seq in range(1, n + 1):
        raw = draw(current_records(seq)) if draw(st.integers(0, 4)) else draw(raw_records(seq))
        out.append(draw(st.sampled_from(_mutations(raw))) if draw(st.booleans()) else raw)
    return out


def _outcome(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:  # compared: type and text
        return (type(exc), str(exc))


def check_against_general(raws: list[Any]) -> None:
    """The fast path accepts only what the general path accepts; raises what it raises."""
    k = key(42)
    core = MemoryCore(MemtierConfig.load())
    replies = [HEAD, raws]
    reference = _outcome(lambda: general(core, k, replies))
    fast_value = decode_turns(k.member, raws, ReadCache())
    if fast_value is not None:  # the fast path accepted it: so does the general path
        assert isinstance(reference, Context)
        assert fast_value[0] == reference.turns
        assert tuple(fast_value[1]) == reference.messages
    for _ in range(2):  # cold, then with the key's last read cached
        fast = _outcome(lambda: core.decode_context(k, replies))
        if isinstance(reference, Context):
            assert_same_context(fast, reference)
        else:
            assert fast == reference


@given(raws=reply_records())
@example(raws=[StoredTurn(1, 5, T0, 1, False, "avatar", "t", {"text": "x"}).encode() + b"]"])
def test_malformed_records_fail_or_decode_exactly_as_the_general_path(raws: list[Any]) -> None:
    check_against_general(raws)


def _one_of_each_kind() -> list[bytes]:
    fields = {
        "avatar": {"text": "hi <b>"},
        "agent": {"text": "ok"},
        "tool": {"tool": "search", "summary": "s\u00e9"},
        "action": {"action": "walk", "outcome": "o"},
    }
    return [
        StoredTurn(5, 7, T0, 3, kind == "tool", kind, "t", f, redactor_version=1).encode()
        for kind, f in fields.items()
    ]


@pytest.mark.parametrize("index", range(len(_mutations(_one_of_each_kind()[0]))))
@pytest.mark.parametrize("kind_index", range(4))
def test_each_mutation_of_each_kind_fails_or_decodes_as_the_general_path(
    kind_index: int, index: int
) -> None:
    """Every mutation above, on a record of every kind, alone and after a valid record."""
    valid = _one_of_each_kind()
    mutated = _mutations(valid[kind_index])[index]
    for raws in ([mutated], [valid[(kind_index + 1) % 4], mutated]):
        check_against_general(raws)


# --- the inlined wrapping ------------------------------------------------------------------

_sources = st.one_of(
    st.sampled_from(["avatar", "summary", "tool:search", "action:walk"]),
    st.text(max_size=90),
)


@given(source=_sources, text=st.one_of(adversarial_text, st.text()))
@example(source="avatar", text="untrusted-data>")  # a near miss: no "<"
@example(source="avatar", text="\uff1c/untrusted-data\uff1e")  # fullwidth, not ASCII
@example(source="tool:x", text="<untrusted")
@example(source='x">', text="\u226e/untrusted-data")
def test_the_inlined_wrapping_equals_wrap_untrusted(source: str, text: str) -> None:
    fast = contextdecode._wrapped(untrusted_opening(source), text)
    assert fast == wrap_untrusted(source, text)
    assert delimiter_problems(fast) == []


# --- the cache's bounds --------------------------------------------------------------------


def _reply(n: int, start: int = 1) -> list[Any]:
    raws = [
        StoredTurn(
            s, s, T0 + s, 1, False, "avatar", f"t{s}", {"text": f"x{s}"}, redactor_version=1
        ).encode()
        for s in range(start, start + n)
    ]
    return [HEAD, raws]


def _variant(seq: int, tail: int) -> bytes:
    """Record ``seq`` in variant ``tail`` (0-2): the variants of one seq have the same
    length and first 48 bytes, and differ only in their text's last character."""
    text = "t" * 60 + "abc"[tail]
    return StoredTurn(
        seq, seq, T0 + seq, len(text), False, "avatar", f"id{seq}", {"text": text},
        redactor_version=1,
    ).encode()  # fmt: skip


_READS = st.lists(
    st.one_of(
        st.just("again"),  # the very same records as the last read
        # records from seq `start` on, each in one of three variants (its text's tail)
        st.tuples(st.integers(1, 5), st.lists(st.integers(0, 2), max_size=5)),
    ),
    min_size=1,
    max_size=12,
)


@given(reads=_READS)
@example(reads=[(1, [0, 0, 0]), "again", (1, [1, 0, 0]), "again"])  # same prefixes, other tail
@example(reads=[(1, [0, 0, 0]), (2, [0, 0, 0]), "again", (1, []), "again"])  # the window moved
@example(reads=[(1, [0, 0, 0]), (2, [0, 1])])  # continues the last read, then differs
@example(reads=[(1, [0, 0, 0, 0]), (3, [0]), (2, [0, 0, 0, 0])])  # a smaller limit, a larger
@example(reads=[(1, [0, 0, 0, 0]), (2, [0, 0])])  # a run inside the last read
def test_reads_of_one_key_equal_the_general_path_whatever_the_last_read_held(
    reads: list[Any],
) -> None:
    """A key read again and again: the same records (handed back whole), the window moved,
    records that share their first bytes with the last read's but differ past them, no
    records.  Every context equals the general path's, and a record the last read held
    comes back as the same instances (the same tuples for the very same records)."""
    core = MemoryCore(MemtierConfig.load())
    k = key(43)
    raws: list[Any] = []
    last: Context | None = None
    last_raws: list[Any] = []
    for read in reads:
        if read != "again":
            start, tails = read
            raws = [_variant(start + j, tail) for j, tail in enumerate(tails)]
        replies = [HEAD, list(raws)]  # a new list, as every reply is
        got = core.decode_context(k, replies)
        assert_same_context(got, general(core, k, replies))
        if last is not None:
            # a record the last read held is handed back as the instances it decoded to
            for j, raw in enumerate(raws):
                if raw in last_raws:
                    at = last_raws.index(raw)
                    assert got.turns[j] is last.turns[at]
                    assert got.messages[j] is last.messages[at]
            if read == "again" and raws:
                assert got.turns is last.turns and got.messages is last.messages
        last, last_raws = got, list(raws)


def test_the_cache_keeps_at_most_its_bounds_and_forgets_expired_keys() -> None:
    core = MemoryCore(MemtierConfig.load())
    cache = core._read_cache
    for n in range(MAX_CACHED_KEYS + 40):
        core.decode_context(key(1000 + n), _reply(2, n))
        assert len(cache) <= MAX_CACHED_KEYS
    assert len(cache) == MAX_CACHED_KEYS
    # 40 keys went (chosen at random: memtier.eviction); the newest read is kept.
    assert cache.take(key(1000 + MAX_CACHED_KEYS + 39).member) is not None
    gone = sum(cache.take(key(1000 + n).member) is None for n in range(MAX_CACHED_KEYS + 39))
    assert gone == 40
    # A read of more records than the bound keeps nothing of that key.
    big = key(7)
    core.decode_context(big, _reply(MAX_CACHED_TURNS + 1))
    assert cache.take(big.member) is None
    core.decode_context(big, _reply(3))
    kept = cache.take(big.member)
    assert kept is not None and len(kept.turns) == 3
    # The session expired or was deleted: its last read is dropped.
    core.decode_context(big, _reply(3))
    assert core.decode_context(big, [[-1], []]).turns == ()
    assert cache.take(big.member) is None


def test_the_cache_holds_at_most_its_characters(monkeypatch: pytest.MonkeyPatch) -> None:
    core = MemoryCore(MemtierConfig.load())
    cache = core._read_cache
    one_read = sum(len(r) for r in _reply(3)[1])
    monkeypatch.setattr(contextdecode, "MAX_CACHED_CHARS", one_read * 2 + 5)
    for n in range(6):
        k = key(2000 + n)
        replies = _reply(3)
        assert_same_context(core.decode_context(k, replies), general(core, k, replies))
        assert cache.chars <= contextdecode.MAX_CACHED_CHARS
        assert len(cache) == min(n + 1, 2)
    assert cache.chars == 2 * one_read
    # A key read again replaces its own entry (not counted twice).
    core.decode_context(key(2005), _reply(3))
    assert cache.chars == 2 * one_read and len(cache) == 2
    # A read larger than the whole bound is not kept, and evicts nothing.
    core.decode_context(key(3000), _reply(9))
    assert cache.take(key(3000).member) is None and len(cache) == 2
    # What was taken is no longer counted.
    assert cache.take(key(2005).member) is not None
    assert cache.chars == one_read


def test_concurrent_reads_keep_the_bounds_and_the_values() -> None:
    """Threads reading overlapping keys: every context equals the general path's, and the
    bookkeeping stays exact (bounded: 4 threads x 200 reads)."""
    import threading

    core = MemoryCore(MemtierConfig.load())
    failures: list[BaseException] = []

    def reader(t: int) -> None:
        try:
            for i in range(200):
                k = key(4000 + (i + t) % 5)
                replies = _reply(3, start=i % 7)
                assert_same_context(core.decode_context(k, replies), general(core, k, replies))
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=reader, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures and not any(t.is_alive() for t in threads)
    cache = core._read_cache
    held = [cache.take(key(4000 + n).member) for n in range(5)]
    assert cache.chars == 0 and len(cache) == 0
    assert all(h is None or len(h.turns) == 3 for h in held)


def test_a_drop_or_a_pop_forgets_the_keys_last_read(fake_or_real: Any) -> None:
    store = ConversationStore(fake_or_real.sync_client(), fake_or_real.config(), clock=Clock())
    cache = store.core._read_cache
    k = key(44)
    for text in ("a", "b"):
        store.append(k, AvatarMessage(text=text))
    for forget in (store.pop, store.delete):
        assert store.context(k).turns
        assert len(cache) == 1
        forget(k)
        assert len(cache) == 0
    assert store.context(k).turns == () and len(cache) == 0


# --- what a read returns cannot be changed -------------------------------------------------

_MUTATIONS: dict[str, Any] = {
    "setitem": lambda f: f.__setitem__("text", "changed"),
    "delitem": lambda f: f.__delitem__(next(iter(f))),
    "clear": lambda f: f.clear(),
    "pop": lambda f: f.pop(next(iter(f))),
    "popitem": lambda f: f.popitem(),
    "setdefault": lambda f: f.setdefault("extra", "x"),
    "update": lambda f: f.update(text="changed"),
    "ior": lambda f: f.__ior__({"text": "changed"}),
}


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.integers(0, 2),  # which key
            st.integers(1, 4),  # where its window of records starts (windows overlap)
            st.sampled_from(sorted(_MUTATIONS)),
            st.integers(0, 2),  # which returned turn the mutation tries
        ),
        min_size=1,
        max_size=12,
    )
)
@example(steps=[(0, 1, "clear", 0), (0, 1, "setitem", 0)])
def test_no_mutation_of_a_read_changes_any_later_read(
    steps: list[tuple[int, int, str, int]],
) -> None:
    """Reads of overlapping windows share cached instances: every mutator of a returned
    record's fields raises TypeError, and every read, later ones included, equals the
    general path's decode and what each earlier read held when it was returned."""
    core = MemoryCore(MemtierConfig.load())
    returned: list[tuple[Context, str]] = []
    for which, start, mutation, index in steps:
        k, replies = key(5000 + which), _reply(3, start)
        context = core.decode_context(k, replies)
        assert_same_context(context, general(core, k, replies))
        returned.append((context, context.model_dump_json()))
        with pytest.raises(TypeError):
            _MUTATIONS[mutation](context.turns[index].fields)
        for earlier, as_returned in returned:
            assert earlier.model_dump_json() == as_returned


def test_every_turn_record_holds_frozen_fields_that_copy_and_serialise_as_a_dict() -> None:
    """Whatever built it -- validation, the general decode, the fast decode -- a record's
    fields are a FrozenFields; pickling, copying and JSON give what a dict would."""
    import copy
    import json
    import pickle

    from memtier.memory.models import FrozenFields, TurnRecord

    k, replies = key(5100), _reply(2)
    fast = CORE.decode_context(k, replies).turns[0]
    built = [
        fast,
        general(CORE, k, replies).turns[0],
        TurnRecord.model_validate(fast.model_dump()),
    ]
    for record in built:
        assert type(record.fields) is FrozenFields
        plain = dict(record.fields)
        assert record.fields == plain and repr(record.fields) == repr(plain)
        assert json.dumps(record.fields) == json.dumps(plain)
        assert orjson.dumps(record.fields) == orjson.dumps(plain)
        for clone in (
            pickle.loads(pickle.dumps(record)),
            copy.deepcopy(record),
            copy.copy(record),
            record.model_copy(deep=True),
        ):
            assert clone == record and type(clone.fields) is FrozenFields
        merged = record.fields | {"extra": "x"}
        assert type(merged) is dict and "extra" not in record.fields


@settings(max_examples=40, deadline=None)
@given(
    texts=st.lists(st.text(min_size=1, max_size=60), min_size=2, max_size=4),
    common=st.text(alphabet="ab", min_size=48, max_size=48),
)
@example(texts=["x", "y"], common="a" * 48)
def test_a_record_that_shares_its_first_bytes_with_a_cached_one_is_decoded_anew(
    texts: list[str], common: str
) -> None:
    """The cache finds a record by its first bytes and must then match it whole: records
    of the same seq and clocks whose content differs only past those bytes (a session
    deleted and begun again, same turn id) each read as the general path decodes them."""
    core = MemoryCore(MemtierConfig.load())
    k = key(5200)
    for text in texts:
        raw = StoredTurn(
            1, 1, T0 + 1, 1, False, "avatar", "t1", {"text": common + text}, redactor_version=1
        ).encode()
        replies = [HEAD, [raw]]
        assert_same_context(core.decode_context(k, replies), general(core, k, replies))


def test_the_cache_keeps_hits_when_keys_are_read_in_turn() -> None:
    """A worker reading one conversation more than the cache holds, in turn: dropping the
    least recently read would drop each key just before its next read (no hits at all);
    dropped at random, many reads find their records decoded (the same instances)."""
    core = MemoryCore(MemtierConfig.load())
    keys = [key(5000 + n) for n in range(MAX_CACHED_KEYS + 1)]
    last: dict[str, Any] = {}
    hits = reads = 0
    for turn in range(6 * len(keys)):
        k = keys[turn % len(keys)]
        ctx = core.decode_context(k, _reply(2))
        if turn >= len(keys):
            reads += 1
            hits += ctx.turns[0] is last[k.member]
        last[k.member] = ctx.turns[0]
        assert len(core._read_cache) <= MAX_CACHED_KEYS
    assert hits >= reads // 3, (hits, reads)
