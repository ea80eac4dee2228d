"""LangGraph checkpointers: put and get_tuple of memtier's against SQLite and in-memory.

One group per operation, run in interleaved rounds, so the ratios are same-run:
``memtier/sqlite`` and ``inmemory/sqlite`` (their quotient is memtier against the
in-process dict).  ``langgraph-checkpoint-sqlite`` writes a local file (WAL, the
library's defaults); memtier's saver talks to the benchmark's redis-server over
loopback.  ``langgraph-checkpoint-redis`` is listed by bench/peers.py as not runnable
(it needs RediSearch/RedisJSON).
"""

from __future__ import annotations

import sqlite3
import tempfile
import uuid
from pathlib import Path
from typing import Any

from bench.framework import Harness, Measure, timed

__all__ = ["run_checkpoints"]

_STATE_BYTES = 2_000  # a small chat state: a few messages
_READ_HISTORY = 20  # checkpoints in the thread get_tuple reads the newest of


def _checkpoint(saver: Any, n: int) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    from langgraph.checkpoint.base import empty_checkpoint

    cp: dict[str, Any] = dict(empty_checkpoint())
    version = saver.get_next_version(None, None)
    cp["channel_values"] = {"messages": ["x" * (_STATE_BYTES // 4)] * 4, "step": n}
    cp["channel_versions"] = {"messages": version, "step": version}
    return cp, {"source": "loop", "step": n}, {"messages": version, "step": version}


def _measures(name: str, saver: Any) -> tuple[Measure, Measure]:
    prefix = f"bench-{name}-{uuid.uuid4().hex[:8]}"
    rounds = [0]

    def put_chain(thread: str, n: int) -> None:
        parent: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        for i in range(n):
            cp, md, versions = _checkpoint(saver, i)
            parent = saver.put(parent, cp, md, versions)

    def put(n: int) -> None:
        # a new thread per round: no saver is measured on a thread another round grew
        rounds[0] += 1
        put_chain(f"{prefix}-put-{rounds[0]}", n)

    read_thread = f"{prefix}-get"
    read_config = {"configurable": {"thread_id": read_thread, "checkpoint_ns": ""}}
    put_chain(read_thread, _READ_HISTORY)

    def get(n: int) -> None:
        for _ in range(n):
            if saver.get_tuple(read_config) is None:
                raise AssertionError("get_tuple found no checkpoint")

    return (
        Measure(f"langgraph.put.{name}", f"LangGraph put, {name}", timed(put)),
        Measure(
            f"langgraph.get_tuple.{name}",
            f"LangGraph get_tuple (latest of {_READ_HISTORY}), {name}",
            timed(get),
        ),
    )


def run_checkpoints(h: Harness, server: Any) -> None:
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.checkpoint.sqlite import SqliteSaver

    from memtier.integrations.langgraph import MemtierCheckpointSaver

    with tempfile.TemporaryDirectory(prefix="memtier-bench-sqlite-") as tmp:
        conn = sqlite3.connect(Path(tmp) / "checkpoints.db", check_same_thread=False)
        client = server.client()
        try:
            savers = {
                "memtier": MemtierCheckpointSaver(client, namespace="bench-lg"),
                "sqlite": SqliteSaver(conn),
                "inmemory": InMemorySaver(),
            }
            built = {name: _measures(name, s) for name, s in savers.items()}
            for index, op in ((0, "put"), (1, "get_tuple")):
                ms = [built[name][index] for name in ("sqlite", "memtier", "inmemory")]
                base = f"langgraph.{op}.sqlite"
                h.group(
                    f"LangGraph checkpointer {op}, sync [~2 KB state]",
                    ms,
                    ratios={m.key: base for m in ms if m.key != base},
                )
        finally:
            conn.close()
            client.close()
