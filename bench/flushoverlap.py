"""The flush's page work against its page calls, overlapped three ways.

``python -m bench.flushoverlap [--rounds K] [--ops SESSIONS] [--out FILE|DIR] [--quick]``

On a private ``redis-server`` (free loopback port, temp dir, stopped by pid), ``SESSIONS``
sessions of 4 turns of 300 B, then per round one flush per mode and client path, in an
order that rotates each round.  Each flush is timed in wall time and in this process's
CPU time (user + system, every thread), and its rate is the generation's bytes over its
wall time.

Modes of the sync executor's ``Overlap`` (the flush writes the page it holds while the
next request is in flight):

* ``early``: what the executor does: a script call on the lean path is written, the page
  work runs while Redis runs it, then the reply is read; any other request (``HSCAN``,
  the generic path) runs after the work;
* ``thread``: what it did before (commit ``5188734``): the request in a helper thread
  while the work runs in the caller's, both joined (re-created here for the comparison);
* ``sequential``: the work, then the request: no overlap at all.

Client paths: ``lean`` (a plain client: the lean call path) and ``generic`` (the
executor's lean path off: every call through redis-py's client, where ``early`` is
``sequential``).  Why: docs/performance.md, "The flush's page work between a script's
write and its read".
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.probe import exit_on_sigterm, machine_meta, parse_round_args, spread, write_json
from bench.server import BenchRedis
from bench.workloads import KeyPool, bench_config, chat_text, populate
from memtier import ConversationStore
from memtier.engine import Overlap
from memtier.executor import SyncExecutor
from memtier.memory.persistence.shared import snapshot_dir_for

__all__ = ["main"]

TURNS = 4
Mode = Callable[[SyncExecutor, Overlap, "str | None"], Any]


def _modes(threads: ThreadPoolExecutor) -> dict[str, Mode]:
    early: Mode = SyncExecutor._overlap

    def thread(self: SyncExecutor, overlap: Overlap, operation: str | None) -> Any:
        future: Future[Any] = threads.submit(self.execute, overlap.request, operation)
        try:
            overlap.work()
        except BaseException:
            future.exception()
            raise
        return future.result()

    def sequential(self: SyncExecutor, overlap: Overlap, operation: str | None) -> Any:
        overlap.work()
        return self.execute(overlap.request, operation)

    return {"early": early, "thread": thread, "sequential": sequential}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.flushoverlap")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--ops", type=int, default=10_000, help="sessions in the namespace")
    args = parse_round_args(p, argv, "flushoverlap")
    exit_on_sigterm()

    text = chat_text(300)
    wall: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    rate: dict[str, list[float]] = {}
    original = SyncExecutor._overlap
    with (
        BenchRedis() as server,
        tempfile.TemporaryDirectory(prefix="memtier-flushoverlap-") as storage,
        ThreadPoolExecutor(4, thread_name_prefix="flushoverlap") as threads,
    ):
        client = server.client()
        meta = machine_meta(client) | {"server_pid": server.pid()}
        config = bench_config("flushoverlap", persistence_enabled=True, storage_path=storage)
        store = ConversationStore(client, config, snapshots=snapshot_dir_for(config))
        populate(store, KeyPool(91, args.ops).keys, text, turns=TURNS)
        modes = _modes(threads)
        rows = [(path, mode) for path in ("lean", "generic") for mode in modes]
        try:
            store.flush()  # warm: scripts loaded, files and caches touched
            for rnd in range(args.rounds):
                shift = rnd % len(rows)
                for path, mode in rows[shift:] + rows[:shift]:
                    SyncExecutor._overlap = modes[mode]  # type: ignore[method-assign,assignment]
                    store.executor.lean = path == "lean"
                    c0, w0 = time.process_time(), time.perf_counter()
                    result = store.flush()
                    seconds = time.perf_counter() - w0
                    name = f"{path}.{mode}"
                    wall.setdefault(name, []).append(seconds)
                    cpu.setdefault(name, []).append(time.process_time() - c0)
                    rate.setdefault(name, []).append(result.bytes / 2**20 / seconds)
                    if result.sessions != args.ops:
                        raise RuntimeError(f"{name}: {result.sessions} sessions flushed")
        finally:
            SyncExecutor._overlap = original  # type: ignore[method-assign]
            store.executor.lean = True
        store.close()

    result_json = {
        "meta": meta,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "mib_per_s": {name: spread(v) for name, v in rate.items()},
        "wall_s": {name: spread(v) for name, v in wall.items()},
        "cpu_s": {name: spread(v) for name, v in cpu.items()},
        "rounds": {"mib_per_s": rate, "wall_s": wall, "cpu_s": cpu},
    }
    write_json(args.out, result_json)
    print(f"flush of {args.ops} sessions x {TURNS} turns, median [min-max] of {args.rounds}:")
    for name in rate:
        r, c = spread(rate[name]), spread(cpu[name])
        print(
            f"  {name:18s} {r['median']:6.1f} MiB/s [{r['min']:.1f}-{r['max']:.1f}]"
            f"  CPU {c['median']:.3f} s [{c['min']:.3f}-{c['max']:.3f}]"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
