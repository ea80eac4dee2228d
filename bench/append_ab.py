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
``bench.bisect_append`` reads it; the minimal script runs a batch in each round too, and
so does the floor script (``bench/floor_append-6.lua``: the commands an append requires,
no Lua logic) on its own 1,000 sessions.  ``--figure commandstats`` reads ``INFO
commandstats`` (``EVALSHA`` usec per call, its commands included) with SLOWLOG off instead:
SLOWLOG at threshold 0 also logs every command a script runs, which adds a cost per
command to every script alike (``bench.bisect_append``'s note).
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
from bench.workloads import FLOOR_APPEND_SCRIPT, MINIMAL_SCRIPT, KeyPool, bench_config
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


def _floor_calls(n: int, sessions: int, start: int, text: str) -> list[tuple[Any, ...]]:
    """Calls of the floor script: the same 300 B record, fresh turn ids, own sessions."""
    out = []
    record = f"1|1764547200000||{len(text)}|0v1|" + text
    for i in range(start, start + n):
        sid = f"{i % sessions:012d}"
        out.append(
            (
                *(f"{{bf}}:{kind}:{sid}" for kind in ("s", "t", "i")),
                "{bf}:lru",
                "{bf}:ix",
                "{bf}:meta",
                secrets.token_urlsafe(12),
                record,
                f"m{sid}",
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.append_ab", description=__doc__)
    p.add_argument("--old-source", type=Path, required=True, help="expanded old append_turn")
    p.add_argument("--calls", type=int, default=3000, help="calls per batch")
    p.add_argument("--rounds", type=int, default=8, help="rounds of (old, new, minimal)")
    p.add_argument("--sessions", type=int, default=1000)
    p.add_argument("--same-argv", action="store_true", help="OLD.lua takes this tree's ARGV")
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    p.add_argument("--name", default="appendsrv-append-ab", help="output file stem")
    p.add_argument(
        "--figure",
        choices=("slowlog", "commandstats"),
        default="slowlog",
        help="per-call figure: SLOWLOG trimmed mean, or INFO commandstats mean (SLOWLOG off)",
    )
    args = p.parse_args(argv)
    exit_on_sigterm()
    old_source = args.old_source.read_text(encoding="utf-8")
    figure = "slowlog_trimmed_mean_us" if args.figure == "slowlog" else "usec_per_call"
    slowlog = {
        "slowlog-log-slower-than": "0" if args.figure == "slowlog" else "-1",
        "slowlog-max-len": str(args.calls * SLOWLOG_PER_CALL + 200),
    }
    with BenchRedis(extra=slowlog) as server:
        client = server.client()
        store = ConversationStore(client, bench_config("appendab"))
        new_sha = str(client.script_load(store.scripts["append_turn"].source))
        old_sha = str(client.script_load(old_source))
        minimal_sha = str(client.script_load(MINIMAL_SCRIPT.read_text(encoding="utf-8")))
        floor_sha = str(client.script_load(FLOOR_APPEND_SCRIPT.read_text(encoding="utf-8")))
        floor_i = 0
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
            new_driver.run(floor_sha, 6, _floor_calls(args.sessions, args.sessions, 0, text))
        meta = machine_meta(client)
        meta.update(
            tool="bench.append_ab",
            calls=args.calls,
            rounds=args.rounds,
            sessions=args.sessions,
            old_source=str(args.old_source),
            same_argv=args.same_argv,
            figure=figure,
        )
        runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": [], "minimal": [], "floor": []}
        loads = []
        for r in range(args.rounds):
            loads.append({"round": r, **loadavg()})
            order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
            for name in [*order, "minimal", "floor"]:
                if name == "minimal":
                    res = new_driver.run(minimal_sha, 4, new_driver.minimal_calls(args.calls))
                elif name == "floor":
                    calls = _floor_calls(args.calls, args.sessions, floor_i, text)
                    floor_i += args.calls
                    res = new_driver.run(floor_sha, 6, calls)
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
                + ", ".join(f"{k} {runs[k][-1][figure]:.1f}" for k in runs)
                + f" us; load {loads[-1]['load1']}",
                flush=True,
            )
        client.close()
    summary = {}
    for name, rows in runs.items():
        vals = [row[figure] for row in rows]
        summary[name] = {
            "median": statistics.median(vals),
            "min": min(vals),
            "max": max(vals),
            # refusals of memtier's script (the floor's reply is its seq: not counted)
            "nonzero_replies": sum(row["nonzero_replies"] for row in rows)
            if name in ("old", "new")
            else None,
        }

    def paired(a: str, b: str) -> list[float]:
        return [x[figure] / y[figure] for x, y in zip(runs[a], runs[b], strict=True)]

    pairs = {
        "old/new": paired("old", "new"),
        "old/minimal": paired("old", "minimal"),
        "new/minimal": paired("new", "minimal"),
        "floor/minimal": paired("floor", "minimal"),
        "new/floor": paired("new", "floor"),
    }
    for label, xs in pairs.items():
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
