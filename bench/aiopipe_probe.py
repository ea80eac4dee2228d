"""Probe: auto-pipelining for asyncio, the transport apart from memtier's own work.

64 coroutines on one loop (as the ``asyncio, 64 coroutines`` rows of ``bench.run``), in
interleaved rounds on a private ``redis-server``:

* ``raw`` -- redis-py's asyncio client, ``evalsha`` of the minimal script (the baseline of
  the target);
* ``exec.pipelined`` / ``exec.generic`` -- the same minimal script as a
  :class:`~memtier.engine.ScriptCall` through memtier's :class:`AsyncExecutor` (guard,
  retry, hooks, metrics) with auto-pipelining on / off: what the transport costs;
* ``append.pipelined`` / ``append.generic`` -- the public ``AsyncConversationStore.append``
  (300 B), on / off: the transport plus memtier's core and ``append_turn``.

Ratios are per round against ``raw``.  ``python -m bench.aiopipe_probe [--quick]``;
writes ``bench/results/aiopipe-probe.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis.asyncio

from bench.probe import RESULTS_DIR, exit_on_sigterm, fmt, loadavg, machine_meta, spread, write_json
from bench.server import HOST, BenchRedis
from bench.workloads import CONCURRENCY, MINIMAL_SCRIPT, bench_config, chat_text, run_concurrently
from memtier import AsyncConversationStore, AvatarMessage, ConversationKey
from memtier.autopipeline import PipelineBounds
from memtier.connection import AsyncClientGuard
from memtier.engine import ScriptCall
from memtier.executor import AsyncExecutor
from memtier.retry import RetryPolicy
from memtier.scripts import load_registry

POOL = 1000  # sessions rotated over, as in bench.run


def _minimal_registry(root: Path) -> Any:
    (root / "probe").mkdir(parents=True, exist_ok=True)
    shutil.copy(MINIMAL_SCRIPT, root / "probe" / MINIMAL_SCRIPT.name)
    return load_registry("probe", root)


async def _measures(port: int, root: Path) -> dict[str, Callable[[int], Awaitable[float]]]:
    client = redis.asyncio.Redis(host=HOST, port=port)
    scripts = _minimal_registry(root)
    script = scripts["minimal_append"]
    sha = await client.script_load(script.source)
    text = chat_text(300)
    config = bench_config("aiopipe")

    def args(tag: str, i: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        sid = f"{i % POOL:012d}"
        keys = (f"{{{tag}}}:q:{sid}", f"{{{tag}}}:t:{sid}", f"{{{tag}}}:meta", f"{{{tag}}}:lru")
        return keys, (text, f"m{i}")

    calls = {tag: [args(tag, i) for i in range(POOL)] for tag in ("praw", "ppipe", "pgen")}

    def executor(pipeline: PipelineBounds | None) -> AsyncExecutor:
        guard = AsyncClientGuard(client, config.redis)
        return AsyncExecutor(client, scripts, guard, RetryPolicy(), pipeline=pipeline)

    piped, generic = executor(PipelineBounds()), executor(None)
    off = config.model_copy(
        update={"redis": config.redis.model_copy(update={"auto_pipelining": False})}
    )
    stores = {
        "on": AsyncConversationStore(client, config),
        "off": AsyncConversationStore(client, off),
    }
    keys = [ConversationKey(uuid.UUID(int=(9 << 64) | i), "public") for i in range(POOL)]
    counter = {"n": 0}

    def raw(i: int) -> Awaitable[Any]:
        k, a = calls["praw"][i % POOL]
        return client.evalsha(sha, 4, *k, *a)

    def through(ex: AsyncExecutor, tag: str) -> Callable[[int], Awaitable[Any]]:
        def step(i: int) -> Awaitable[Any]:
            k, a = calls[tag][i % POOL]
            return ex.execute(ScriptCall("minimal_append", k, a))

        return step

    def append(store: AsyncConversationStore) -> Callable[[int], Awaitable[Any]]:
        def step(i: int) -> Awaitable[Any]:
            counter["n"] += 1
            return store.append(keys[counter["n"] % POOL], AvatarMessage(text=text))

        return step

    steps = {
        "raw": raw,
        "exec.pipelined": through(piped, "ppipe"),
        "exec.generic": through(generic, "pgen"),
        "append.pipelined": append(stores["on"]),
        "append.generic": append(stores["off"]),
    }

    def timed(step: Callable[[int], Awaitable[Any]]) -> Callable[[int], Awaitable[float]]:
        async def run(n: int) -> float:
            async def one(i: int) -> None:
                await step(i)

            return await run_concurrently(n, one)

        return run

    out = {name: timed(step) for name, step in steps.items()}
    out["_pipeline"] = piped  # type: ignore[assignment]
    out["_client"] = client  # type: ignore[assignment]
    return out


async def _run(port: int, root: Path, rounds: int, ops: int) -> dict[str, Any]:
    measures = await _measures(port, root)
    piped: AsyncExecutor = measures.pop("_pipeline")  # type: ignore[assignment]
    client: Any = measures.pop("_client")
    names = list(measures)
    for name in names:  # warm-up
        await measures[name](ops // 4)
    rates: dict[str, list[float]] = {name: [] for name in names}
    loads: list[dict[str, float]] = []
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]  # rotate every round
        for name in order:
            rates[name].append(ops / await measures[name](ops))
        loads.append(loadavg())
    pipeline = piped.pipeline_for(client)
    batches = pipeline.batches if pipeline else 0
    per_batch = (pipeline.calls / batches) if pipeline and batches else 0.0
    await client.aclose()
    ratios = {
        name: spread([a / b for a, b in zip(rates[name], rates["raw"], strict=True)])
        for name in names
        if name != "raw"
    }
    return {
        "rates_op_s": {name: spread(v) for name, v in rates.items()},
        "ratio_vs_raw": ratios,
        "calls_per_batch_exec_pipelined": per_batch,
        "load_per_round": loads,
        "load_median": statistics.median(x.get("load1", 0.0) for x in loads) if loads else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.aiopipe_probe", description=__doc__.split("\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="seconds: 2 rounds of 256 ops")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--ops", type=int, default=3000)
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    rounds, ops = (2, 256) if args.quick else (args.rounds, args.ops)
    exit_on_sigterm()
    started = time.perf_counter()
    with BenchRedis() as server, tempfile.TemporaryDirectory(prefix="aiopipe-") as tmp:
        meta = machine_meta(server.client())
        meta["server_pid"] = server.pid()
        result = asyncio.run(_run(server.port, Path(tmp), rounds, ops))
    meta.update(
        command="python -m bench.aiopipe_probe" + (" --quick" if args.quick else ""),
        coroutines=CONCURRENCY,
        rounds=rounds,
        ops_per_round=ops,
        seconds=time.perf_counter() - started,
    )
    data = {"probe": "aiopipe", "meta": meta, **result}
    name = "aiopipe-probe-quick.json" if args.quick else "aiopipe-probe.json"
    path = write_json(args.out / name, data)
    for key, s in result["rates_op_s"].items():
        ratio = result["ratio_vs_raw"].get(key)
        print(f"{key:18s} {fmt(s, 0):>24s} op/s" + (f"   x{fmt(ratio, 2)} vs raw" if ratio else ""))
    print(f"calls per batch (exec.pipelined): {result['calls_per_batch_exec_pipelined']:.1f}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
