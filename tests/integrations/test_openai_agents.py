"""memtier.integrations.openai_agents: the SDK's own Runner over MemtierSession.

The Runner tests use a scripted fake model (no network) on a real Redis and the real
cluster; the mapping units also run on fakeredis.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import uuid
from typing import Any

import pytest
from adapterstores import Clock, async_store, sync_store
from agents import Agent, Runner, function_tool
from agentshelpers import ScriptedModel, assert_pairs_intact, call, say, shape
from roundtrips import ROUND_TRIP_BACKENDS, Writes

from memtier import AsyncConversationStore, ConversationKey, ConversationStore, MemtierConfig
from memtier.errors import SessionFullError, ValidationError
from memtier.integrations._common import NotStoredReason
from memtier.integrations.openai_agents import SESSION_NAMESPACE, MemtierSession
from memtier.metrics import render


@function_tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def agent_with(model: ScriptedModel) -> Agent[Any]:
    return Agent(name="helper", instructions="be brief", model=model, tools=[weather])


def metric(name: str) -> float:
    for line in render().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


# --- mapping -----------------------------------------------------------------------------------


def test_session_id_maps_to_documented_uuid5_and_channel(backend: Any) -> None:
    store = sync_store(backend, Clock())
    session = MemtierSession("user-123", store)
    assert session.key == ConversationKey(uuid.uuid5(SESSION_NAMESPACE, "user-123"), "im")
    assert str(SESSION_NAMESPACE) == str(
        uuid.uuid5(uuid.NAMESPACE_URL, "memtier:integrations:openai-agents")
    )
    other = MemtierSession("user-123", store, namespace=uuid.UUID(int=7), channel="public")
    assert other.key == ConversationKey(uuid.uuid5(uuid.UUID(int=7), "user-123"), "public")
    direct = ConversationKey(uuid.UUID(int=9), "public")
    assert MemtierSession("anything", store, key=direct).key == direct
    for bad in ("", "x" * 1025):
        with pytest.raises(ValidationError) as err:
            MemtierSession(bad, store)
        assert err.value.code == "invalid_input"


async def test_items_round_trip_and_what_is_not_stored_is_counted(backend: Any) -> None:
    session = MemtierSession("s1", async_store(backend, Clock()))
    before = metric(
        'memtier_integration_items_not_stored_total{framework="openai-agents",reason="reasoning"}'
    )
    await session.add_items(
        [
            {"role": "system", "content": "secret system prompt"},
            {"role": "developer", "content": "dev notes"},
            {"role": "user", "content": "weather in Oslo?"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "weather",
                "arguments": '{"city": "Oslo"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "web_search_call", "id": "ws_1", "status": "completed"},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "and"},
                    {"type": "input_image", "image_url": "x"},
                ],
            },
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_1",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Sunny.", "annotations": []}],
            },
        ]
    )
    items = await session.get_items()
    assert items == [
        {"role": "user", "content": "weather in Oslo?"},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "weather",
            "arguments": '{"city": "Oslo"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"role": "user", "content": "and"},
        {"role": "assistant", "content": "Sunny."},
    ]
    assert dict(session.not_stored.counts) == {
        NotStoredReason.SYSTEM_MESSAGE.value: 2,
        NotStoredReason.REASONING.value: 1,
        NotStoredReason.UNSUPPORTED_ITEM.value: 1,
        NotStoredReason.NON_TEXT_CONTENT.value: 1,
    }
    after = metric(
        'memtier_integration_items_not_stored_total{framework="openai-agents",reason="reasoning"}'
    )
    assert after == before + 1
    # limit keeps the newest items; a pair cut by it is left out whole
    assert shape(await session.get_items(limit=2)) == [("user", "and"), ("assistant", "Sunny.")]
    assert (
        shape(await session.get_items(limit=3))
        == [("function_call_output", "call_1"), ("user", "and"), ("assistant", "Sunny.")][1:]
    )
    assert await session.get_items(limit=0) == []


async def test_secrets_are_redacted_before_redis(backend: Any) -> None:
    session = MemtierSession("s-red", async_store(backend, Clock()))
    secret = "sk-proj-" + "A1b2C3d4" * 6
    await session.add_items([{"role": "user", "content": f"my key is {secret}"}])
    (item,) = await session.get_items()
    assert secret not in item["content"]
    raw = b"".join(
        v
        for k in backend.sync_client().scan_iter(match=f"*{backend.namespace}*")
        if backend.sync_client().type(k) in (b"list", "list")
        for v in backend.sync_client().lrange(k, 0, -1)
    )
    assert secret.encode() not in raw


async def test_pop_item_and_clear_session(backend: Any) -> None:
    store = async_store(backend, Clock())
    session = MemtierSession("s2", store)
    assert await session.pop_item() is None
    await session.add_items(
        [
            {"role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "c9", "name": "weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c9", "output": "ok"},
        ]
    )
    popped = await session.pop_item()
    assert popped == {"type": "function_call_output", "call_id": "c9", "output": "ok"}
    # the call lost its output: it is left out of the history the Runner reads
    assert shape(await session.get_items()) == [("user", "hi")]
    await session.add_items([popped])  # the same call id may be stored again
    assert shape(await session.get_items()) == [
        ("user", "hi"),
        ("function_call", "c9"),
        ("function_call_output", "c9"),
    ]
    assert (await store.stats())["sessions"] == 1
    await session.clear_session()
    assert await session.get_items() == []
    assert await session.pop_item() is None
    assert (await store.stats()) == {"sessions": 0, "bytes": 0}


async def test_bad_items_raise_memtier_validation_errors(backend: Any) -> None:
    session = MemtierSession("s3", sync_store(backend, Clock()))
    for bad in (
        {"type": "function_call", "call_id": "bad id with spaces", "name": "w", "arguments": ""},
        {"type": "function_call", "call_id": "ok", "arguments": ""},
        {"type": "function_call_output", "output": "x"},
        "not an item",
    ):
        with pytest.raises(ValidationError) as err:
            await session.add_items([bad])
        assert err.value.code == "invalid_input"
    assert await session.get_items() == []  # nothing half-written


@pytest.mark.parametrize("backend", ROUND_TRIP_BACKENDS, indirect=True)
async def test_add_items_is_one_round_trip_and_refused_items_leave_a_prefix(
    backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The items of one ``add_items`` go in one ``append_many``: one round trip for a
    turn's user message, tool call, its output and the answer; a refusal mid-list
    leaves the items before it and none after it."""
    store = async_store(
        backend, Clock(), conversation={"max_turns_per_session": 8, "max_session_bytes": 1024}
    )
    store.inline_compaction = False
    session = MemtierSession("one-trip", store)
    # connect first: a batch's connection comes from the pool (a new one writes its handshake)
    await session.add_items(
        [{"role": "user", "content": "connect"}, {"role": "assistant", "content": "first"}]
    )
    items: list[Any] = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"role": "assistant", "content": "Sunny."},
    ]
    writes = Writes(monkeypatch)
    await session.add_items(items)
    assert writes.count == 1
    assert len(await session.get_items()) == 6
    big = "y" * 990  # past the session's bytes: refused; the small one after it would fit
    with pytest.raises(SessionFullError) as refused:
        await session.add_items(
            [{"role": "user", "content": big}, {"role": "user", "content": "small"}]
        )
    assert refused.value.details["stored"] == 0
    assert len(await session.get_items()) == 6  # the small item was not stored either


