"""A full restore of one generation, with and without reading ahead.

``python -m bench.restoreprobe [--rounds K] [--ops SESSIONS] [--out FILE|DIR] [--quick]``

On a private ``redis-server`` (free loopback port, temp dir, stopped by pid), ``SESSIONS``
sessions of 2 turns of 300 B (as ``bench.run``'s workers section), one flush, then per
round one restore per mode, in an order that rotates each round: the namespace's keys
deleted, then ``ConversationStore.recover(force=True)`` (both passes, every
``restore_session``).  Each restore is timed in wall time, in this process's CPU time
(user + system, every thread) and in the server's CPU time (``INFO cpu``); its rate is
the generation's bytes over its wall time.

Modes of the sync executor's ``Overlap`` (pass 2 reads the next batch of sessions while
the last one is restored):

* ``read_ahead``: what the executor does: the batch's pipeline is written, the next
  batch is read from the file and built while Redis runs it, then the replies are read;
* ``sequential``: the next batch is read, then the batch is sent: what the restore did
  before the twenty-seventh round (one batch at a time, the client waiting on Redis).

Why: docs/performance.md, "The restore reads its next batch while Redis restores the
last one".
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.probe import (
    exit_on_sigterm,
    machine_meta,
    parse_round_args,
    redis_cpu_seconds,
    spread,
    write_json,
)
from bench.server import BenchRedis
from bench.workerbench import delete_namespace, populate_sessions
from bench.workloads import bench_config
from memtier import ConversationStore
from memtier.engine import Overlap
from memtier.executor import SyncExecutor
from memtier.memory.persistence.shared import snapshot_dir_for

__all__ = ["main"]

TURNS = 2
Mode = Callable[[SyncExecutor, Overlap, "str | None"], Any]


def _sequential(self: SyncExecutor, overlap: Overlap, operation: str | None) -> Any:
    overlap.work()
    return self.execute(overlap.request, operation)


MODES: dict[str, Mode] = {"read_ahead": SyncExecutor._overlap, "sequential": _sequential}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.restoreprobe")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--ops", type=int, default=10_000, help="sessions in the generation")
    args = parse_round_args(p, argv, "restoreprobe")
    exit_on_sigterm()

    series: dict[str, dict[str, list[float]]] = {
        what: {} for what in ("mib_per_s", "wall_s", "cpu_s", "redis_cpu_s")
    }
    original = SyncExecutor._overlap
    with (
        BenchRedis() as server,
        tempfile.TemporaryDirectory(prefix="memtier-restoreprobe-") as storage,
    ):
        client = server.client()
        meta = machine_meta(client) | {"server_pid": server.pid()}
        namespace = "restoreprobe"
        config = bench_config(namespace, persistence_enabled=True, storage_path=storage)
        store = ConversationStore(client, config, snapshots=snapshot_dir_for(config))
        try:
            populate_sessions(store, args.ops, turns=TURNS, text_bytes=300)
            flushed = store.flush()
            modes = list(MODES)
            for rnd in range(args.rounds):
                shift = rnd % len(modes)
                for mode in modes[shift:] + modes[:shift]:
                    delete_namespace(store, namespace)
                    SyncExecutor._overlap = MODES[mode]  # type: ignore[method-assign,assignment]
                    s0, c0, w0 = redis_cpu_seconds(client), time.process_time(), time.perf_counter()
                    report = store.recover(force=True)
                    seconds = time.perf_counter() - w0
                    cpu = time.process_time() - c0
                    SyncExecutor._overlap = original  # type: ignore[method-assign]
                    if report.outcome != "restored" or report.restored != args.ops:
                        raise RuntimeError(f"{mode}: {report.outcome}, {report.restored} restored")
                    for what, value in (
                        ("mib_per_s", flushed.bytes / 2**20 / seconds),
                        ("wall_s", seconds),
                        ("cpu_s", cpu),
                        ("redis_cpu_s", redis_cpu_seconds(client) - s0),
                    ):
                        series[what].setdefault(mode, []).append(value)
        finally:
            SyncExecutor._overlap = original  # type: ignore[method-assign]
            delete_namespace(store, namespace)
            store.close()

    result_json: dict[str, Any] = {
        "meta": meta,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "generation_bytes": flushed.bytes,
        # per measure: {mode: median/min/max}
        **{
            what: {mode: spread(v) for mode, v in by_mode.items()}
            for what, by_mode in series.items()
        },
        "rounds": series,
    }
    write_json(args.out, result_json)
    print(f"restore of {args.ops} sessions x {TURNS} turns, median [min-max] of {args.rounds}:")
    for mode in MODES:
        r, c, s = (spread(series[w][mode]) for w in ("mib_per_s", "cpu_s", "redis_cpu_s"))
        print(
            f"  {mode:11s} {r['median']:6.2f} MiB/s [{r['min']:.2f}-{r['max']:.2f}]"
            f"  client CPU {c['median']:.2f} s  Redis CPU {s['median']:.2f} s"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
