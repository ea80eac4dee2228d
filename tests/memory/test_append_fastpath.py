"""append_turn's cheap common path (issue 12, server side): the same bytes in Redis.

The script no longer lets Redis or Lua format its numbers: the clocks are kept as the
digit strings ``TIME`` (or the test clock, or the partition's high-water mark) gave, the
counters are formatted once with ``%d``, ``turn_bytes`` goes into the record as sent, and
an append that is not a tool result leaves the session's ``tools`` field alone.  So the
promise checked here is that every value it writes is still the canonical decimal of the
value the model expects -- record head, session hash, partition meta, index and LRU --
whatever the clock does: large clocks, clocks that step back (the high-water mark wins),
the wall time equal to or behind the clock, tool and chat turns, retries.  And a
``turn_bytes`` that is not a canonical decimal is a caller bug: an error, nothing written.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from memhelpers import Clock, key, sync_store

from memtier import AvatarMessage, ConversationKey, ToolSummary
from memtier.errors import ScriptError
from memtier.memory.scriptspecs import APPEND_TURN
from memtier.memory.turncodec import record_flags
from memtier.scripts import load_registry

_avatars = itertools.count(7_000)  # a fresh avatar per example: examples never share keys

# (clock step in ms -- negative steps go behind the partition's high-water mark --,
#  tool turn?, text length, retry of the previous turn id?); examples share the partition,
# so an example may start behind the clock an earlier one left (the high-water mark)
STEPS = st.lists(
    st.tuples(
        st.sampled_from([0, 1, 7, 999, 1_000, 1_001, 59_000, -1, -5_000]),
        st.booleans(),
        st.integers(1, 40),
        st.booleans(),
    ),
    min_size=1,
    max_size=12,
)


def _text(client: Any, key_name: str, field: str) -> str | None:
    raw = client.hget(key_name, field)
    return None if raw is None else raw.decode()


def _canonical(value: str | None) -> int:
    """The int a canonical decimal string stands for (fails on "0300", "3.0", "3e2")."""
    assert value is not None and value == str(int(value)), value
    return int(value)


def test_every_written_value_is_the_canonical_decimal_of_the_model(backend: Any) -> None:
    @settings(max_examples=30)
    @given(start=st.sampled_from([1_800_000_000_000, 10**13 - 3, 999_999_999_999]), steps=STEPS)
    @example(start=1_800_000_000_000, steps=[(0, False, 5, False), (-5_000, True, 3, False)])
    @example(
        start=10**13 - 3, steps=[(1, False, 1, False), (1, False, 1, True), (-1, True, 2, True)]
    )
    def run(start: int, steps: list[tuple[int, bool, int, bool]]) -> None:
        clock = Clock(start)
        conv = {"max_tool_results": 100, "public_ttl_seconds": 1_800}
        store = sync_store(backend, clock, conversation=conv)
        client = store.client
        k = ConversationKey(f"00000000-0000-4000-8000-{next(_avatars):012d}", "public")
        part = store.core.partition_for(k)
        sk = part.session(k.member)
        turns = tools = session_bytes = 0
        last_id = None
        first_answers: dict[str, tuple[Any, ...]] = {}
        for n, (step, is_tool, length, retry) in enumerate(steps):
            clock.advance(step)
            turn_id = last_id if (retry and last_id) else f"t{n}"
            hwm = _canonical(_text(client, part.meta, "clock") or "0")
            turn = (
                ToolSummary(tool="search", summary="s" * length, turn_id=turn_id)
                if is_tool
                else AvatarMessage(text="x" * length, turn_id=turn_id)
            )
            receipt = store.append(k, turn)
            if turn_id in first_answers:  # a retry: the first answer, nothing stored
                assert receipt.duplicate
                assert first_answers[turn_id] == (receipt.seq, receipt.timestamp, receipt.bytes)
                assert client.llen(sk.turns) == turns
                continue
            assert not receipt.duplicate and not receipt.rotated
            wall = clock.now
            now = max(wall, hwm)
            turns += 1
            session_bytes += receipt.bytes
            tools += int(is_tool)
            first_answers[turn_id] = (receipt.seq, receipt.timestamp, receipt.bytes)
            last_id = turn_id
            assert receipt.seq == turns and receipt.turn_count == turns
            assert int(receipt.timestamp.timestamp() * 1000) == wall
            wall_field = "" if wall == now else str(wall)
            head = f"{turns}|{now}|{wall_field}|{receipt.bytes}|{int(is_tool)}v"
            record = client.lindex(sk.turns, -1).decode()
            assert record.startswith(head), (record, head)
            assert record_flags(is_tool) in record
            assert _canonical(_text(client, sk.session, "seq")) == turns
            assert _canonical(_text(client, sk.session, "turns")) == turns
            assert _canonical(_text(client, sk.session, "bytes")) == session_bytes
            assert _canonical(_text(client, sk.session, "tools")) == tools
            assert _canonical(_text(client, sk.session, "last")) == now
            assert _canonical(_text(client, sk.session, "last_wall")) == wall
            assert _canonical(_text(client, sk.session, "xp")) > 0
            assert _canonical(_text(client, sk.session, "created")) <= now
            assert _canonical(_text(client, sk.session, "summary_bytes")) == 0
            assert _canonical(_text(client, part.meta, "clock")) == now
            # the partition's byte total is the sum of its index (a sweep may remove others)
            index = client.hgetall(part.index)
            assert _canonical(_text(client, part.meta, "bytes")) == sum(
                _canonical(v.decode()) for v in index.values()
            )
            assert _canonical(_text(client, part.index, k.member)) == session_bytes
            assert client.zscore(part.lru("public"), k.member) == now
            assert client.zscore(sk.turn_ids, turn_id) == turns

    run()


def test_the_server_clock_digits_are_the_milliseconds_of_time(backend: Any) -> None:
    """No test clock: the record's clock is built from TIME's digits, not formatted."""
    store = sync_store(backend)
    client = store.client
    k = key(next(_avatars))
    before = time.time_ns() // 1_000_000
    receipt = store.append(k, AvatarMessage(text="hello"))
    after = time.time_ns() // 1_000_000
    sk = store.core.partition_for(k).session(k.member)
    record = client.lindex(sk.turns, -1).decode()
    seq, clock_ms, wall, _ = record.split("|", 3)
    assert (seq, wall) == ("1", "")  # no test clock: the wall time is the clock
    assert clock_ms == str(int(clock_ms)) and before - 5 <= int(clock_ms) <= after + 5
    assert int(receipt.timestamp.timestamp() * 1000) == int(clock_ms)
    for field in ("last", "last_wall", "xp", "created", "created_wall"):
        assert _text(client, sk.session, field) == clock_ms


def test_time_digits_formula_is_floor_of_microseconds(backend: Any) -> None:
    """The expression append_turn applies to TIME's reply (seconds, microseconds)."""
    client = backend.sync_client()
    lua = "return ARGV[1] .. string.sub('00000' .. ARGV[2], -6, -4)"

    @settings(max_examples=50)
    @given(us=st.integers(0, 999_999), seconds=st.integers(1, 10**10))
    @example(us=0, seconds=1)
    @example(us=999, seconds=1_700_000_000)
    @example(us=1_000, seconds=1_700_000_000)
    @example(us=999_999, seconds=1_700_000_000)
    def run(us: int, seconds: int) -> None:
        got = client.eval(lua, 0, str(seconds), str(us))
        assert got.decode() == str(seconds * 1000 + us // 1000)

    run()


BAD_TURN_BYTES = st.one_of(
    st.sampled_from(["0300", "00", " 300", "300 ", "3e2", "-1", "+300", "300.0", "0x12C", ""]),
    st.text(alphabet="0123456789 .+-eE", min_size=1, max_size=6).filter(
        lambda s: not (s == "0" or (s[:1] in "123456789" and s.isdigit()))
    ),
)


def test_a_turn_bytes_that_is_not_a_canonical_decimal_is_refused_whole(backend: Any) -> None:
    store = sync_store(backend, Clock())
    client = backend.sync_client()
    script = load_registry("memory")["append_turn"]
    k = key(next(_avatars))
    store.append(k, AvatarMessage(text="first"))
    prepared = store.core.prepare_turn(k, AvatarMessage(text="second", turn_id="second"))
    call = store.core.append_call(prepared)
    part = store.core.partition_for(k)
    sk = part.session(k.member)

    def state() -> tuple[Any, ...]:
        return (
            client.lrange(sk.turns, 0, -1),
            client.hgetall(sk.session),
            client.zrange(sk.turn_ids, 0, -1, withscores=True),
            client.hgetall(part.meta),
            client.hget(part.index, k.member),
        )

    @settings(max_examples=40)
    @given(bad=BAD_TURN_BYTES)
    @example(bad="0300")
    @example(bad="1e3")
    def run(bad: str) -> None:
        before = state()
        args = list(call.args)
        args[APPEND_TURN.argv.index("turn_bytes")] = bad
        with pytest.raises(ScriptError):
            script(client, call.keys, args)
        assert state() == before

    run()
