"""A small LangGraph graph with a fake chat model and a human-approval interrupt.

Module-level so that spawned processes can import it (tests/integrations/test_langgraph_graph.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command, interrupt

from memtier import MemtierConfig
from memtier.integrations.langgraph import MemtierCheckpointSaver


class State(MessagesState):
    approved: str


def build(saver: MemtierCheckpointSaver) -> Any:
    model = FakeMessagesListChatModel(
        responses=[AIMessage(content="I plan to teleport you."), AIMessage(content="Done.")]
    )

    def plan(state: State) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def approve(state: State) -> dict[str, Any]:
        answer = interrupt({"question": "teleport?", "plan": state["messages"][-1].content})
        return {"approved": str(answer)}

    def act(state: State) -> dict[str, Any]:
        done = AIMessage(content=f"Done ({state['approved']}).")
        return {"messages": [done]}

    builder = StateGraph(State)
    builder.add_node("plan", plan)
    builder.add_node("approve", approve)
    builder.add_node("act", act)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "approve")
    builder.add_edge("approve", "act")
    builder.add_edge("act", END)
    return builder.compile(checkpointer=saver)


def start_run(config_json: str, thread: str) -> dict[str, Any]:
    """Process A: run until the interrupt; return what the caller saw."""
    saver = MemtierCheckpointSaver.from_config(MemtierConfig.model_validate_json(config_json))
    graph = build(saver)
    cfg = {"configurable": {"thread_id": thread}}
    result = graph.invoke({"messages": [HumanMessage(content="take me to the sandbox")]}, cfg)
    interrupts = [i.value for i in result.get("__interrupt__", [])]
    saver.close()
    return {"interrupts": interrupts, "messages": [m.content for m in result["messages"]]}


def resume_run(config_json: str, thread: str, answer: str) -> list[str]:
    """Process B: resume the interrupted run (asyncio form) from the shared checkpointer."""

    async def go() -> list[str]:
        saver = MemtierCheckpointSaver.from_config(MemtierConfig.model_validate_json(config_json))
        graph = build(saver)
        cfg = {"configurable": {"thread_id": thread}}
        result = await graph.ainvoke(Command(resume=answer), cfg)
        await saver.aclose()
        return [m.content for m in result["messages"]]

    return asyncio.run(go())
