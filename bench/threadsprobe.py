"""Probe of the threads service's continue / replay / export (issue 12, "Threads").

``python -m bench.threadsprobe [--rounds N] [--ops N] [--prefill N] [--out FILE] [--profile FILE]``

One private ``redis-server`` (free loopback port, temp dir, stopped on exit).  Rows,
interleaved round by round so that the machine's load hits them alike:

* ``raw``: the raw minimal script (``bench/minimal_append-4.lua``) by redis-py's
  ``evalsha``, 300 B -- the target's baseline (``bench.run``'s threads group);
* ``continue``: ``ConversationService.continue_`` with the echo runner over 200 threads
  (as ``bench.workers_threads.run_threads``), 300 B messages;
  (``--prefill N``: N turns on each of them first, as the full run's threads have grown
  to by its last rounds: a cost that grows with the history shows);
* ``replay`` / ``export``: the first page of a 40-turn thread, its export (read again
  and again: from the second read on, rows come from the served-rows memo where the tree
  has one); ``replay_cold``: the same page with that memo emptied before each read.

Each row records wall us/op and this process's CPU us/op (user + system, every thread:
the load of other processes cannot inflate it), and the requests per op the service's
executor performed (round trips; the runner hand-off is not one).  ``--profile`` writes a
pyinstrument profile of the continue rows.  To compare two trees, run it from each tree's
own directory (``cd <tree> && PYTHONPATH=<tree> python -m bench.threadsprobe``): ``-m``
puts the current directory ahead of ``PYTHONPATH``, so run from one tree it imports that
tree's ``memtier`` whatever ``PYTHONPATH`` says (the JSON's ``tree`` names the one used).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

THREADS = 200
HISTORY_TURNS = 40


def _git(root: Path) -> str:
    out = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.threadsprobe")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--ops", type=int, default=200, help="continue calls per round")
    p.add_argument("--prefill", type=int, default=0, help="turns per pool thread first")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--profile", type=Path, default=None)
    args = p.parse_args(argv)

    import memtier
    from bench.probe import redis_cpu_seconds
    from bench.server import BenchRedis
    from bench.workloads import MINIMAL_SCRIPT, Baselines, bench_config, chat_text
    from memtier.threads.models import Ownership
    from memtier.threads.service import ConversationService

    tree = Path(memtier.__file__).resolve().parent.parent
    text = chat_text(300)
    owner = Ownership("bench", "user1")
    with BenchRedis() as server:
        client = server.client()
        sha = client.script_load(MINIMAL_SCRIPT.read_text())
        service = ConversationService(client, bench_config("bthreads"))
        counts: collections.Counter[str] = collections.Counter()
        execute = service.executor.execute

        def counting(request: Any, operation: str | None = None) -> Any:
            name = getattr(request, "script", None) or getattr(request, "method", None)
            counts[str(name or type(request).__name__)] += 1
            return execute(request, operation)

        service.executor.execute = counting  # type: ignore[method-assign]
        pool = [service.create(owner, title=f"t{i}").id for i in range(THREADS)]
        for _ in range(args.prefill):
            for tid in pool:
                service.continue_(owner, tid, text)
        history = service.create(owner, title="history").id
        for _ in range(HISTORY_TURNS):
            service.continue_(owner, history, text)
        service.replay(owner, history)  # the cursor secret, once
        state = {"c": 0, "raw": 0}

        def raw(n: int) -> None:
            i = state["raw"]
            for j in range(i, i + n):
                client.evalsha(sha, 4, *Baselines.append_args("ba", j), text, "m")
            state["raw"] = i + n

        def continue_(n: int) -> None:
            i = state["c"]
            for j in range(i, i + n):
                service.continue_(owner, pool[j % THREADS], text)
            state["c"] = i + n

        def replay(n: int) -> None:
            for _ in range(n):
                service.replay(owner, history)

        def export(n: int) -> None:
            for _ in range(n):
                service.export(owner, history)

        def replay_cold(n: int) -> None:  # every row redacted again: a first read
            from memtier.threads.servedrows import ServedRows

            for _ in range(n):
                service.core.served_rows = ServedRows()
                service.replay(owner, history)

        rows: dict[str, tuple[Callable[[int], None], int]] = {
            "raw": (raw, args.ops),
            "continue": (continue_, args.ops),
            "replay": (replay, max(1, args.ops // 20)),
            "export": (export, max(1, args.ops // 40)),
        }
        if hasattr(service.core, "served_rows"):  # trees with the served-rows memo
            rows["replay_cold"] = (replay_cold, max(1, args.ops // 20))
        wall: dict[str, list[float]] = {k: [] for k in rows}
        cpu: dict[str, list[float]] = {k: [] for k in rows}
        server_cpu: dict[str, list[float]] = {k: [] for k in rows}

        requests: dict[str, dict[str, float]] = {}
        profiler: Any = None
        if args.profile is not None:
            import pyinstrument

            profiler = pyinstrument.Profiler(interval=0.0005)
        order = list(rows)
        for r in range(args.rounds):
            for name in order[r % len(order) :] + order[: r % len(order)]:
                fn, n = rows[name]
                counts.clear()
                if profiler is not None and name == "continue":
                    profiler.start()
                s0 = redis_cpu_seconds(client)
                c0, t0 = time.process_time(), time.perf_counter()
                fn(n)
                t1, c1 = time.perf_counter(), time.process_time()
                server_cpu[name].append((redis_cpu_seconds(client) - s0) / n * 1e6)
                if profiler is not None and name == "continue":
                    profiler.stop()
                wall[name].append((t1 - t0) / n * 1e6)
                cpu[name].append((c1 - c0) / n * 1e6)
                requests[name] = {k: v / n for k, v in sorted(counts.items())}
        client.close()

    def summary(values: list[float]) -> dict[str, float]:
        return {
            "median": statistics.median(values),
            "min": min(values),
            "max": max(values),
        }

    result: dict[str, Any] = {
        "probe": "bench.threadsprobe",
        "tree": str(tree),
        "commit": _git(tree),
        "rounds": args.rounds,
        "ops": args.ops,
        "prefill": args.prefill,
        "load_average": list(Path("/proc/loadavg").read_text().split()[:3]),
        "rows": {
            k: {
                "wall_us": summary(wall[k]),
                "cpu_us": summary(cpu[k]),
                "server_cpu_us": summary(server_cpu[k]),
                "requests": requests[k],
            }
            for k in rows
        },
        "continue_vs_raw": summary(
            [w_raw / w_c for w_raw, w_c in zip(wall["raw"], wall["continue"], strict=True)]
        ),
        # client + server CPU per op, which the machine's load inflates far less than wall
        "continue_vs_raw_cpu": summary(
            [
                (cr + sr) / (cc + sc)
                for cr, sr, cc, sc in zip(
                    cpu["raw"],
                    server_cpu["raw"],
                    cpu["continue"],
                    server_cpu["continue"],
                    strict=True,
                )
            ]
        ),
    }
    for k in rows:
        row = result["rows"][k]
        w, c, sc = row["wall_us"], row["cpu_us"], row["server_cpu_us"]
        print(
            f"{k:9s} wall {w['median']:9.0f} us [{w['min']:.0f}-{w['max']:.0f}]"
            f"  client cpu {c['median']:7.0f} us  server cpu {sc['median']:6.0f} us"
            f"  requests/op {row['requests']}"
        )
    for key in ("continue_vs_raw", "continue_vs_raw_cpu"):
        ratio = result[key]
        print(
            f"{key}: x{ratio['median']:.3f} [{ratio['min']:.3f}-{ratio['max']:.3f}]"
            f" ({tree}, {result['commit']})"
        )
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    if profiler is not None:
        assert args.profile is not None
        args.profile.write_text(profiler.output_text(unicode=False, color=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
