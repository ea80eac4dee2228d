"""Append and context on a Redis Cluster: memtier's lean cluster path, its generic path, raw.

``python -m bench.clusterlean [--quick] [--ops N] [--rounds K] [--out DIR]``

On a private 3-primary Redis Cluster (``tests.servers.RedisClusterServers`` without
replicas -- replicas would only add CPU load to this shared 2-core machine; free loopback
ports, temp dir, every node stopped by pid on exit), in rounds whose row order rotates,
each row performs ``N`` operations with one sync ``RedisCluster`` client and reports
wall and this process's CPU microseconds per operation:

* ``raw_evalsha_minimal`` -- ``RedisCluster.evalsha`` of ``bench/minimal_append-4.lua``
  (the issue's append baseline, on the cluster: its four keys share one tag per session);
* ``append_lean`` -- ``store.append`` (300 B, fresh turn id, existing session) through
  the lean cluster path (:mod:`memtier.leancluster`);
* ``append_generic`` -- the same with ``executor.lean = False``: every script through
  redis-py's ``RedisCluster`` command machinery (what every cluster call did before);
* ``raw_lrange_orjson`` -- ``RedisCluster.lrange`` of 20 + orjson (the context baseline);
* ``context_lean`` / ``context_generic`` -- ``store.context(limit=20)`` of 100 turns;
* ``call_lean`` / ``call_generic`` -- the executor alone: ``executor.execute`` of an
  ``append_turn`` ScriptCall prepared before the timed loop (fresh turn ids): the call
  path (guard, retry, routing, packing, send, parse, hooks) without memtier's own work.

The JSON (``bench/results/clusterlean[-quick].json``) has every round, the median
[min-max] per row and the same-round ratios (baseline / row: x1.0 is the baseline's
speed), with the load average per round.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from redis.cluster import RedisCluster

from bench.probe import RESULTS_DIR, exit_on_sigterm, fmt, loadavg, machine_meta, spread, write_json
from bench.workloads import MINIMAL_SCRIPT, KeyPool, bench_config, chat_text
from memtier import AvatarMessage, ConversationStore
from tests.servers import HOST, RedisClusterServers

__all__ = ["main"]

Row = Callable[[int], tuple[float, float]]  # n -> (wall s, this process's CPU s)
RATIOS = (  # (name, baseline row, memtier row)
    ("append_lean_vs_raw_evalsha", "raw_evalsha_minimal", "append_lean"),
    ("append_generic_vs_raw_evalsha", "raw_evalsha_minimal", "append_generic"),
    ("context_lean_vs_lrange_orjson", "raw_lrange_orjson", "context_lean"),
    ("context_generic_vs_lrange_orjson", "raw_lrange_orjson", "context_generic"),
    ("append_lean_vs_generic", "append_generic", "append_lean"),
    ("context_lean_vs_generic", "context_generic", "context_lean"),
    ("call_lean_vs_generic", "call_generic", "call_lean"),
)


class BenchCluster(RedisClusterServers):
    """3 primaries, no replicas."""

    REPLICAS_PER_PRIMARY = 0


class Rig:
    def __init__(self, cluster: BenchCluster, quick: bool) -> None:
        self.client = RedisCluster(host=HOST, port=cluster.port)
        config = bench_config("clusterlean")
        self.lean = ConversationStore(self.client, config)
        self.generic = ConversationStore(self.client, config)
        self.generic.executor.lean = False
        self.text = chat_text(300)
        self.append_pool = KeyPool(71, 60 if quick else 300)
        self.read_pool = KeyPool(72, 8 if quick else 32)
        for key in self.append_pool.keys:  # every timed append goes to an existing session
            self.lean.append(key, AvatarMessage(text=self.text))
        for t in range(25 if quick else 100):
            for key in self.read_pool.keys:
                self.lean.append(key, AvatarMessage(text=self.text, turn_id=f"p{t}"))
        self.min_sha = str(self.client.script_load(MINIMAL_SCRIPT.read_text(encoding="utf-8")))
        self.lists = [f"{{cl{i}}}:r" for i in range(32)]
        entry = orjson.dumps({"role": "user", "content": self.text})
        for list_key in self.lists:
            self.client.delete(list_key)
            self.client.rpush(list_key, *([entry] * 100))
        self.i = 0

    def minimal_args(self, n: int) -> list[tuple[Any, ...]]:
        out = []
        for _ in range(n):
            self.i += 1
            tag = f"{{m{self.i % 300}}}"
            keys = (tag + ":q", tag + ":t", tag + ":meta", tag + ":lru")
            out.append((self.min_sha, 4, *keys, self.text, "m" + tag))
        return out

    def rows(self) -> dict[str, Row]:
        client, text = self.client, self.text

        def timed(prepare: Callable[[int], Any], body: Callable[[Any], None]) -> Row:
            def row(n: int) -> tuple[float, float]:
                data = prepare(n)
                t0, c0 = time.perf_counter(), time.process_time()
                body(data)
                return time.perf_counter() - t0, time.process_time() - c0

            return row

        def keys(pool: KeyPool) -> Callable[[int], list[Any]]:
            return lambda n: [pool.next() for _ in range(n)]

        def appends(store: ConversationStore) -> Callable[[list[Any]], None]:
            def body(batch: list[Any]) -> None:
                for key in batch:
                    store.append(key, AvatarMessage(text=text))

            return body

        def reads(store: ConversationStore) -> Callable[[list[Any]], None]:
            def body(batch: list[Any]) -> None:
                for key in batch:
                    store.context(key, limit=20)

            return body

        def prepared(n: int) -> list[Any]:
            core, pool = self.lean.core, self.append_pool
            return [
                core.append_call(core.prepare_turn(pool.next(), AvatarMessage(text=text)))
                for _ in range(n)
            ]

        def calls(store: ConversationStore) -> Callable[[list[Any]], None]:
            execute = store.executor.execute

            def body(batch: list[Any]) -> None:
                for call in batch:
                    execute(call)

            return body

        def raw_evalsha(batch: list[tuple[Any, ...]]) -> None:
            for call in batch:
                client.evalsha(*call)

        def raw_lrange(batch: list[str]) -> None:
            for key in batch:
                [orjson.loads(item) for item in client.lrange(key, -20, -1)]

        lists = self.lists
        return {
            "raw_evalsha_minimal": timed(self.minimal_args, raw_evalsha),
            "append_lean": timed(keys(self.append_pool), appends(self.lean)),
            "append_generic": timed(keys(self.append_pool), appends(self.generic)),
            "raw_lrange_orjson": timed(
                lambda n: [lists[i % len(lists)] for i in range(n)], raw_lrange
            ),
            "context_lean": timed(keys(self.read_pool), reads(self.lean)),
            "context_generic": timed(keys(self.read_pool), reads(self.generic)),
            "call_lean": timed(prepared, calls(self.lean)),
            "call_generic": timed(prepared, calls(self.generic)),
        }


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.clusterlean")
    parser.add_argument("--quick", action="store_true", help="seconds, for the smoke test")
    parser.add_argument("--ops", type=int, default=0, help="operations per row per round")
    parser.add_argument("--rounds", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--name", default="", help="output file suffix (clusterlean-NAME.json)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    exit_on_sigterm()
    ops = args.ops or (30 if args.quick else 200)
    rounds = args.rounds or (2 if args.quick else 21)
    suffix = f"-{args.name}" if args.name else ("-quick" if args.quick else "")
    args.out.mkdir(parents=True, exist_ok=True)
    with BenchCluster() as cluster:
        rig = Rig(cluster, args.quick)
        with cluster.node_client(cluster.port) as node:
            meta = machine_meta(node)
        meta.update(
            tool="bench.clusterlean",
            ops=ops,
            rounds=rounds,
            payload_bytes=300,
            primaries=BenchCluster.PRIMARIES,
            server_pid=cluster.pids[0],
            server_pids=cluster.pids,
        )
        rows = rig.rows()
        for row in rows.values():  # warm-up: scripts loaded, pools sized, slot map read
            row(min(ops, 30))
        walls: dict[str, list[float]] = {k: [] for k in rows}
        cpus: dict[str, list[float]] = {k: [] for k in rows}
        loads = []
        names = list(rows)
        print(f"clusterlean: {len(rows)} rows x {rounds} rounds x {ops} ops; load {loadavg()}")
        for r in range(rounds):
            loads.append({"round": r, **loadavg()})
            for name in names[r % len(names) :] + names[: r % len(names)]:
                wall, cpu = rows[name](ops)
                walls[name].append(wall / ops * 1e6)
                cpus[name].append(cpu / ops * 1e6)
            print(f"  round {r + 1}/{rounds}; load {loads[-1]}", flush=True)
        meta["lean_calls"] = rig.lean.executor.lean_calls
        meta["generic_lean_calls"] = rig.generic.executor.lean_calls
        rig.client.close()
    report(
        args.out / f"clusterlean{suffix}.json",
        {**meta, "load_per_round": loads},
        walls,
        cpus,
        RATIOS,
    )
    return 0


def report(
    path: Path,
    meta: dict[str, Any],
    walls: dict[str, list[float]],
    cpus: dict[str, list[float]],
    ratio_rows: tuple[tuple[str, str, str], ...],
) -> Path:
    """Write the JSON of a rotated-rounds probe (every round, median [min-max] per row,
    same-round ratios baseline / row) and print its summary."""
    ratios = {
        name: spread([b / m for b, m in zip(walls[base], walls[row], strict=True)])
        for name, base, row in ratio_rows
    }
    data = {
        "meta": meta,
        "rows_us_per_op": {k: spread(v) for k, v in walls.items()},
        "client_cpu_us_per_op": {k: spread(v) for k, v in cpus.items()},
        "ratios_same_round": ratios,
        "rounds_us_per_op": walls,
        "rounds_client_cpu_us_per_op": cpus,
    }
    out = write_json(path, data)
    for k in walls:
        print(f"{k:22} wall {fmt(spread(walls[k]))} us  cpu {fmt(spread(cpus[k]))} us")
    for name, s in ratios.items():
        print(f"{name:34} x{fmt(s, 2)}")
    print(f"lean calls {meta['lean_calls']} (generic store: {meta['generic_lean_calls']})")
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    raise SystemExit(main())
