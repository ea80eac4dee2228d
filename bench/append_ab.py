"""A/B of two ``append_turn`` versions on one server: Redis time per call, interleaved.

``python -m bench.append_ab --old-source OLD.lua [--same-argv] [--calls N] [--rounds K]
[--out DIR] [--name NAME]``

``OLD.lua`` is the expanded ``append_turn`` of another tree (``store.scripts["append_turn"]
.source`` there).  By default it takes the ARGV of the version before record format 2:
``is_tool`` 0/1 at ARGV[6] and the first record format's payload ``{"k", "id", "f"}`` with
a 32-hex turn id; with ``--same-argv`` it takes exactly the ARGV this tree sends (an A/B
of two scripts with one ARGV layout).  The new version is
this tree's, with the ARGV ``MemoryCore.append_call`` builds.  Each runs on its own 1,000
sessions of 20 turns (each populated by its own script), on one private ``redis-server``
(free loopback port, temp dir, stopped by pid), in alternating batches (old, new, old,
...), so the load of a shared machine falls on both alike.  Figure per batch: the
``SLOWLOG`` trimmed mean (middle 80 %) of every ``EVALSHA``'s duration, as
``bench.bisect_append`` reads it; the minimal script runs a batch in each round too.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
from pathlib import Path
from typing import Any

import orjson

from bench.bisect_append import SLOWLOG_PER_CALL, Driver
from bench.probe import RESULTS_DIR, exit_on_sigterm, loadavg, machine_meta, write_json
from bench.server import BenchRedis
from bench.workloads import MINIMAL_SCRIPT, KeyPool, bench_config
from memtier import ConversationStore
from memtier.memory.scriptspecs import APPEND_TURN

__all__ = ["main"]


def _old_args(new: tuple[Any, ...], text: str) -> tuple[Any, ...]:
    """The previous version's ARGV for the same append: is_tool 0/1, the object payload."""
    keys, argv = list(new[:9]), list(new[9:])
    turn_id = secrets.token_hex(16)
    argv[APPEND_TURN.argv.index("turn_id")] = turn_id
    argv[APPEND_TURN.argv.index("payload")] = orjson.dumps(
        {"k": "avatar", "id": turn_id, "f": {"text": text}}
    )
    argv[APPEND_TURN.argv.index("flags")] = 0
    return (*keys, *argv)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.append_ab", description=__doc__)
    p.add_argument("--old-source", type=Path, required=True, help="expanded old append_turn")
    p.add_argument("--calls", type=int, default=3000, help="calls per batch")
    p.add_argument("--rounds", type=int, default=8, help="rounds of (old, new, minimal)")
    p.add_argument("--sessions", type=int, default=1000)
    p.add_argument("--same-argv", action="store_true", help="OLD.lua takes this tree's ARGV")
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    p.add_argument("--name", default="appendsrv-append-ab", help="output file stem")
    args = p.parse_args(argv)
    exit_on_sigterm()
    old_source = args.old_source.read_text(encoding="utf-8")
    with BenchRedis(
        extra={
            "slowlog-log-slower-than": "0",
            "slowlog-max-len": str(args.calls * SLOWLOG_PER_CALL + 200),
        }
    ) as server:
        client = server.client()
        store = ConversationStore(client, bench_config("appendab"))
        new_sha = str(client.script_load(store.scripts["append_turn"].source))
        old_sha = str(client.script_load(old_source))
        minimal_sha = str(client.script_load(MINIMAL_SCRIPT.read_text(encoding="utf-8")))
        new_driver = Driver(server, store, args.sessions)
        old_driver = Driver(server, store, args.sessions)
        old_driver.keys = KeyPool(92, args.sessions).keys
        text = new_driver.text

        def batch(driver: Driver, n: int, old: bool) -> list[tuple[Any, ...]]:
            calls = driver.calls(n)
            return [_old_args(c, text) for c in calls] if old and not args.same_argv else calls

        # 20 turns of history per session, each version its own (its own record format).
        for _ in range(20):
            new_driver.run(new_sha, 9, batch(new_driver, args.sessions, False))
            old_driver.run(old_sha, 9, batch(old_driver, args.sessions, True))
        meta = machine_meta(client)
        meta.update(
            tool="bench.append_ab",
            calls=args.calls,
            rounds=args.rounds,
            sessions=args.sessions,
            old_source=str(args.old_source),
            same_argv=args.same_argv,
        )
        runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": [], "minimal": []}
        loads = []
        for r in range(args.rounds):
            loads.append({"round": r, **loadavg()})
            order = ["old", "new", "minimal"] if r % 2 == 0 else ["new", "old", "minimal"]
            for name in order:
                if name == "minimal":
                    res = new_driver.run(minimal_sha, 4, new_driver.minimal_calls(args.calls))
                else:
                    d = old_driver if name == "old" else new_driver
                    res = d.run(
                        old_sha if name == "old" else new_sha,
                        9,
                        batch(d, args.calls, name == "old"),
                    )
                res["round"] = r
                runs[name].append(res)
            print(
                f"  round {r + 1}/{args.rounds}: "
                + ", ".join(f"{k} {runs[k][-1]['slowlog_trimmed_mean_us']:.1f}" for k in runs)
                + f" us; load {loads[-1]['load1']}",
                flush=True,
            )
        client.close()
    summary = {}
    for name, rows in runs.items():
        vals = [row["slowlog_trimmed_mean_us"] for row in rows]
        summary[name] = {
            "median": statistics.median(vals),
            "min": min(vals),
            "max": max(vals),
            "nonzero_replies": sum(row["nonzero_replies"] for row in rows),
        }
    ratio = [
        o["slowlog_trimmed_mean_us"] / n["slowlog_trimmed_mean_us"]
        for o, n in zip(runs["old"], runs["new"], strict=True)
    ]
    vs_min_old = [
        o["slowlog_trimmed_mean_us"] / m["slowlog_trimmed_mean_us"]
        for o, m in zip(runs["old"], runs["minimal"], strict=True)
    ]
    vs_min_new = [
        n["slowlog_trimmed_mean_us"] / m["slowlog_trimmed_mean_us"]
        for n, m in zip(runs["new"], runs["minimal"], strict=True)
    ]
    for label, xs in (("old/new", ratio), ("old/minimal", vs_min_old), ("new/minimal", vs_min_new)):
        summary[label] = {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}
    for k, v in summary.items():
        print(f"{k:12s} median {v['median']:.2f} [{v['min']:.2f}-{v['max']:.2f}]")
    out = write_json(
        args.out / f"{args.name}.json",
        {"meta": {**meta, "load_per_round": loads}, "summary": summary, "runs": runs},
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
