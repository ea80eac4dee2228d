"""Append and context on an asyncio Redis Cluster client: memtier's lean path, generic, raw.

``python -m bench.aioclusterlean [--quick] [--ops N] [--rounds K] [--out DIR]``

The asyncio twin of :mod:`bench.clusterlean`: on a private 3-primary Redis Cluster (no
replicas; free loopback ports, temp dir, every node stopped by pid on exit), in rounds
whose row order rotates, each row performs ``N`` operations one at a time with one
asyncio ``RedisCluster`` client and reports wall and this process's CPU microseconds per
operation:

* ``raw_evalsha_minimal`` -- ``await RedisCluster.evalsha`` of ``bench/minimal_append-4.lua``;
* ``append_lean`` -- ``await store.append`` (300 B, existing session) on the lean asyncio
  cluster path (:mod:`memtier.aioleancluster`);
* ``append_generic`` -- the same with ``executor.lean = False``: every script through
  redis-py's asyncio ``RedisCluster`` command machinery (what every call did before);
* ``raw_lrange_orjson`` -- ``await RedisCluster.lrange`` of 20 + orjson;
* ``context_lean`` / ``context_generic`` -- ``await store.context(limit=20)`` of 100
  turns (the generic path: redis-py's asyncio ``ClusterPipeline`` transaction);
* ``*_c64`` -- 64 coroutines on the loop at once, each appending in turn to sessions on
  every primary: the raw minimal script, memtier's lean path with its node pipelines
  (``append_lean_c64``), the lean path with auto-pipelining off (one call per
  connection, ``append_unbatched_c64``) and the generic path.

The JSON (``bench/results/aioclusterlean[-NAME|-quick].json``) has every round, the
median [min-max] per row and the same-round ratios (baseline / row), with the load.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from redis.asyncio.cluster import RedisCluster

from bench.clusterlean import BenchCluster, report
from bench.probe import RESULTS_DIR, exit_on_sigterm, loadavg, machine_meta
from bench.workloads import MINIMAL_SCRIPT, KeyPool, bench_config, chat_text
from memtier import AsyncConversationStore, AvatarMessage
from tests.servers import HOST

__all__ = ["main"]

Row = Callable[[int], Awaitable[tuple[float, float]]]  # n -> (wall s, this process's CPU s)
RATIOS = (  # (name, baseline row, memtier row)
    ("append_lean_vs_raw_evalsha", "raw_evalsha_minimal", "append_lean"),
    ("append_generic_vs_raw_evalsha", "raw_evalsha_minimal", "append_generic"),
    ("context_lean_vs_lrange_orjson", "raw_lrange_orjson", "context_lean"),
    ("context_generic_vs_lrange_orjson", "raw_lrange_orjson", "context_generic"),
    ("append_lean_vs_generic", "append_generic", "append_lean"),
    ("context_lean_vs_generic", "context_generic", "context_lean"),
    ("append_lean_c64_vs_raw_c64", "raw_evalsha_minimal_c64", "append_lean_c64"),
    ("append_lean_c64_vs_unbatched_c64", "append_unbatched_c64", "append_lean_c64"),
    ("append_lean_c64_vs_generic_c64", "append_generic_c64", "append_lean_c64"),
)
CONCURRENCY = 64


class Rig:
    def __init__(self, client: RedisCluster, quick: bool) -> None:
        self.client = client
        config = bench_config("aioclusterlean")
        self.lean = AsyncConversationStore(client, config)
        self.generic = AsyncConversationStore(client, config)
        self.generic.executor.lean = False
        self.unbatched = AsyncConversationStore(client, config)
        self.unbatched.executor.pipeline_bounds = None  # lean, one call per connection
        self.text = chat_text(300)
        self.quick = quick
        self.append_pool = KeyPool(81, 60 if quick else 300)
        self.read_pool = KeyPool(82, 8 if quick else 32)
        self.lists = [f"{{acl{i}}}:r" for i in range(32)]
        self.min_sha = ""
        self.i = 0

    async def fill(self) -> None:
        for key in self.append_pool.keys:  # every timed append goes to an existing session
            await self.lean.append(key, AvatarMessage(text=self.text))
        for t in range(25 if self.quick else 100):
            for key in self.read_pool.keys:
                await self.lean.append(key, AvatarMessage(text=self.text, turn_id=f"p{t}"))
        source = MINIMAL_SCRIPT.read_text(encoding="utf-8")
        self.min_sha = str(await self.client.script_load(source))
        entry = orjson.dumps({"role": "user", "content": self.text})
        for list_key in self.lists:
            await self.client.delete(list_key)
            await self.client.rpush(list_key, *([entry] * 100))

    def rows(self) -> dict[str, Row]:
        client, text = self.client, self.text

        def timed(body: Callable[[int], Awaitable[None]]) -> Row:
            async def row(n: int) -> tuple[float, float]:
                t0, c0 = time.perf_counter(), time.process_time()
                await body(n)
                return time.perf_counter() - t0, time.process_time() - c0

            return row

        def appends(store: AsyncConversationStore) -> Callable[[int], Awaitable[None]]:
            async def body(n: int) -> None:
                for _ in range(n):
                    await store.append(self.append_pool.next(), AvatarMessage(text=text))

            return body

        def reads(store: AsyncConversationStore) -> Callable[[int], Awaitable[None]]:
            async def body(n: int) -> None:
                for _ in range(n):
                    await store.context(self.read_pool.next(), limit=20)

            return body

        async def raw_evalsha(n: int) -> None:
            for _ in range(n):
                self.i += 1
                tag = f"{{am{self.i % 300}}}"
                keys = (tag + ":q", tag + ":t", tag + ":meta", tag + ":lru")
                await client.evalsha(self.min_sha, 4, *keys, text, "m" + tag)

        async def raw_lrange(n: int) -> None:
            lists = self.lists
            for i in range(n):
                [orjson.loads(item) for item in await client.lrange(lists[i % 32], -20, -1)]

        def concurrent(one: Callable[[], Awaitable[Any]]) -> Row:
            """``n`` operations by CONCURRENCY coroutines at once (n // CONCURRENCY each)."""

            async def row(n: int) -> tuple[float, float]:
                each = max(1, n // CONCURRENCY)

                async def worker() -> None:
                    for _ in range(each):
                        await one()

                t0, c0 = time.perf_counter(), time.process_time()
                await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
                scale = n / (each * CONCURRENCY)  # per-op figures stay per op
                return (time.perf_counter() - t0) * scale, (time.process_time() - c0) * scale

            return row

        async def raw_one() -> None:
            self.i += 1
            tag = f"{{am{self.i % 300}}}"
            keys = (tag + ":q", tag + ":t", tag + ":meta", tag + ":lru")
            await client.evalsha(self.min_sha, 4, *keys, text, "m" + tag)

        def append_one(store: AsyncConversationStore) -> Callable[[], Awaitable[Any]]:
            return lambda: store.append(self.append_pool.next(), AvatarMessage(text=text))

        return {
            "raw_evalsha_minimal_c64": concurrent(raw_one),
            "append_lean_c64": concurrent(append_one(self.lean)),
            "append_unbatched_c64": concurrent(append_one(self.unbatched)),
            "append_generic_c64": concurrent(append_one(self.generic)),
            "raw_evalsha_minimal": timed(raw_evalsha),
            "append_lean": timed(appends(self.lean)),
            "append_generic": timed(appends(self.generic)),
            "raw_lrange_orjson": timed(raw_lrange),
            "context_lean": timed(reads(self.lean)),
            "context_generic": timed(reads(self.generic)),
        }


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.aioclusterlean")
    parser.add_argument("--quick", action="store_true", help="seconds, for the smoke test")
    parser.add_argument("--ops", type=int, default=0, help="operations per row per round")
    parser.add_argument("--rounds", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--name", default="", help="output file suffix (aioclusterlean-NAME.json)")
    return parser.parse_args(argv)


async def _measure(port: int, ops: int, rounds: int, quick: bool) -> dict[str, Any]:
    client = RedisCluster(host=HOST, port=port)
    try:
        rig = Rig(client, quick)
        await rig.fill()
        rows = rig.rows()
        for row in rows.values():  # warm-up: scripts loaded, connections open
            await row(min(ops, 30))
        walls: dict[str, list[float]] = {k: [] for k in rows}
        cpus: dict[str, list[float]] = {k: [] for k in rows}
        loads = []
        names = list(rows)
        print(f"aioclusterlean: {len(rows)} rows x {rounds} rounds x {ops} ops; load {loadavg()}")
        for r in range(rounds):
            loads.append({"round": r, **loadavg()})
            for name in names[r % len(names) :] + names[: r % len(names)]:
                wall, cpu = await rows[name](ops)
                walls[name].append(wall / ops * 1e6)
                cpus[name].append(cpu / ops * 1e6)
            print(f"  round {r + 1}/{rounds}; load {loads[-1]}", flush=True)
        lean = rig.lean.executor.lean_cluster_for(client)
        generic = rig.generic.executor.lean_cluster_for(client)
        return {
            "walls": walls,
            "cpus": cpus,
            "loads": loads,
            "lean_calls": 0 if lean is None else lean.calls,
            "generic_lean_calls": 0 if generic is None else generic.calls,
        }
    finally:
        await client.aclose()


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    exit_on_sigterm()
    ops = args.ops or (30 if args.quick else 200)
    rounds = args.rounds or (2 if args.quick else 15)
    suffix = f"-{args.name}" if args.name else ("-quick" if args.quick else "")
    args.out.mkdir(parents=True, exist_ok=True)
    with BenchCluster() as cluster:
        with cluster.node_client(cluster.port) as node:
            meta = machine_meta(node)
        meta.update(
            tool="bench.aioclusterlean",
            ops=ops,
            rounds=rounds,
            payload_bytes=300,
            primaries=BenchCluster.PRIMARIES,
            server_pid=cluster.pids[0],
            server_pids=cluster.pids,
        )
        got = asyncio.run(_measure(cluster.port, ops, rounds, args.quick))
    meta["lean_calls"] = got["lean_calls"]
    meta["generic_lean_calls"] = got["generic_lean_calls"]
    meta["load_per_round"] = got["loads"]
    report(args.out / f"aioclusterlean{suffix}.json", meta, got["walls"], got["cpus"], RATIOS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
