"""ConversationStore.pop / AsyncConversationStore.pop and pop_turn-6.lua, on every backend."""

from __future__ import annotations

from typing import Any

import memfixtures
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from memhelpers import Clock, StoreMaker, async_store, key, sync_store
from redis.crc import key_slot

from memtier import AgentResponse, AvatarMessage, ReasonCode, ToolSummary
from memtier.errors import ScriptError
from memtier.memory.scriptspecs import POP_TURN
from memtier.scripts import load_registry

# The store tests run on the sync and on the asyncio store (issue 13): ids [sync-fake], ...
make_store = memfixtures.make_store


def test_pop_script_contract_every_output(backend: Any) -> None:
    """pop_turn-6.lua with hand-built KEYS/ARGV: NOT_FOUND, popped, error reply.

    Sync only: the script is called directly, the store only builds the call."""
    store = sync_store(backend, Clock())
    script = load_registry("memory")["pop_turn"]
    client = backend.sync_client()
    k = key(1)
    call = store.core.pop_call(k)
    assert list(script(client, call.keys, call.args)) == [0]  # no session
    receipt = store.append(k, AvatarMessage(text="héllo", turn_id="t-1"))
    reply = script(client, call.keys, call.args)
    assert int(reply[0]) == 1
    record = store.core.decode_record(reply[1])
    assert (record.seq, record.turn_id, record.fields) == (1, "t-1", {"text": "héllo"})
    assert (int(reply[2]), int(reply[3]), int(reply[4])) == (receipt.bytes, 0, 0)
    assert list(script(client, call.keys, call.args)) == [0]  # session left with no turn
    bad = POP_TURN.replace(call, ttl_ms="not-a-number")
    with pytest.raises(ScriptError):
        script(client, bad.keys, bad.args)


def test_pop_call_keys_share_one_slot(backend: Any) -> None:
    # Sync only: no store I/O, only the I/O-free core's key layout.
    store = sync_store(backend, Clock(), partitions=5)
    for n in range(10):
        call = store.core.pop_call(key(n, "im" if n % 2 else "public"))
        assert len({key_slot(k.encode()) for k in call.keys}) == 1


def test_pop_returns_newest_with_exact_accounting_and_event(
    make_store: StoreMaker, backend: Any
) -> None:
    store = make_store(backend, Clock())
    k, other = key(1), key(2)
    store.append(other, AvatarMessage(text="someone else"))
    first = store.append(k, AvatarMessage(text="one"))
    tool = store.append(k, ToolSummary(tool="search", summary="found ✓", turn_id="call-1"))
    before = store.stats()["bytes"]
    popped = store.pop(k)
    assert popped is not None
    assert (popped.kind, popped.turn_id, popped.seq) == ("tool", "call-1", 2)
    assert popped.fields == {"tool": "search", "summary": "found ✓"}
    assert store.stats()["bytes"] == before - tool.bytes
    meta = {m.avatar: m for m in store.iter_metadata()}[k.avatar]
    assert (meta.turn_count, meta.bytes) == (1, first.bytes)
    assert [t.seq for t in store.context(k).turns] == [1]
    popped_events = [e for e in store.events(limit=100) if e.reason is ReasonCode.POPPED]
    assert len(popped_events) == 1 and popped_events[0].detail == "seq=2"
    assert popped_events[0].avatar == k.avatar
    # the popped turn id is free again; seqs are never reused
    again = store.append(k, ToolSummary(tool="search", summary="found ✓", turn_id="call-1"))
    assert not again.duplicate and again.seq == 3
    # the tool-result count went down with the pop: the bound still counts exactly
    assert store.pop(k) is not None and store.pop(k) is not None
    assert store.pop(k) is None
    assert store.stats() == {"sessions": 2, "bytes": len(b"someone else")}


def test_pop_of_an_expired_session_is_none(make_store: StoreMaker, backend: Any) -> None:
    clock = Clock()
    store = make_store(backend, clock)
    k = key(3, "im")
    store.append(k, AgentResponse(text="bye"))
    clock.advance(store.core.ttl_ms(k.channel) + 1)
    assert store.pop(k) is None


async def test_async_pop_matches_sync(backend: Any) -> None:
    store = async_store(backend, Clock())
    k = key(4)
    await store.append(k, AvatarMessage(text="a"))
    await store.append(k, AgentResponse(text="b"))
    popped = await store.pop(k)
    assert popped is not None and popped.fields == {"text": "b"}
    assert [t.fields["text"] for t in (await store.context(k)).turns] == ["a"]
    assert (await store.stats())["bytes"] == 1


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.text(max_size=12), st.booleans()),
        st.tuples(st.just("append"), st.just("x" * 40), st.booleans()),
        st.tuples(st.just("pop"), st.just(""), st.just(False)),
    ),
    max_size=25,
)


@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_ops)
@example(ops=[("append", "\x1f", False)])  # a control character is stripped
def test_pop_property_matches_a_list_model(
    make_store: StoreMaker, backend: Any, ops: list[tuple[str, str, bool]]
) -> None:
    """Any mix of appends and pops: the stored turns and byte totals equal a plain stack."""
    store = make_store(backend, Clock())
    k = key(99)
    store.delete(k)
    model: list[tuple[str, int]] = []
    for op, text, is_tool in ops:
        if op == "append":
            turn = ToolSummary(tool="t", summary=text) if is_tool else AvatarMessage(text=text)
            receipt = store.append(k, turn)
            last = store.context(k).turns[-1]  # as stored: sanitized (redacted, bounded)
            model.append((last.fields.get("text", last.fields.get("summary", "")), receipt.bytes))
        else:
            popped = store.pop(k)
            if not model:
                assert popped is None
            else:
                text, _ = model.pop()
                assert popped is not None
                assert popped.fields.get("text", popped.fields.get("summary")) == text
        ctx = store.context(k)
        stored = [t.fields.get("text", t.fields.get("summary")) for t in ctx.turns]
        assert stored == [text for text, _ in model]
        assert store.stats()["bytes"] == sum(b for _, b in model)
