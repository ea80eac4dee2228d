"""LangChain's current short-term memory pattern: ``create_agent(..., checkpointer=...)``
with MemtierCheckpointSaver, on a real Redis and the real cluster (scripted model)."""

from __future__ import annotations

from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessage
from lchelpers import RecordingChatModel, kinds

from memtier.integrations.langgraph import MemtierCheckpointSaver


def test_create_agent_remembers_a_thread_through_the_checkpointer(backend_no_fake: Any) -> None:
    saver = MemtierCheckpointSaver(
        backend_no_fake.sync_client(),
        aclient=backend_no_fake.async_client(),
        namespace=backend_no_fake.namespace,
    )
    model = RecordingChatModel(replies=[AIMessage(content="Hi Ana."), AIMessage(content="Ana.")])
    agent = create_agent(model, tools=[], checkpointer=saver)
    cfg = {"configurable": {"thread_id": "visitor-ana"}}
    agent.invoke({"messages": [{"role": "user", "content": "I am Ana."}]}, cfg)
    agent.invoke({"messages": [{"role": "user", "content": "What is my name?"}]}, cfg)
    assert kinds(model.seen[-1]) == [
        ("human", "I am Ana."),
        ("ai", "Hi Ana."),
        ("human", "What is my name?"),
    ]
    other = create_agent(
        RecordingChatModel(replies=[AIMessage(content="?")]), tools=[], checkpointer=saver
    )
    state = other.get_state(cfg)  # another agent object over the same checkpointer
    assert [m.content for m in state.values["messages"]][-1] == "Ana."
