"""A LangGraph graph with a fake model across two processes sharing the checkpointer:
interrupted in one process, resumed in another, on a real Redis and the real cluster."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

from graphhelpers import build, resume_run, start_run

from memtier.integrations.langgraph import MemtierCheckpointSaver


def test_interrupt_in_one_process_resume_in_another(backend_no_fake: Any) -> None:
    config_json = backend_no_fake.config().model_dump_json()
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as first:
        seen = first.apply(start_run, (config_json, "trip-1"))
    assert seen["interrupts"] == [{"question": "teleport?", "plan": "I plan to teleport you."}]
    assert seen["messages"] == ["take me to the sandbox", "I plan to teleport you."]
    with ctx.Pool(1) as second:
        final = second.apply(resume_run, (config_json, "trip-1", "yes"))
    assert final == ["take me to the sandbox", "I plan to teleport you.", "Done (yes)."]
    # a third reader (this process) sees the finished thread and its history
    saver = MemtierCheckpointSaver(
        backend_no_fake.sync_client(), namespace=backend_no_fake.namespace
    )
    state = build(saver).get_state({"configurable": {"thread_id": "trip-1"}})
    assert state.next == ()
    assert state.values["approved"] == "yes"
    history = list(saver.list({"configurable": {"thread_id": "trip-1"}}))
    assert len(history) >= 4
    steps = [t.metadata["step"] for t in history]
    assert steps == sorted(steps, reverse=True)  # newest first
