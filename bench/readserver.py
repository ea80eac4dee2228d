"""Redis server time of one context read: the transaction against the former script.

``python -m bench.readserver [--quick] [--reads N] [--repeats K] [--out DIR]``

On a private ``redis-server`` (free loopback port, temp dir, stopped by pid): 16
sessions of 100 turns at 300 B and at 4 KiB, then per repeat, interleaved, ``N`` reads of
the last 20 turns each way through memtier's executor:

* ``transaction`` -- the read with its session check as the ``context_head`` script:
  ``MULTI``, ``context_head``, ``LRANGE``, ``EXEC`` (lean, packed; what ``context()``
  sends through redis-py's pipelines, and sent on every path before the plain form);
* ``read_context`` -- the former read: one ``EVALSHA`` whose Lua copies the 20 records
  into its reply;
* ``plain`` -- what ``context()`` sends on the lean paths: the same reads with no Lua
  at all, ``MULTI``, ``HMGET`` of the session's head fields, ``TIME``, ``HGET`` of the
  partition's clock high-water mark, ``LRANGE``, ``EXEC`` (the expiry verdict is the
  client's, from values read atomically: :mod:`memtier.memory.contexthead`; redis-py's
  cluster pipeline refuses ``TIME``, so its paths keep the script).  Sent through the
  store's executor.

Figure: ``INFO commandstats`` microseconds per read of the *outer* command (``EXEC``
includes the script and the ``LRANGE`` it ran; ``EVALSHA`` of ``read_context`` includes
its inner commands), median [min-max] over the repeats, with the inner commands'
share.  The client's speed does not enter.  On a loaded machine the means carry the
calls during which Redis was preempted: compare the two in the same repeat.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench.probe import git_commit
from bench.server import BenchRedis
from bench.workloads import bench_config, chat_text, populate
from memtier import ConversationKey, ConversationStore
from memtier.engine import Transaction
from memtier.memory.core import MemoryCore

SIZES = (300, 4096)
SESSIONS = 16
TURNS = 100
LIMIT = 20


def _stats(admin: Any) -> dict[str, tuple[int, int]]:
    raw = admin.info("commandstats")
    return {
        str(name).removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
        for name, v in raw.items()
    }


def _delta(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> Any:
    out = {}
    for name, (calls, usec) in after.items():
        c0, u0 = before.get(name, (0, 0))
        if calls - c0 > 0 and name != "info":
            out[name] = (calls - c0, usec - u0)
    return out


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
    }


def _sent(
    execute: Callable[[Any], Any], request: Callable[[ConversationKey], Any]
) -> Callable[[ConversationKey], Any]:
    """A read of one key: its request built and sent through the store's executor."""
    return lambda key: execute(request(key))


def _script_form(core: MemoryCore, key: ConversationKey) -> Transaction:
    """The context read with its session check as the ``context_head`` script."""
    return dataclasses.replace(core.context_call(key, limit=LIMIT), plain=None)


def measure(server: BenchRedis, reads: int, repeats: int) -> dict[str, Any]:
    client = server.client()
    admin = server.client()
    out: dict[str, Any] = {}
    for size in SIZES:
        store = ConversationStore(client, bench_config(f"readserver{size}"))
        keys = [ConversationKey(uuid.UUID(int=size * 100 + n), "public") for n in range(SESSIONS)]
        assert populate(store, keys, chat_text(size), turns=TURNS) == 0
        core, execute = store.core, store.executor.execute
        for script in ("context_head", "read_context"):
            client.script_load(store.scripts[script].source)
        ways: dict[str, tuple[Callable[[ConversationKey], Any], str]] = {
            "transaction": (_sent(execute, partial(_script_form, core)), "exec"),
            "read_context": (
                _sent(execute, partial(core.script_context_call, limit=LIMIT)),
                "evalsha",
            ),
            "plain": (_sent(execute, partial(core.context_call, limit=LIMIT)), "exec"),
        }
        runs: dict[str, list[dict[str, tuple[int, int]]]] = {name: [] for name in ways}
        loads: list[float] = []
        for repeat in range(repeats):
            order = list(ways)[repeat % len(ways) :] + list(ways)[: repeat % len(ways)]
            for name in order:
                read, _outer = ways[name]
                before = _stats(admin)
                for i in range(reads):
                    read(keys[i % SESSIONS])
                runs[name].append(_delta(before, _stats(admin)))
            loads.append(os.getloadavg()[0])
        result: dict[str, Any] = {"load1_per_repeat": loads}
        for name, (_read, outer) in ways.items():
            per_read = [run[outer][1] / reads for run in runs[name]]
            commands = sorted({c for run in runs[name] for c in run})
            result[name] = {
                "outer_command": outer,
                "us_per_read": _summary(per_read),
                "by_command_us_per_read": {
                    c: _summary([run.get(c, (0, 0))[1] / reads for run in runs[name]])
                    for c in commands
                },
                "calls_per_read": {c: runs[name][0][c][0] / reads for c in commands},
            }
        paired = [
            t["exec"][1] / r["evalsha"][1]
            for t, r in zip(runs["transaction"], runs["read_context"], strict=True)
        ]
        result["transaction_over_read_context"] = _summary(paired)
        result["plain_over_transaction"] = _summary(
            [
                p["exec"][1] / t["exec"][1]
                for p, t in zip(runs["plain"], runs["transaction"], strict=True)
            ]
        )
        out[f"{size}B"] = result
    client.close()
    admin.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="seconds (a smoke run)")
    parser.add_argument("--reads", type=int, default=2000, help="reads per way per repeat")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    reads, repeats = (100, 2) if args.quick else (args.reads, args.repeats)
    started = time.time()
    with BenchRedis() as server:
        data = {
            "meta": {
                "tool": "bench.readserver",
                "commit": git_commit(),
                "server_pid": server.pid(),
                "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
                "reads": reads,
                "repeats": repeats,
                "cpus": os.cpu_count(),
                "redis_server": server.client().info("server")["redis_version"],
            },
            "sizes": measure(server, reads, repeats),
        }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / ("readserver-quick.json" if args.quick else "readtx-server-read.json")
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    for size, result in data["sizes"].items():
        t, r = result["transaction"]["us_per_read"], result["read_context"]["us_per_read"]
        ratio = result["transaction_over_read_context"]
        print(
            f"{size}: transaction (EXEC) {t['median']} [{t['min']}-{t['max']}] us,"
            f" read_context (EVALSHA) {r['median']} [{r['min']}-{r['max']}] us,"
            f" ratio x{ratio['median']} [{ratio['min']}-{ratio['max']}]"
        )
        p, pr = result["plain"]["us_per_read"], result["plain_over_transaction"]
        print(
            f"{size}: plain, no Lua (EXEC) {p['median']} [{p['min']}-{p['max']}] us,"
            f" x{pr['median']} [{pr['min']}-{pr['max']}] of the transaction"
        )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
