"""Which snapshot_page calls hold the shard past 2 ms: page work, or redis-server waiting to run.

``python -m bench.pagehold [--quick] [--rounds N] [--sessions N] [--out DIR]``

The full run's page-hold row is the longest ``snapshot_page`` call inside Redis
(SLOWLOG) while two other processes append: one call in thousands, on 2 CPUs shared by
redis-server, the flusher, the writers and whatever else runs here. SLOWLOG times a call
from its start to its end, so a call during which redis-server was preempted includes
the time it waited for a CPU. This probe runs the same flush (``bench.workerbench``'s
``bench_flush_blocking``, two writers, one private ``redis-server`` on a free loopback
port in a temp dir, stopped by pid) and reads redis-server's scheduler counters
(``/proc``: involuntary switches and run-queue wait) before and after every page call,
then that call's own SLOWLOG entry (its hold inside Redis). Each call is then
*undisturbed* (no involuntary switch of redis-server between the two reads) or
*disturbed* (preempted: taken off its CPU while runnable; the run-queue wait of such
calls is reported too). The longest undisturbed hold is what the page work costs; the
longest disturbed one is what the shard was held with the machine's scheduling added.
The extra reads slow the flush, so its rate here is not the flush's (the full run
measures that without them).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.probe import RESULTS_DIR, exit_on_sigterm, fmt, loadavg, machine_meta, spread, write_json
from bench.server import BenchRedis
from bench.workerbench import bench_flush_blocking

__all__ = ["main"]

TARGET_MS = 2.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pagehold")
    p.add_argument("--quick", action="store_true", help="seconds: what the smoke test runs")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sessions", type=int, default=0, help="default 100,000 (quick: 300)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    exit_on_sigterm()
    sessions = args.sessions or (300 if args.quick else 100_000)
    rounds = 1 if args.quick else args.rounds
    runs: list[dict[str, Any]] = []
    with BenchRedis() as server, tempfile.TemporaryDirectory(prefix="memtier-pagehold-") as tmp:
        client = server.client()
        meta = machine_meta(client)
        meta.update(server_pid=server.pid(), sessions=sessions, rounds=rounds)
        for r in range(rounds):
            store_dir = Path(tmp) / f"round{r}"
            store_dir.mkdir()
            load = loadavg()
            res = bench_flush_blocking(
                server.url,
                sessions=sessions,
                storage_path=store_dir,
                namespace=f"bhold{r}",
                writers=2,
                baseline_s=0.5 if args.quick else 2.0,
                server_pid=server.pid(),
                sample_pages=True,
            )
            sched = res["page_sched"]
            runs.append(
                {
                    "load": load,
                    "server_max_page_ms": res["server_max_page_us"] / 1000,
                    "server_page_p99_ms": res["server_page_p99_us"] / 1000,
                    "server_preempted": res["server_preempted"],
                    "sessions_flushed": res["sessions"],
                    "page_calls_alone": res["page_calls"],
                    **sched,
                }
            )
            print(
                f"round {r}: longest page in Redis {res['server_max_page_us'] / 1000:.2f} ms "
                f"(p99 {res['server_page_p99_us'] / 1000:.2f}); {sched['calls']} calls: "
                f"{sched['calls_undisturbed']} undisturbed, longest hold "
                f"{sched['longest_undisturbed_call_s'] * 1000:.2f} ms; "
                f"{sched['calls_disturbed']} disturbed, longest "
                f"{sched['longest_disturbed_call_s'] * 1000:.2f} ms "
                f"(waited up to {sched['longest_disturbed_wait_s'] * 1000:.2f} ms)",
                flush=True,
            )
        client.close()
    summary = {
        key: spread([run[key] for run in runs])
        for key in (
            "server_max_page_ms",
            "server_page_p99_ms",
            "longest_undisturbed_call_s",
            "longest_disturbed_call_s",
            "longest_disturbed_wait_s",
            "calls_disturbed",
            "calls",
        )
    }
    undisturbed_ms = summary["longest_undisturbed_call_s"]["max"] * 1000
    data = {
        "probe": "bench.pagehold",
        "meta": meta,
        "target_ms": TARGET_MS,
        "runs": runs,
        "summary": summary,
        # Every undisturbed page call, over all rounds, stayed within the target.
        "undisturbed_within_target": undisturbed_ms <= TARGET_MS,
    }
    path = write_json(args.out / f"pagehold{'-quick' if args.quick else ''}.json", data)
    print(
        f"longest page in Redis {fmt(summary['server_max_page_ms'], 2)} ms; longest "
        f"undisturbed page hold {undisturbed_ms:.2f} ms over all rounds "
        f"(target {TARGET_MS} ms); wrote {path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
