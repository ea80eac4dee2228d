"""The client's instructions per operation, counted by callgrind: a figure the load of this
shared machine cannot move.

``python -m bench.icount [--rows a,b] [--ops N] [--rounds K] [--cycles] [--out FILE|DIR]
[--quick]``

Client CPU time per operation varies by 10-20 % between runs here (other engineers'
suites share the 2 cores; docs/performance.md, "Client CPU is not additive"), so a change
worth 5 % needs many alternating runs to show.  ``valgrind --tool=callgrind`` counts the
instructions a process executes instead: the same code and inputs give the same count
whatever else the machine does, up to a small spread (a few % for the asyncio rows at
the default ``--ops``: the event loop's work per call depends on when replies arrive;
docs/performance.md gives the measured spreads).  It counts user-space instructions
only -- not the kernel's work in the syscalls, not time spent waiting, not cache misses
-- so it measures the client's own work, the part memtier's code decides.

Instructions are not time: a tight C loop (hiredis formatting argument headers with
``sprintf``) retires several a cycle, the interpreter's branchy, cache-missing work far
fewer, so a change that trades C work for Python work must be timed as well (the
twenty-fifth round's pack plan: -36,500 instructions per sync append, about 1 us).
``--cycles`` adds callgrind's cache and branch simulation and reports KCachegrind's cycle
estimate (:func:`cycle_estimate`), which weighs misses but not instruction-level
parallelism either.

For each row, a child Python process runs under callgrind against a private
``redis-server`` (free loopback port, temp dir, stopped by pid): it sets up the row's
sessions, then performs ``n`` operations, in a namespace no run used before (so every
run starts from the same state, whatever ran on the server earlier).  It runs twice, with
``n = ops / 5`` and ``n = ops``; the difference of the two totals over the difference of
``n`` is the instructions per operation -- start-up, imports and set-up cancel out.
Rows:

* ``append`` / ``context``: ``ConversationStore.append`` (300 B) / ``context(limit=20)``
  on a plain ``redis.Redis`` client;
* ``aio.append`` / ``aio.context``: the same on ``AsyncConversationStore`` over
  ``redis.asyncio.Redis``, one call at a time;
* ``items4``: the OpenAI Agents adapter's ``MemtierSession.add_items`` of one agent
  turn's four items (``bench.turnitems``), asyncio;
* ``raw`` / ``raw.read``: the append and read targets' baselines on the same client, as
  ``bench.workloads`` runs them -- redis-py's ``evalsha`` of the minimal script
  (``bench/minimal_append-4.lua``), ``lrange`` of the last 20 + ``orjson.loads`` each --
  so memtier's rows can be read as multiples of the client work the targets compare to.

A/B of two trees: run it in each tree's own directory (``python -m`` imports the memtier
of the current directory); one run each separates changes well past the
rows' spread; ``--rounds`` repeats each row for the asyncio ones.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import redis
import redis.asyncio

from bench.probe import exit_on_sigterm, loadavg, machine_meta, parse_round_args, write_json
from bench.server import HOST, BenchRedis
from bench.turnitems import turn_items
from bench.workloads import MINIMAL_SCRIPT, KeyPool, bench_config, chat_text
from memtier import AsyncConversationStore, AvatarMessage, ConversationStore

__all__ = ["ROWS", "main"]

ROWS = ("append", "context", "aio.append", "aio.context", "items4", "raw", "raw.read")
SESSIONS = 100  # each holds TURNS turns before the measured operations begin
TURNS = 25  # (context reads 20 of them)


def _sync_child(row: str, port: int, n: int, namespace: str, sessions: int) -> None:
    client = redis.Redis(host=HOST, port=port)
    store = ConversationStore(client, bench_config(namespace))
    keys, text = KeyPool(11, sessions), chat_text(300)
    for _ in range(sessions * TURNS):
        store.append(keys.next(), AvatarMessage(text=text))
    for _ in range(n):
        if row == "append":
            store.append(keys.next(), AvatarMessage(text=text))
        else:
            store.context(keys.next(), limit=20)
    client.close()


async def _async_child(row: str, port: int, n: int, namespace: str, count: int) -> None:
    client = redis.asyncio.Redis(host=HOST, port=port)
    store = AsyncConversationStore(client, bench_config(namespace))
    keys, text = KeyPool(11, count), chat_text(300)
    for _ in range(count * TURNS):
        await store.append(keys.next(), AvatarMessage(text=text))
    if row == "items4":
        from memtier.integrations.openai_agents import MemtierSession

        sessions = [MemtierSession(f"ic-{i}", store) for i in range(count)]
        for i in range(n):
            items = turn_items(text, f"c-{i}")
            await sessions[i % len(sessions)].add_items(items)
    else:
        for _ in range(n):
            if row == "aio.append":
                await store.append(keys.next(), AvatarMessage(text=text))
            else:
                await store.context(keys.next(), limit=20)
    await client.aclose()


def _raw_child(row: str, port: int, n: int, namespace: str, sessions: int) -> None:
    """The targets' baselines, as ``bench.workloads`` runs them: redis-py's ``evalsha`` of
    the minimal script (``raw``), ``LRANGE`` of the last 20 + orjson (``raw.read``)."""
    client = redis.Redis(host=HOST, port=port)
    text = chat_text(300)
    if row == "raw":
        sha = client.script_load(MINIMAL_SCRIPT.read_text(encoding="utf-8"))
        tag = "{" + namespace + "}"
        for i in range(n):
            sid = f"{i % sessions:012d}"
            client.evalsha(sha, 4, f"{tag}:q:{sid}", f"{tag}:t:{sid}", f"{tag}:meta",
                           f"{tag}:lru", text, f"m{i}")  # fmt: skip
    else:
        entry = orjson.dumps({"role": "user", "content": text})
        keys = [f"{{{namespace}}}:r:{i:012d}" for i in range(sessions)]
        for key in keys:
            client.rpush(key, *([entry] * TURNS))
        loads = orjson.loads
        for i in range(n):
            items = [loads(x) for x in client.lrange(keys[i % sessions], -20, -1)]
            assert len(items) == 20
    client.close()


def _child(row: str, port: int, n: int, namespace: str, sessions: int) -> int:
    if row in ("raw", "raw.read"):
        _raw_child(row, port, n, namespace, sessions)
    elif row in ("append", "context"):
        _sync_child(row, port, n, namespace, sessions)
    else:
        asyncio.run(_async_child(row, port, n, namespace, sessions))
    return 0


_TOTAL = re.compile(rb"^(?:summary|totals):\s+([\d ]+)$", re.M)
_EVENTS = re.compile(rb"^events:\s+(.+)$", re.M)


def cycle_estimate(events: dict[str, int]) -> int:
    """KCachegrind's cycle estimate from callgrind's simulated events: each instruction
    one cycle, a mispredicted branch or a first-level miss 10 more, a last-level miss
    100 more."""
    branch_misses = events.get("Bcm", 0) + events.get("Bim", 0)
    l1_misses = events.get("I1mr", 0) + events.get("D1mr", 0) + events.get("D1mw", 0)
    ll_misses = events.get("ILmr", 0) + events.get("DLmr", 0) + events.get("DLmw", 0)
    return events["Ir"] + 10 * (branch_misses + l1_misses) + 100 * ll_misses


def _count(
    row: str,
    port: int,
    n: int,
    namespace: str,
    sessions: int,
    workdir: Path,
    simulate: bool = False,
) -> dict[str, int]:
    """The event totals callgrind counted in one child run: ``Ir`` (instructions), and
    with ``simulate`` its cache and branch simulation's misses too."""
    out = workdir / f"callgrind.{namespace}"
    cmd = [
        "valgrind",
        "--tool=callgrind",
        *(["--cache-sim=yes", "--branch-sim=yes"] if simulate else []),
        f"--callgrind-out-file={out}",
        sys.executable,
        "-m",
        "bench.icount",
        "--child",
        row,
        "--port",
        str(port),
        "--n",
        str(n),
        "--namespace",
        namespace,
        "--sessions",
        str(sessions),
    ]
    proc = subprocess.run(cmd, capture_output=True, timeout=3600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{row}: the callgrind run failed: {proc.stderr[-2000:]!r}")
    data = out.read_bytes()
    out.unlink()
    names, totals = _EVENTS.search(data), _TOTAL.search(data)
    if names is None or totals is None:
        raise RuntimeError(f"{row}: no event totals in callgrind's output")
    counts = dict(
        zip(names.group(1).decode().split(), map(int, totals.group(1).split()), strict=False)
    )
    if "Ir" not in counts:
        raise RuntimeError(f"{row}: no instruction total in callgrind's output")
    return counts


def _valgrind_version() -> str:
    proc = subprocess.run(["valgrind", "--version"], capture_output=True, text=True, check=True)
    return proc.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.icount", description=__doc__)
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated, of: " + ", ".join(ROWS))
    p.add_argument("--ops", type=int, default=1000, help="operations of the longer run")
    p.add_argument("--rounds", type=int, default=1, help="repeats of each row (counts repeat)")
    p.add_argument(
        "--cycles",
        action="store_true",
        help="also simulate caches and branches (about 3x slower): cycles estimated per op",
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    p.add_argument("--namespace", help=argparse.SUPPRESS)
    p.add_argument("--sessions", type=int, default=SESSIONS, help=argparse.SUPPRESS)
    if "--child" in (argv if argv is not None else sys.argv[1:]):
        args = p.parse_args(argv)
        return _child(args.child, args.port, args.n, args.namespace, args.sessions)
    args = parse_round_args(p, argv, "icount")
    if args.quick:  # what the smoke test runs: one row, few sessions
        args.rows, args.ops, args.sessions = "aio.append", 50, 4
    rows = [r for r in args.rows.split(",") if r]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        p.error(f"unknown rows: {', '.join(unknown)}")
    if shutil.which("valgrind") is None:
        p.error("valgrind is not installed (Debian: apt-get install valgrind)")
    exit_on_sigterm()
    short = max(1, args.ops // 5)
    load_before = loadavg()
    started = time.time()
    per_op: dict[str, list[float]] = {row: [] for row in rows}
    cycles: dict[str, list[float]] = {row: [] for row in rows}
    run_id = secrets.token_hex(4)
    with BenchRedis() as server, tempfile.TemporaryDirectory(prefix="icount-") as tmp:
        meta = machine_meta(redis.Redis(host=HOST, port=server.port)) | {
            "server_pid": server.pid(),
            "valgrind": _valgrind_version(),
        }
        for k in range(args.rounds):
            for row in rows:
                # A namespace no run used before (same length every time: key lengths
                # enter the count), so each run starts on empty sessions.
                tag = f"ic{ROWS.index(row)}{run_id}{k:02d}"
                sim = args.cycles
                a = _count(row, server.port, short, tag + "s", args.sessions, Path(tmp), sim)
                b = _count(row, server.port, args.ops, tag + "l", args.sessions, Path(tmp), sim)
                per_op[row].append((b["Ir"] - a["Ir"]) / (args.ops - short))
                line = f"  {row:12} round {k + 1}: {per_op[row][-1]:,.0f} instructions/op"
                if sim:
                    estimate = cycle_estimate(b) - cycle_estimate(a)
                    cycles[row].append(estimate / (args.ops - short))
                    line += f", {cycles[row][-1]:,.0f} cycles/op (estimated)"
                print(line, flush=True)
    summary = {row: statistics.median(v) for row, v in per_op.items()}
    print("\n| row | instructions per op (median) | rounds |\n|---|---:|---|")
    for row in rows:
        each = ", ".join(f"{v:,.0f}" for v in per_op[row])
        print(f"| {row} | {summary[row]:,.0f} | {each} |")
    if args.cycles:
        print("\n| row | estimated cycles per op (median) | rounds |\n|---|---:|---|")
        for row in rows:
            each = ", ".join(f"{v:,.0f}" for v in cycles[row])
            print(f"| {row} | {statistics.median(cycles[row]):,.0f} | {each} |")
    data: dict[str, Any] = {
        "probe": "icount",
        "ops": [short, args.ops],
        "seconds": round(time.time() - started, 1),
        "load_before": load_before,
        "load_after": loadavg(),
        "meta": meta,
        "instructions_per_op": per_op,
        "median": summary,
        # (--cycles) KCachegrind's estimate from the simulated misses: cycle_estimate()
        "cycles_per_op": cycles if args.cycles else None,
        "cwd": os.getcwd(),
    }
    print(f"wrote {write_json(args.out, data)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
