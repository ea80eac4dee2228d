"""Redis CPU per script call against the client work between calls.

``python -m bench.pacing [--rounds K] [--ops N] [--gaps 0,100,200] [--out FILE|DIR] [--quick]``

On a private ``redis-server`` (free loopback port, temp dir, stopped by pid), rows in an
order that rotates each round, ``N`` calls each, Redis CPU per call read from ``INFO
commandstats`` (``EVALSHA``'s usec over its calls, the commands a script runs included):

* ``append.gap<G>``: memtier's ``append_turn``, its ARGV prepared before the row (every
  call stores a new turn in one of 1,000 sessions), sent from a pre-encoded socket, one
  round trip each, with ``G`` us of Python work (a loop over a dict, bounded by the
  clock) after each reply;
* ``minimal.gap<G>``: the minimal script (``bench/minimal_append-4.lua``, the append
  targets' baseline) the same way;
* ``append.store``: ``store.append`` as it is: memtier's own client work is the gap.

Then per round ``ratio.gap<G> = append.gap<G> / minimal.gap<G>``: the two scripts' cost
at the same pacing.  Why: the "Redis CPU per append" target divides memtier's append, paced
by memtier's client, by the minimal script, paced by redis-py's; on this shared VM a
server that waited longer for the next call runs it slower (docs/performance.md,
"Redis CPU per call and the pacing").  This says how much of the target's ratio is the
scripts and how much the pacing.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.framework import command_stats
from bench.probe import exit_on_sigterm, machine_meta, parse_round_args, spread, write_json
from bench.server import BenchRedis
from bench.workloads import (
    MINIMAL_SCRIPT,
    Baselines,
    KeyPool,
    RawSocket,
    _resp,
    bench_config,
    chat_text,
    prepared_appends,
)
from memtier import AvatarMessage, ConversationStore

__all__ = ["main"]

SESSIONS = 1000


def busy(us: float) -> None:
    """About ``us`` microseconds of Python work: dict stores and string building, the kind
    of work a client does between two replies (bounded by the clock and by a count)."""
    if us <= 0:
        return
    end = time.perf_counter() + us / 1e6
    scratch: dict[str, list[Any]] = {}
    for i in range(1_000_000):
        scratch[str(i % 4096)] = [i, str(i) * 3]
        if i % 16 == 0 and time.perf_counter() >= end:
            return


def _per_call(client: Any, send: Callable[[], None]) -> tuple[float, int]:
    """Redis CPU us per ``EVALSHA`` while ``send()`` runs, and how many were counted."""
    calls0, usec0 = command_stats(client).get("evalsha", (0, 0))
    send()
    calls1, usec1 = command_stats(client).get("evalsha", (0, 0))
    if calls1 <= calls0:
        raise RuntimeError("no EVALSHA was counted")
    return (usec1 - usec0) / (calls1 - calls0), calls1 - calls0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pacing")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--ops", type=int, default=2000)
    p.add_argument("--gaps", default="0,100,200", help="us of client work after each reply")
    args = parse_round_args(p, argv, "pacing")
    gaps = [int(g) for g in args.gaps.split(",")]
    if any(not 0 <= g <= 10_000 for g in gaps):
        raise SystemExit("--gaps: each between 0 and 10,000 us")
    exit_on_sigterm()

    text = chat_text(300)
    with BenchRedis() as server:
        client = server.client()
        meta = machine_meta(client) | {"server_pid": server.pid()}
        store = ConversationStore(client, bench_config("pacing"))
        pool = KeyPool(81, SESSIONS)
        for key in pool.keys:  # every append below goes to an existing session
            store.append(key, AvatarMessage(text=text))
        client.script_load(store.scripts["append_turn"].source)
        minimal_sha = str(client.script_load(MINIMAL_SCRIPT.read_text(encoding="utf-8")))
        raw = RawSocket(server.port)
        seq = {"minimal": 0}

        def appends(n: int) -> list[bytes]:
            return prepared_appends(store, pool, text, n)

        def minimals(n: int) -> list[bytes]:
            i = seq["minimal"]
            seq["minimal"] = i + n
            return [
                _resp(
                    "EVALSHA", minimal_sha, 4, *Baselines.append_args("pm", j % SESSIONS), text, "m"
                )
                for j in range(i, i + n)
            ]

        def paced(requests: list[bytes], gap: int) -> Callable[[], None]:
            def send() -> None:
                for request in requests:
                    reply = raw.call(request)
                    if isinstance(reply, Exception):
                        raise RuntimeError(f"a prepared call was refused: {reply}")
                    busy(gap)

            return send

        def store_row() -> None:
            for _ in range(args.ops):
                store.append(pool.next(), AvatarMessage(text=text))

        rows: list[str] = [f"{kind}.gap{g}" for g in gaps for kind in ("append", "minimal")]
        rows.append("append.store")
        us: dict[str, list[float]] = {name: [] for name in rows}
        counted: dict[str, list[int]] = {name: [] for name in rows}  # EVALSHA calls per round
        ratios: dict[str, list[float]] = {f"ratio.gap{g}": [] for g in gaps}
        for rnd in range(args.rounds):
            shift = rnd % len(rows)
            for name in rows[shift:] + rows[:shift]:
                if name == "append.store":
                    send: Callable[[], None] = store_row
                else:
                    kind, gap = name.split(".gap")
                    build = appends if kind == "append" else minimals
                    send = paced(build(args.ops), int(gap))  # prepared before the count
                per_call, calls = _per_call(client, send)
                us[name].append(per_call)
                counted[name].append(calls)
            for g in gaps:
                ratios[f"ratio.gap{g}"].append(us[f"append.gap{g}"][-1] / us[f"minimal.gap{g}"][-1])
        raw.close()
        store.close()  # and the client it was given

    result = {
        "meta": meta,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "redis_us_per_call": {name: spread(v) for name, v in us.items()},
        "ratio": {name: spread(v) for name, v in ratios.items()},
        "rounds": {"redis_us_per_call": us, "ratio": ratios, "evalsha_calls": counted},
    }
    write_json(args.out, result)
    print(f"Redis CPU us per EVALSHA, median [min-max] of {args.rounds} rounds:")
    for name, v in (us | ratios).items():
        s = spread(v)
        print(f"  {name:16s} {s['median']:7.2f} [{s['min']:.2f}-{s['max']:.2f}]")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
