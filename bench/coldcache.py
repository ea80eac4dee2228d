"""What memtier's client work per append costs between round trips, not in a hot loop.

``python -m bench.coldcache [--quick] [--ops N] [--rounds K] [--out DIR]``

The same client-only work -- one append's plan (``prepare_turn`` + ``append_call``:
validation, redaction, ids, keys and ARGV) -- timed with this thread's CPU clock in three
settings, rounds interleaved:

* ``hot``: back to back, nothing in between (what a micro-benchmark of the stage sees);
* ``after_sleep``: each plan after a 50 us sleep (the core idles, as while Redis runs the
  previous call);
* ``after_round_trip``: each plan right after a ``PING`` round trip to a private
  ``redis-server`` (free loopback port, temp dir, stopped by pid): the setting of a
  sync append loop.

Only the plan is on the clock in every row, so the difference is what the setting does
to the same instructions (caches and branch predictors cold after the process slept):
the reason memtier's per-append client work measures about twice its hot-loop cost in
``store.append`` (docs/performance.md, "cold caches between round trips").
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.probe import RESULTS_DIR, exit_on_sigterm, fmt, loadavg, machine_meta, spread, write_json
from bench.server import BenchRedis
from bench.workloads import bench_config, chat_text
from memtier import AvatarMessage, ConversationKey
from memtier.memory.core import MemoryCore

__all__ = ["main"]

SLEEP_S = 50e-6


def _rows(client: Any) -> dict[str, Callable[[int], float]]:
    """Each row: ``run(n)`` -> this thread's CPU ns spent in ``n`` plans."""
    core = MemoryCore(bench_config("coldcache"))
    text = chat_text(300)
    keys = [ConversationKey(uuid.uuid4(), "public") for _ in range(256)]
    clock = time.thread_time_ns

    def plan(i: int) -> None:
        core.append_call(core.prepare_turn(keys[i % 256], AvatarMessage(text=text)))

    def hot(n: int) -> float:
        total = 0
        for i in range(n):
            started = clock()
            plan(i)
            total += clock() - started
        return total

    def after_sleep(n: int) -> float:
        total = 0
        for i in range(n):
            time.sleep(SLEEP_S)
            started = clock()
            plan(i)
            total += clock() - started
        return total

    def after_round_trip(n: int) -> float:
        total = 0
        for i in range(n):
            client.ping()
            started = clock()
            plan(i)
            total += clock() - started
        return total

    return {"hot": hot, "after_sleep": after_sleep, "after_round_trip": after_round_trip}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    first_line = __doc__.split("\n")[0]
    p = argparse.ArgumentParser(prog="python -m bench.coldcache", description=first_line)
    p.add_argument("--quick", action="store_true", help="seconds: what the smoke test runs")
    p.add_argument("--ops", type=int, default=0, help="plans per row per round (2000)")
    p.add_argument("--rounds", type=int, default=0, help="rounds, rows interleaved (9)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for the JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    exit_on_sigterm()
    ops = args.ops or (200 if args.quick else 2000)
    rounds = args.rounds or (2 if args.quick else 9)
    with BenchRedis() as server:
        client = server.client()
        meta = machine_meta(client)
        meta.update(tool="bench.coldcache", ops=ops, rounds=rounds, server_pid=server.pid())
        rows = _rows(client)
        for row in rows.values():  # warm-up: caches of the config, imports, the connection
            row(min(ops, 100))
        per_round: dict[str, list[float]] = {k: [] for k in rows}
        names = list(rows)
        loads = []
        for r in range(rounds):
            loads.append({"round": r, **loadavg()})
            for name in names[r % len(names) :] + names[: r % len(names)]:
                per_round[name].append(rows[name](ops) / ops / 1000)
        client.close()
    summary = {name: spread(values) for name, values in per_round.items()}
    hot = summary["hot"]["median"] or float("nan")
    ratios = {name: summary[name]["median"] / hot for name in names if name != "hot"}
    for name in names:
        print(f"{name:<18} {fmt(summary[name])} us CPU per plan")
    for name, ratio in ratios.items():
        print(f"{name} / hot: x{ratio:.2f}")
    tag = "-quick" if args.quick else ""
    path = write_json(
        args.out / f"coldcache{tag}.json",
        {
            "meta": meta,
            "unit": "us of this thread's CPU per plan (prepare_turn + append_call)",
            "rows": summary,
            "ratio_to_hot": ratios,
            "per_round": per_round,
            "load": loads,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