# --- the SDK's Runner --------------------------------------------------------------------------


def _conversation_script() -> list[list[Any]]:
    return [
        [call("weather", '{"city": "Oslo"}', "call_a")],
        [say("Oslo is sunny.")],
        [call("weather", '{"city": "Rome"}', "call_b")],
        [say("Rome is sunny too.")],
        [say("You asked about Oslo and Rome.")],
    ]


async def _run_three_turns(session: MemtierSession, model: ScriptedModel) -> None:
    agent = agent_with(model)
    for text in ("Weather in Oslo?", "And Rome?", "What did I ask?"):
        await Runner.run(agent, text, session=session)


async def test_runner_multi_turn_with_tools_replays_prior_turns_in_order(
    backend_no_fake: Any,
) -> None:
    store = AsyncConversationStore(backend_no_fake.async_client(), backend_no_fake.config())
    model = ScriptedModel(_conversation_script())
    await _run_three_turns(MemtierSession("runner-1", store), model)
    # the last model call got every prior turn, in order, with tool pairs intact
    expected = [
        ("user", "Weather in Oslo?"),
        ("function_call", "call_a"),
        ("function_call_output", "call_a"),
        ("assistant", "Oslo is sunny."),
        ("user", "And Rome?"),
        ("function_call", "call_b"),
        ("function_call_output", "call_b"),
        ("assistant", "Rome is sunny too."),
        ("user", "What did I ask?"),
    ]
    assert shape(model.inputs[-1]) == expected
    assert_pairs_intact(model.inputs[-1])
    output = next(i for i in model.inputs[-1] if i.get("type") == "function_call_output")
    assert output["output"] == "sunny in Oslo"
    # a second process-level session object (a fresh client) reads the same history
    again = MemtierSession(
        "runner-1", ConversationStore(backend_no_fake.sync_client(), backend_no_fake.config())
    )
    history = await again.get_items()
    assert shape(history) == [*expected, ("assistant", "You asked about Oslo and Rome.")]


