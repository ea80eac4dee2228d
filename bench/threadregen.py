"""What a threads ``continue`` costs when it regenerates from an earlier turn (issue 12).

``python -m bench.threadregen [--quick] [--turns N] [--ops N] [--rounds K] [--out DIR]``

One private ``redis-server`` (free loopback port, temp dir, stopped by pid).  One thread
of ``--turns`` turns (echo runner, 300 B messages) and a branch ref at the entry 100
turns back (the user edits or regenerates a message: ``continue_(leaf_id=ref)``, each
time a new branch off the same entry, and the thread's head moves to it).  Rows,
interleaved round by round:

* ``head``: ``continue_`` on the head (the latest branch);
* ``regenerate``: ``continue_(leaf_id=ref)``.

Per row: wall us/op, this process's CPU us/op, redis-server's CPU us/op (``INFO cpu``)
and the longest single command inside Redis (SLOWLOG at 0 during the row): a claim that
walks the parents or re-sends the history holds the shard for it.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.probe import (
    RESULTS_DIR,
    exit_on_sigterm,
    fmt,
    loadavg,
    machine_meta,
    redis_cpu_seconds,
    spread,
    write_json,
)
from bench.server import BenchRedis
from bench.workloads import bench_config, chat_text
from memtier.threads.models import Ownership
from memtier.threads.service import ConversationService

__all__ = ["main"]

BACK = 100  # turns between the head and the regenerated entry


def _parse(argv: list[str] | None) -> argparse.Namespace:
    first_line = __doc__.split("\n")[0]
    p = argparse.ArgumentParser(prog="python -m bench.threadregen", description=first_line)
    p.add_argument("--quick", action="store_true", help="seconds: what the smoke test runs")
    p.add_argument("--turns", type=int, default=0, help="turns before measuring (700)")
    p.add_argument("--ops", type=int, default=0, help="calls per row per round (20)")
    p.add_argument("--rounds", type=int, default=0, help="rounds, rows interleaved (5)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for the JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    exit_on_sigterm()
    turns = args.turns or (BACK + 20 if args.quick else 700)
    ops = args.ops or (4 if args.quick else 20)
    rounds = args.rounds or (2 if args.quick else 5)
    if turns <= BACK or turns + ops * rounds * 2 > 950:  # a thread holds 1,000 turns
        raise SystemExit(f"--turns must be in ({BACK}, {950 - ops * rounds * 2}]")
    text = chat_text(300)
    owner = Ownership("bench", "user1")
    with BenchRedis() as server:
        client = server.client()
        meta = machine_meta(client)
        meta.update(
            tool="bench.threadregen", turns=turns, ops=ops, rounds=rounds, back=BACK,
            server_pid=server.pid(),
        )  # fmt: skip
        service = ConversationService(client, bench_config("bregen"))
        tid = service.create(owner, title="regen").id
        tips = [service.continue_(owner, tid, text).entries[-1].id for _ in range(turns)]
        ref = tips[-BACK]
        service.branch(owner, tid, ref)

        def head(n: int) -> None:
            for _ in range(n):
                service.continue_(owner, tid, text)

        def regenerate(n: int) -> None:
            for _ in range(n):
                service.continue_(owner, tid, text, leaf_id=ref)

        rows: dict[str, Callable[[int], None]] = {"head": head, "regenerate": regenerate}
        metrics = ("wall_us", "cpu_us", "server_cpu_us", "longest_command_us")
        per: dict[str, dict[str, list[float]]] = {k: {m: [] for m in metrics} for k in rows}
        loads = []
        client.config_set("slowlog-log-slower-than", 0)
        client.config_set("slowlog-max-len", 10_000)
        try:
            for r in range(rounds):
                loads.append({"round": r, **loadavg()})
                for name in list(rows)[r % 2 :] + list(rows)[: r % 2]:
                    client.slowlog_reset()
                    s0, c0, t0 = redis_cpu_seconds(client), time.process_time(), time.perf_counter()
                    rows[name](ops)
                    t1, c1 = time.perf_counter(), time.process_time()
                    s1 = redis_cpu_seconds(client)
                    log: list[Any] = client.slowlog_get(10_000)
                    per[name]["wall_us"].append((t1 - t0) / ops * 1e6)
                    per[name]["cpu_us"].append((c1 - c0) / ops * 1e6)
                    per[name]["server_cpu_us"].append((s1 - s0) / ops * 1e6)
                    per[name]["longest_command_us"].append(
                        float(max((e["duration"] for e in log), default=0))
                    )
        finally:
            client.config_set("slowlog-log-slower-than", 10_000)
        service.close()
        client.close()
    summary = {k: {m: spread(v) for m, v in per[k].items()} for k in rows}
    for name, row in summary.items():
        print(
            f"{name:<11} wall {fmt(row['wall_us'])} us, client cpu {fmt(row['cpu_us'])} us,"
            f" redis cpu {fmt(row['server_cpu_us'])} us,"
            f" longest command {fmt(row['longest_command_us'])} us"
        )
    tag = "-quick" if args.quick else ""
    path = write_json(
        args.out / f"threadregen{tag}.json",
        {
            "meta": meta,
            "unit": "us per call (wall; this process's CPU; redis-server's CPU); us (longest)",
            "rows": summary,
            "per_round": per,
            "load": loads,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
