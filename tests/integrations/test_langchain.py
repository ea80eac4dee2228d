"""memtier.integrations.langchain: MemtierChatMessageHistory, alone and under
RunnableWithMessageHistory with a scripted chat model."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from adapterstores import Clock, async_store, sync_store
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory
from lchelpers import RecordingChatModel, kinds
from roundtrips import ROUND_TRIP_BACKENDS, Writes

from memtier import ConversationKey
from memtier.errors import ConfigurationError, ValidationError
from memtier.integrations._common import NotStoredReason
from memtier.integrations.langchain import HISTORY_NAMESPACE, MemtierChatMessageHistory


def test_key_is_documented_uuid5_on_im_by_default(backend: Any) -> None:
    store = sync_store(backend, Clock())
    history = MemtierChatMessageHistory("abc", store)
    assert history.key == ConversationKey(uuid.uuid5(HISTORY_NAMESPACE, "abc"), "im")
    assert uuid.uuid5(uuid.NAMESPACE_URL, "memtier:integrations:langchain") == HISTORY_NAMESPACE
    assert MemtierChatMessageHistory("abc", store, channel="public").key.channel.value == "public"
    with pytest.raises(ConfigurationError):
        MemtierChatMessageHistory("abc")


def test_messages_round_trip_with_tool_calls_and_system_not_stored(backend: Any) -> None:
    history = MemtierChatMessageHistory("s1", sync_store(backend, Clock()))
    history.add_messages(
        [
            SystemMessage(content="you are a helper"),
            HumanMessage(content="weather in Oslo?"),
            AIMessage(
                content="Let me check.",
                tool_calls=[
                    {"name": "weather", "args": {"city": "Oslo"}, "id": "call_1"},
                    {"name": "clock", "args": {}, "id": "call_2"},
                ],
            ),
            ToolMessage(content="sunny", tool_call_id="call_1", name="weather"),
            ToolMessage(content="noon", tool_call_id="call_2", name="clock"),
            AIMessage(content="Sunny at noon."),
        ]
    )
    got = history.messages
    assert kinds(got) == [
        ("human", "weather in Oslo?"),
        ("ai", "Let me check."),
        ("tool", "sunny"),
        ("tool", "noon"),
        ("ai", "Sunny at noon."),
    ]
    assert got[1].tool_calls == [  # type: ignore[attr-defined]
        {"name": "weather", "args": {"city": "Oslo"}, "id": "call_1", "type": "tool_call"},
        {"name": "clock", "args": {}, "id": "call_2", "type": "tool_call"},
    ]
    assert [m.tool_call_id for m in got if isinstance(m, ToolMessage)] == ["call_1", "call_2"]
    assert dict(history.not_stored.counts) == {NotStoredReason.SYSTEM_MESSAGE.value: 1}
    # last(n): the newest n, a call cut from its output left out whole
    assert kinds(history.last(1)) == [("ai", "Sunny at noon.")]
    last3 = history.last(3)
    assert kinds(last3) == [("ai", "Sunny at noon.")]  # two outputs without their calls
    assert history.last(0) == []
    with pytest.raises(ValidationError):
        history.last(-1)
    history.clear()
    assert history.messages == []


def test_a_popped_output_leaves_no_dangling_call(backend: Any) -> None:
    store = sync_store(backend, Clock())
    history = MemtierChatMessageHistory("s-pop", store)
    history.add_messages(
        [
            HumanMessage(content="hi"),
            AIMessage(content="", tool_calls=[{"name": "w", "args": {"a": 1}, "id": "c1"}]),
            ToolMessage(content="r", tool_call_id="c1"),
        ]
    )
    assert len(history.messages) == 3
    store.pop(history.key)
    assert kinds(history.messages) == [("human", "hi")]


def test_bad_messages_are_validation_errors_and_nothing_is_written(backend: Any) -> None:
    history = MemtierChatMessageHistory("s-bad", sync_store(backend, Clock()))
    with pytest.raises(ValidationError) as err:
        history.add_messages(
            [HumanMessage(content="ok"), ToolMessage(content="x", tool_call_id="has space")]
        )
    assert err.value.code == "invalid_input"
    with pytest.raises(ValidationError):
        history.add_messages(["not a message"])  # type: ignore[list-item]
    assert history.messages == []


@pytest.mark.parametrize("backend", ROUND_TRIP_BACKENDS, indirect=True)
async def test_add_messages_is_one_round_trip_sync_and_async(
    backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chain's turn (question, tool call, its result, answer) in one ``append_many``:
    one round trip, sync and asyncio."""
    store, astore = sync_store(backend, Clock()), async_store(backend, Clock())
    history = MemtierChatMessageHistory("s-trip", store, astore=astore)

    def turn(call_id: str) -> list[Any]:
        return [
            HumanMessage(content="Weather?"),
            AIMessage(content="", tool_calls=[{"name": "w", "args": {}, "id": call_id}]),
            ToolMessage(content="sunny", tool_call_id=call_id),
            AIMessage(content="Sunny."),
        ]

    # connect first (a batch's connection comes from the pool: a new one writes its
    # handshake)
    history.add_messages([HumanMessage(content="hi"), AIMessage(content="hello")])
    await history.aadd_messages([HumanMessage(content="hi"), AIMessage(content="hello")])
    writes = Writes(monkeypatch)
    history.add_messages(turn("c1"))
    assert writes.count == 1
    await history.aadd_messages(turn("c2"))
    assert writes.count == 2
    stored = history.messages
    assert len(stored) == 12 and kinds(stored[-4:]) == kinds(turn("c2"))