async def test_tool_pairs_stay_intact_after_compaction(backend_no_fake: Any) -> None:
    # 9 turns at most: the Runner's own writes fill the session and compact it inline, and
    # a compaction keeps the newest 4 turns -- a cut between a call and its output.
    config = backend_no_fake.config(conversation={"max_turns_per_session": 9})
    store = ConversationStore(backend_no_fake.sync_client(), config)
    session = MemtierSession("runner-compact", store)
    model = ScriptedModel(_conversation_script())
    await _run_three_turns(session, model)
    for given in model.inputs:
        assert_pairs_intact(given)
    store.compact(session.key, force=True)
    stored = [t.turn_id for t in store.context(session.key).turns if t.kind == "tool"]
    assert "oa-out:call_b" in stored and "oa-call:call_b" not in stored  # a cut pair, stored
    history = await session.get_items()
    assert (
        history[0]["role"] == "user" and "Summary of earlier conversation" in history[0]["content"]
    )
    assert_pairs_intact(history)
    # the Runner goes on from the compacted history, pairs intact in what the model gets
    model2 = ScriptedModel([[call("weather", '{"city": "Nice"}', "call_c")], [say("Nice.")]])
    await Runner.run(agent_with(model2), "Nice?", session=session)
    for given in model2.inputs:
        assert_pairs_intact(given)
    assert shape(model2.inputs[-1])[-3:] == [
        ("user", "Nice?"),
        ("function_call", "call_c"),
        ("function_call_output", "call_c"),
    ]


async def test_tool_pairs_stay_intact_after_eviction_of_other_sessions(
    backend_no_fake: Any,
) -> None:
    config = backend_no_fake.config(conversation={"max_active_sessions": 3})
    store = AsyncConversationStore(backend_no_fake.async_client(), config)
    session = MemtierSession("runner-evict", store)
    model = ScriptedModel(_conversation_script())
    await _run_three_turns(session, model)
    before = await session.get_items()
    for n in range(6):  # other sessions push the older ones out; ours stays most recent
        other = MemtierSession(f"other-{n}", store)
        await other.add_items([{"role": "user", "content": f"hello {n}"}])
        await session.add_items([{"role": "user", "content": f"still here {n}"}])
    stats = await store.stats()
    assert stats["sessions"] <= 3
    history = await session.get_items()
    assert history[: len(before)] == before
    assert_pairs_intact(history)
    events = [e.reason.value for e in await store.events(limit=1000)]
    assert events.count("evicted_session_pressure") >= 4


# --- concurrency -------------------------------------------------------------------------------

PROCESSES = 4
ITEMS_PER_PROCESS = 12


def _add_items_worker(config_json: str, session_id: str, worker: int) -> None:
    config = MemtierConfig.model_validate_json(config_json)
    store = ConversationStore.from_config(config)
    session = MemtierSession(session_id, store)

    async def go() -> None:
        for i in range(0, ITEMS_PER_PROCESS, 3):
            cid = f"w{worker}_{i}"
            await session.add_items(
                [
                    {"role": "user", "content": f"w{worker}-{i}"},
                    {"type": "function_call", "call_id": cid, "name": "weather", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": cid, "output": f"o{worker}"},
                ]
            )

    asyncio.run(go())
    store.close()


@pytest.mark.slow
async def test_concurrent_add_items_from_processes_produce_one_order(
    backend_no_fake: Any,
) -> None:
    config = backend_no_fake.config()
    ctx = mp.get_context("spawn")
    with ctx.Pool(PROCESSES) as pool:
        pool.starmap(
            _add_items_worker,
            [(config.model_dump_json(), "shared", w) for w in range(PROCESSES)],
        )
    readers = [
        MemtierSession("shared", ConversationStore(backend_no_fake.sync_client(), config)),
        MemtierSession("shared", AsyncConversationStore(backend_no_fake.async_client(), config)),
    ]
    orders = [shape(await r.get_items()) for r in readers]
    assert orders[0] == orders[1]  # every reader sees the same one order
    order = orders[0]
    assert len(order) == PROCESSES * ITEMS_PER_PROCESS  # nothing lost, nothing twice
    for w in range(PROCESSES):
        mine = [entry for entry in order if f"w{w}" in entry[1]]
        assert mine == [
            entry
            for i in range(0, ITEMS_PER_PROCESS, 3)
            for entry in (
                ("user", f"w{w}-{i}"),
                ("function_call", f"w{w}_{i}"),
                ("function_call_output", f"w{w}_{i}"),
            )
        ]
    assert_pairs_intact(await readers[0].get_items())
    store = ConversationStore(backend_no_fake.sync_client(), config)
    ckey = readers[0].key
    turns = store.context(ckey).turns
    assert [t.seq for t in turns] == list(range(1, len(order) + 1))


async def test_from_url_owns_its_store_and_pings(redis_server: Any) -> None:
    session = MemtierSession.from_url("owned", url=redis_server.url, channel="public")
    assert await session.ping()
    await session.add_items([{"role": "user", "content": "hello"}])
    assert await session.get_items() == [{"role": "user", "content": "hello"}]
    await session.clear_session()
    await session.close()  # closes the store it made (a caller's store is left open)
