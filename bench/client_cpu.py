"""This process's CPU time per ``store.append`` and per ``store.context(limit=20)``.

``python -m bench.client_cpu [--ops N] [--rounds K] [--out FILE|DIR] [--quick]``

On a private ``redis-server`` (free loopback port, temp dir, stopped by pid): 1,000
sessions of 20 turns of 300 B, then ``K`` rounds of ``N`` appends and ``N`` context reads
on a plain ``redis.Redis`` client (as users pass one), and the same one call at a time
on an ``AsyncConversationStore`` over a plain ``redis.asyncio.Redis`` (rows ``aio.*``).
Prints wall and process CPU time (user + system) per operation, min and median over the
rounds.  CPU time is what the
client's own work costs, which a busy shared machine inflates far less than wall time.

A/B of two trees: run it alternately in each tree's own directory (``cd <tree> &&
PYTHONPATH=<tree> python -m bench.client_cpu``: ``-m`` puts the current directory ahead
of ``PYTHONPATH``, so run from another tree it would import that tree's ``memtier``),
several times each, and compare the CPU minimums (docs/performance.md does).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import redis
import redis.asyncio

from bench.probe import loadavg, machine_meta, parse_round_args, write_json
from bench.server import HOST, BenchRedis
from bench.workloads import KeyPool, bench_config, chat_text
from memtier import AsyncConversationStore, AvatarMessage, ConversationStore

__all__ = ["main"]


def _round(store: ConversationStore, keys: KeyPool, text: str, ops: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for name in ("append", "context"):
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(ops):
            if name == "append":
                store.append(keys.next(), AvatarMessage(text=text))
            else:
                store.context(keys.next(), limit=20)
        out[f"{name}.wall"] = (time.perf_counter() - wall) / ops * 1e6
        out[f"{name}.cpu"] = (time.process_time() - cpu) / ops * 1e6
    return out


async def _round_async(
    store: AsyncConversationStore, keys: KeyPool, text: str, ops: int
) -> dict[str, float]:
    out: dict[str, float] = {}
    for name in ("append", "context"):
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(ops):
            if name == "append":
                await store.append(keys.next(), AvatarMessage(text=text))
            else:
                await store.context(keys.next(), limit=20)
        out[f"aio.{name}.wall"] = (time.perf_counter() - wall) / ops * 1e6
        out[f"aio.{name}.cpu"] = (time.process_time() - cpu) / ops * 1e6
    return out


async def _async_rounds(port: int, keys: KeyPool, text: str, ops: int, rounds: int) -> list[Any]:
    client = redis.asyncio.Redis(host=HOST, port=port)
    try:
        store = AsyncConversationStore(client, bench_config("clientcpu"))
        return [await _round_async(store, keys, text, ops) for _ in range(rounds)]
    finally:
        await client.aclose()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.client_cpu", description=__doc__)
    p.add_argument("--ops", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=5)
    args = parse_round_args(p, argv, "client-cpu")
    load_before = loadavg()
    with BenchRedis() as server:
        client = redis.Redis(host=HOST, port=server.port)
        meta = machine_meta(client) | {"server_pid": server.pid()}
        store = ConversationStore(client, bench_config("clientcpu"))
        keys, text = KeyPool(1, 1000), chat_text(300)
        for _ in range(200 if args.quick else 20_000):
            store.append(keys.next(), AvatarMessage(text=text))
        rounds = [_round(store, keys, text, args.ops) for _ in range(args.rounds)]
        client.close()
        aio = asyncio.run(_async_rounds(server.port, keys, text, args.ops, args.rounds))
        rounds = [r | a for r, a in zip(rounds, aio, strict=True)]
    summary: dict[str, dict[str, float]] = {}
    for name in sorted(rounds[0]):
        values = [r[name] for r in rounds]
        summary[name] = {"min": min(values), "median": statistics.median(values)}
        print(f"{name:16} min {min(values):7.1f}  median {statistics.median(values):7.1f} us/op")
    data = {
        "probe": "client_cpu",
        "ops": args.ops,
        "load_before": load_before,
        "load_after": loadavg(),
        "meta": meta,
        "rounds": rounds,
        "us_per_op": summary,
    }
    print(f"wrote {write_json(args.out, data)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
