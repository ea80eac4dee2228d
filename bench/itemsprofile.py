"""Where the time of one agent turn's ``add_items`` goes (OpenAI Agents adapter, asyncio).

``python -m bench.itemsprofile [--rounds K] [--ops N] [--out FILE|DIR] [--quick]``

On a private ``redis-server`` (free loopback port, temp dir, stopped by pid), memtier's
``MemtierSession.add_items`` of the benchmark's four items (``bench.turnitems``: a user
message, a ``function_call``, its output and the answer, 300 B of text each) on 1,000
sessions in turn, one asyncio store on one connection, as the "one agent turn's 4 items
per call" group runs it.  Per round, ``N`` calls:

* ``wall_us_per_op``: the call's wall time;
* ``client_cpu_us_per_op``: this process's CPU time (``time.process_time``), so the
  client's whole work per op, event loop included;
* ``redis_us_per_op``: ``INFO commandstats`` usec of every command over the calls.

Then each client stage of one op, timed alone in a loop with no I/O (``stages_us_per_op``):
the SDK items to memtier turns, ``prepare_turn`` of the four (validation, redaction,
bounding, JSON; of which the redaction), ``append_call`` of the batch and
``decode_append`` of its four replies.  Between real replies each costs more than in a
loop (docs/performance.md, "Client CPU is not additive").  Last, one round under
``cProfile`` (``profile_top``: the functions with the most own time, us per op -- inflated
by the profiler, for their order, not their size).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import time
from pathlib import Path
from typing import Any

import redis.asyncio

from bench.framework import command_stats
from bench.probe import exit_on_sigterm, machine_meta, parse_round_args, spread, write_json
from bench.profiling import per_op_us
from bench.server import HOST, BenchRedis
from bench.turnitems import turn_items
from bench.workloads import bench_config, chat_text
from memtier import AsyncConversationStore, ConversationStore
from memtier.integrations._common import NotStoredTally
from memtier.integrations.openai_agents import MemtierSession, item_to_turn
from memtier.redaction import sanitize

__all__ = ["main"]

SESSIONS = 1000
PROFILE_TOP = 12


def _redis_usec(client: Any) -> float:
    return sum(usec for _, usec in command_stats(client).values())


def _stages(store: ConversationStore, text: str, n: int) -> dict[str, float]:
    """Each client stage of one op, alone in a loop (sync store: the same core)."""
    core = store.core
    key = core.coerce_key(MemtierSession("stages", store).key)
    items = turn_items(text, "c-stages")
    tally = NotStoredTally("bench")
    turns = [t for t in (item_to_turn(i, tally, {}) for i in items) if t is not None]
    prepared = [core.prepare_turn(key, t) for t in turns]
    call = core.append_call(prepared[0], more=prepared[1:])
    replies = store.executor.execute(call)
    texts = [v for t in turns for v in t.content_fields().values()]
    return {
        "items_to_turns": per_op_us(lambda: [item_to_turn(i, tally, {}) for i in items], n),
        "prepare_turn": per_op_us(lambda: [core.prepare_turn(key, t) for t in turns], n),
        "of_which_redaction": per_op_us(lambda: [sanitize(v, 10_000) for v in texts], n),
        "append_call": per_op_us(lambda: core.append_call(prepared[0], more=prepared[1:]), n),
        "decode_append": per_op_us(
            lambda: [core.decode_append(p, r) for p, r in zip(prepared, replies, strict=True)], n
        ),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.itemsprofile")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--ops", type=int, default=2000)
    args = parse_round_args(p, argv, "itemsprofile")
    exit_on_sigterm()
    text = chat_text(300)
    with BenchRedis() as server:
        admin = server.client()
        meta = machine_meta(admin) | {"server_pid": server.pid()}
        sync_store = ConversationStore(server.client(), bench_config("itemsprofile-stages"))
        stages = _stages(sync_store, text, max(args.ops, 100))
        sync_store.close()
        wall: list[float] = []
        cpu: list[float] = []
        redis_us: list[float] = []
        top: list[dict[str, Any]] = []

        async def run() -> None:
            client = redis.asyncio.Redis(host=HOST, port=server.port)
            store = AsyncConversationStore(client, bench_config("itemsprofile"))
            sessions = [MemtierSession(f"s{i}", store) for i in range(SESSIONS)]
            seq = 0

            async def calls(n: int) -> None:
                nonlocal seq
                for _ in range(n):
                    await sessions[seq % SESSIONS].add_items(turn_items(text, f"c{seq}"))
                    seq += 1

            await calls(SESSIONS)  # every session exists before the count
            for _ in range(args.rounds):
                usec, t0, c0 = _redis_usec(admin), time.perf_counter(), time.process_time()
                await calls(args.ops)
                wall.append((time.perf_counter() - t0) / args.ops * 1e6)
                cpu.append((time.process_time() - c0) / args.ops * 1e6)
                redis_us.append((_redis_usec(admin) - usec) / args.ops)
            profile = cProfile.Profile()
            profile.enable()
            await calls(args.ops)
            profile.disable()
            stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
            ranked = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)
            for (file, line, func), (_, ncalls, tottime, _, _) in ranked[:PROFILE_TOP]:
                top.append(
                    {
                        "function": f"{Path(file).name}:{line}({func})",
                        "calls_per_op": ncalls / args.ops,
                        "own_us_per_op": tottime / args.ops * 1e6,
                    }
                )
            await store.close()

        asyncio.run(run())

    result = {
        "meta": meta,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "wall_us_per_op": spread(wall),
        "client_cpu_us_per_op": spread(cpu),
        "redis_us_per_op": spread(redis_us),
        "stages_us_per_op": stages,
        "profile_top": top,
        "rounds": {
            "wall_us_per_op": wall,
            "client_cpu_us_per_op": cpu,
            "redis_us_per_op": redis_us,
        },
    }
    write_json(args.out, result)
    print(f"add_items of 4 items, median [min-max] of {args.rounds} rounds:")
    for name, values in (("wall", wall), ("client CPU", cpu), ("Redis", redis_us)):
        s = spread(values)
        print(f"  {name:10s} us per op {s['median']:7.1f} [{s['min']:.1f}-{s['max']:.1f}]")
    for name, us in stages.items():
        print(f"  stage {name:18s} {us:7.1f} us")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
