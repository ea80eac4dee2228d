"""What a threads ``continue`` costs as its thread grows (issue 12, "Threads").

``python -m bench.threadlength [--quick] [--ops N] [--rounds K] [--out DIR]``

One private ``redis-server`` (free loopback port, temp dir, stopped by pid).  A few
threads are grown stage by stage (turns per thread: 20, 300, 850; a thread holds at most
1,000 turns) with the echo runner and 300 B messages; at each stage the rows run in
interleaved rounds (``--threads`` / ``--stages`` change the threads and their lengths):

* ``continue``: ``ConversationService.continue_`` over those threads (each continue adds a
  turn, so a stage's threads grow by ``ops * rounds / threads`` turns while measured);
* ``raw``: the raw minimal script (``bench/minimal_append-4.lua``) by redis-py's
  ``evalsha``, the threads target's baseline, same rounds.

Per row: wall us/op, this process's CPU us/op (user + system) and redis-server's CPU
us/op (``INFO cpu``).  The default thread count keeps every path in the service's
history cache (8 MiB in all), so what grows is the per-continue work along the path, not
re-sent history; with more threads than the cache holds (``--threads 30 --stages
20,500``), the last stage shows what a thrashing cache costs.  The slopes (us per 1,000
entries between the first and the last stage) are what a long thread adds to every one
of its turns: the client's walk of its history cache and ``run_claim``'s work on the
path cache's text (before the sixteenth round of issue 12).
"""

from __future__ import annotations

import argparse
import resource
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
from bench.workloads import MINIMAL_SCRIPT, Baselines, bench_config, chat_text
from memtier.limits import HISTORY_CACHE_BYTES
from memtier.threads.models import Ownership
from memtier.threads.service import ConversationService

__all__ = ["main"]

THREADS = 6  # x 1,900 entries x ~500 B: within the history cache's 8 MiB
STAGES = (20, 300, 850)  # turns per thread before each stage is measured
QUICK_STAGES = (5, 40)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    first_line = __doc__.split("\n")[0]
    p = argparse.ArgumentParser(prog="python -m bench.threadlength", description=first_line)
    p.add_argument("--quick", action="store_true", help="seconds: what the smoke test runs")
    p.add_argument("--ops", type=int, default=0, help="calls per row per round (120)")
    p.add_argument("--rounds", type=int, default=0, help="rounds per stage (5)")
    p.add_argument(
        "--threads",
        type=int,
        default=THREADS,
        help=f"threads grown ({THREADS}: within the history cache; more shows it thrash)",
    )
    p.add_argument(
        "--cache-mib",
        type=int,
        default=0,
        help="the service's history cache in MiB ([threads] history_cache_bytes; 0: default)",
    )
    p.add_argument(
        "--stages",
        type=lambda text: tuple(int(t) for t in text.split(",")),
        default=(),
        help="turns per thread before each stage, comma-separated (20,300,850)",
    )
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for the JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    exit_on_sigterm()
    ops = args.ops or (24 if args.quick else 120)
    rounds = args.rounds or (2 if args.quick else 5)
    stages = args.stages or (QUICK_STAGES if args.quick else STAGES)
    if len(stages) < 2 or list(stages) != sorted(set(stages)) or stages[-1] > 900:
        raise SystemExit("--stages: at least two, increasing, at most 900 turns")
    text = chat_text(300)
    owner = Ownership("bench", "user1")
    result: dict[str, Any] = {}
    with BenchRedis() as server:
        client = server.client()
        meta = machine_meta(client)
        meta.update(
            tool="bench.threadlength",
            ops=ops,
            rounds=rounds,
            threads=args.threads,
            history_cache_bytes=(
                args.cache_mib * 2**20 if args.cache_mib else int(HISTORY_CACHE_BYTES.default)
            ),
            stages=list(stages),
            server_pid=server.pid(),
        )
        sha = client.script_load(MINIMAL_SCRIPT.read_text())
        cache = {"history_cache_bytes": args.cache_mib * 2**20} if args.cache_mib else {}
        service = ConversationService(client, bench_config("blength", threads=cache))
        pool = [service.create(owner, title=f"t{i}").id for i in range(args.threads)]
        turns = 0
        state = {"c": 0, "raw": 0}

        def continue_(n: int) -> None:
            i = state["c"]
            for j in range(i, i + n):
                service.continue_(owner, pool[j % args.threads], text)
            state["c"] = i + n

        def raw(n: int) -> None:
            i = state["raw"]
            for j in range(i, i + n):
                client.evalsha(sha, 4, *Baselines.append_args("ba", j), text, "m")
            state["raw"] = i + n

        rows: dict[str, Callable[[int], None]] = {"continue": continue_, "raw": raw}
        stage_rows: list[dict[str, Any]] = []
        for target in stages:
            while turns < target:  # grow every thread to the stage's length
                for tid in pool:
                    service.continue_(owner, tid, text)
                turns += 1
            entries = 2 * turns
            per: dict[str, dict[str, list[float]]] = {
                k: {"wall_us": [], "cpu_us": [], "server_cpu_us": []} for k in rows
            }
            loads = []
            names = list(rows)
            for r in range(rounds):
                loads.append({"round": r, **loadavg()})
                for name in names[r % 2 :] + names[: r % 2]:
                    s0, c0, t0 = redis_cpu_seconds(client), time.process_time(), time.perf_counter()
                    rows[name](ops)
                    t1, c1 = time.perf_counter(), time.process_time()
                    per[name]["wall_us"].append((t1 - t0) / ops * 1e6)
                    per[name]["cpu_us"].append((c1 - c0) / ops * 1e6)
                    per[name]["server_cpu_us"].append((redis_cpu_seconds(client) - s0) / ops * 1e6)
            turns += ops * rounds // args.threads
            stage_rows.append(
                {
                    "turns_per_thread_at_start": target,
                    "entries_per_thread_at_start": entries,
                    "rows": {k: {m: spread(v) for m, v in per[k].items()} for k in rows},
                    "continue_vs_raw": spread(
                        [
                            w_raw / w_c
                            for w_raw, w_c in zip(
                                per["raw"]["wall_us"], per["continue"]["wall_us"], strict=True
                            )
                        ]
                    ),
                    "load": loads,
                }
            )
            c = stage_rows[-1]["rows"]["continue"]
            print(
                f"{entries:5d} entries/thread: continue wall {fmt(c['wall_us'])} us,"
                f" client cpu {fmt(c['cpu_us'])} us, redis cpu {fmt(c['server_cpu_us'])} us;"
                f" vs raw x{stage_rows[-1]['continue_vs_raw']['median']:.3f}"
            )
        service.close()
        client.close()
    # Linux reports KiB: what the process's heap grew to, with the history cache in it.
    meta["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"max RSS of this process {meta['max_rss_mib']:.0f} MiB")
    first, last = stage_rows[0], stage_rows[-1]
    span = (last["entries_per_thread_at_start"] - first["entries_per_thread_at_start"]) / 1000
    for metric in ("cpu_us", "server_cpu_us"):
        grew = (
            last["rows"]["continue"][metric]["median"] - first["rows"]["continue"][metric]["median"]
        )
        result[f"{metric}_per_1000_entries"] = grew / span
        print(f"continue {metric} grows {grew / span:.1f} us per 1,000 entries of its thread")
    tag = "-quick" if args.quick else ""
    path = write_json(
        args.out / f"threadlength{tag}.json",
        {
            "meta": meta,
            "unit": "us per call (wall; this process's CPU; redis-server's CPU)",
            "stages": stage_rows,
            **result,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
