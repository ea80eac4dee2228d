"""Sections that plug in as memtier grows: workers (compaction, flush, recovery) and threads.

Each section first checks that the code it measures exists in this checkout;
when it does not, it reports a "not yet available" row per figure of the issue
-- never a number.  When the modules land, the measuring code goes here, with
its baseline from the same run (the disk's sequential write rate for the
flush, the append latency without a flush for the blocked-append figure).
"""

from __future__ import annotations

import importlib.util

from bench.framework import Harness, Measure, timed
from bench.server import BenchRedis

__all__ = ["run_threads", "run_workers"]

WORKER_FIGURES = (
    ("workers.compaction", "compaction throughput (sessions compacted/s)"),
    ("workers.flush", "flush of 100k sessions vs the disk's sequential write rate"),
    ("workers.flush_blocked", "longest append blocked while a 100k-session flush runs"),
    ("workers.recovery", "recovery validation rate (records/s)"),
)
THREAD_POOL = 200  # threads the continue benchmark rotates over
HISTORY_TURNS = 40  # turns of the thread that replay and export read

THREAD_FIGURES = (
    ("threads.continue", "continue a thread with the echo runner"),
    ("threads.replay", "replay pages"),
    ("threads.export", "export"),
)


def _missing(*modules: str) -> list[str]:
    out = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            out.append(name)
    return out


def run_workers(h: Harness) -> None:
    missing = _missing("memtier.workers")
    if missing:
        for key, label in WORKER_FIGURES:
            h.unavailable(
                "workers",
                key,
                label,
                f"not yet available: {', '.join(missing)} is not in this checkout",
            )
        return
    for key, label in WORKER_FIGURES:  # the package exists but no benchmark is wired yet
        h.unavailable(
            "workers",
            key,
            label,
            "not yet benchmarked: memtier.workers exists but"
            " its benchmark is not wired into bench/later.py yet",
        )


def run_threads(h: Harness, server: BenchRedis, baseline: Measure) -> None:
    """Threads service: create, continue (echo runner), replay pages, export.

    Same group as the raw minimal-script append (``baseline``), so each figure has a
    same-run ratio to the physical limit of one script call from Python.
    """
    missing = _missing("memtier.threads.service")
    if missing:
        for key, label in THREAD_FIGURES:
            h.unavailable(
                "threads",
                key,
                label,
                f"not yet available: {', '.join(missing)} is not in this checkout",
            )
        return
    from bench.workloads import bench_config, chat_text
    from memtier.threads.models import Ownership
    from memtier.threads.service import ConversationService

    client = server.client()
    service = ConversationService(client, bench_config("bthreads"))
    owner = Ownership("bench", "user1")
    text = chat_text(300)
    pool = [service.create(owner, title=f"t{i}").id for i in range(THREAD_POOL)]
    history = service.create(owner, title="history").id
    for _ in range(HISTORY_TURNS):
        service.continue_(owner, history, text)
    state = {"c": 0}

    def create(n: int) -> None:
        for _ in range(n):
            service.create(owner)

    def continue_(n: int) -> None:
        i = state["c"]
        for j in range(i, i + n):
            service.continue_(owner, pool[j % THREAD_POOL], text)
        state["c"] = i + n

    def replay(n: int) -> None:
        for _ in range(n):
            page = service.replay(owner, history)
            assert page.records

    def export(n: int) -> None:
        for _ in range(n):
            result = service.export(owner, history)
            assert result.events

    h.group(
        "threads",
        [
            baseline,
            Measure("threads.create", "threads create", timed(create)),
            Measure("threads.continue", "threads continue, echo runner [300B]", timed(continue_)),
            Measure(
                "threads.replay",
                f"threads replay, first page of {HISTORY_TURNS} turns",
                timed(replay),
                unit="pages/s",
            ),
            Measure(
                "threads.export",
                f"threads export of {HISTORY_TURNS} turns",
                timed(export),
                unit="exports/s",
            ),
        ],
        ratios={
            k: baseline.key
            for k in ("threads.create", "threads.continue", "threads.replay", "threads.export")
        },
    )
    client.close()