async def test_async_forms_match_sync(backend: Any) -> None:
    store, astore = sync_store(backend, Clock()), async_store(backend, Clock())
    history = MemtierChatMessageHistory("s-async", store, astore=astore)
    await history.aadd_messages([HumanMessage(content="a"), AIMessage(content="b")])
    assert kinds(await history.aget_messages()) == kinds(history.messages)
    only_sync = MemtierChatMessageHistory("s-async", store)
    assert kinds(await only_sync.aget_messages()) == [("human", "a"), ("ai", "b")]
    await history.aclear()
    assert await history.aget_messages() == []


# langchain-core 1.x deprecates RunnableWithMessageHistory in favour of LangGraph
# persistence (memtier.integrations.langgraph); it still works and is still used.
_DEPRECATED = pytest.mark.filterwarnings(
    "ignore:RunnableWithMessageHistory is deprecated:DeprecationWarning"
)


def _chain(model: RecordingChatModel, factory: Any) -> RunnableWithMessageHistory:
    prompt = ChatPromptTemplate.from_messages(
        [
            ("system", "You are a concise guide."),
            MessagesPlaceholder("history"),
            ("human", "{question}"),
        ]
    )
    return RunnableWithMessageHistory(
        prompt | model,
        factory,
        input_messages_key="question",
        history_messages_key="history",
    )


@_DEPRECATED
def test_runnable_with_message_history_over_several_turns(backend_no_fake: Any) -> None:
    config = backend_no_fake.config()
    from memtier import ConversationStore

    store = ConversationStore(backend_no_fake.sync_client(), config)
    model = RecordingChatModel(
        replies=[AIMessage(content=f"answer {n}") for n in range(3)], seen=[]
    )
    chain = _chain(model, lambda session_id: MemtierChatMessageHistory(session_id, store))
    cfg = {"configurable": {"session_id": "visitor-9"}}
    for n in range(3):
        assert chain.invoke({"question": f"question {n}"}, config=cfg).content == f"answer {n}"
    # the last call got the system prompt (not stored), then every prior turn in order
    assert kinds(model.seen[-1]) == [
        ("system", "You are a concise guide."),
        ("human", "question 0"),
        ("ai", "answer 0"),
        ("human", "question 1"),
        ("ai", "answer 1"),
        ("human", "question 2"),
    ]
    fresh = MemtierChatMessageHistory(
        "visitor-9", ConversationStore(backend_no_fake.sync_client(), config)
    )
    assert len(fresh.messages) == 6 and fresh.messages[-1].content == "answer 2"


@_DEPRECATED
async def test_runnable_with_message_history_async(backend_no_fake: Any) -> None:
    from memtier import AsyncConversationStore

    astore = AsyncConversationStore(backend_no_fake.async_client(), backend_no_fake.config())
    model = RecordingChatModel(
        replies=[AIMessage(content="one"), AIMessage(content="two")], seen=[]
    )
    chain = _chain(model, lambda sid: MemtierChatMessageHistory(sid, astore=astore))
    cfg = {"configurable": {"session_id": "async-visitor"}}
    await chain.ainvoke({"question": "first"}, config=cfg)
    await chain.ainvoke({"question": "second"}, config=cfg)
    assert kinds(model.seen[-1])[1:] == [("human", "first"), ("ai", "one"), ("human", "second")]
