"""Cost as work grows: latency at 1k/100k/1M live sessions, eviction, memory per turn.

* **Scale**: one namespace per level (1k, 100k, 1M live sessions; each its own
  partition, LRU indexes and byte accounting) is filled with pipelined appends
  through memtier's own ``append_turn`` script (IM channel, whose 24 h TTL
  outlives the run, so nothing expires while it is measured).  Then every round
  samples per-operation latencies of ``append`` and ``context`` on random live
  sessions of each level in turn (order rotating), so the levels see the same
  machine state and the p50 ratio is paired by round.  All levels live in one
  server: Redis's global keyspace is the same for all of them, and what differs
  is memtier's per-partition structures (the LRU zsets, the index hash, the
  sweeps).  A raw minimal-script call sampled alongside is the noise reference.
* **Eviction**: appends that start a new session while the partition is at its
  aggregate-byte ceiling (each evicts the least-recently-active sessions) or at
  its session-count ceiling, against the same append with no pressure.
* **Memory**: ``MEMORY USAGE`` (exact, ``SAMPLES 0``) summed over every key of a
  namespace after ``sessions x turns`` appends, per stored turn, against the
  payload bytes of the turn; ``INFO memory`` delta as a cross-check; and the
  same text in plain Redis lists as the floor.
"""

from __future__ import annotations

import random
import time
import uuid
from typing import Any

from bench.framework import Harness, Measure, Result, percentile, timed
from bench.server import BenchRedis
from bench.workloads import MINIMAL_SCRIPT, bench_config, chat_text, populate
from memtier import AvatarMessage, ConversationKey, ConversationStore

__all__ = ["run_eviction", "run_memory", "run_scale"]

SCALE_TAG = 9
SCALE_ROUNDS = 7
FILL_CHUNK = 100_000  # keys built per populate() call (bounds the client's memory)


def _scale_key(i: int) -> ConversationKey:
    return ConversationKey(uuid.UUID(int=(SCALE_TAG << 64) | i), "im")


def run_scale(h: Harness, server: BenchRedis) -> None:
    """Fill one namespace per level, then sample all levels in interleaved rounds."""
    s = h.settings
    client = server.client()
    text = chat_text(300)
    sha = client.script_load(MINIMAL_SCRIPT.read_text(encoding="utf-8"))
    rnd = random.Random(42)
    levels = s.scale_levels
    stores = {lv: ConversationStore(client, bench_config(f"bscale{lv}")) for lv in levels}
    filled: dict[int, dict[str, float]] = {}
    for level in levels:
        started = time.perf_counter()
        for lo in range(0, level, FILL_CHUNK):
            keys = [_scale_key(i) for i in range(lo, min(level, lo + FILL_CHUNK))]
            failures = populate(stores[level], keys, text)
            if failures:
                raise RuntimeError(f"scale: {failures} appends not stored while populating")
        fill_s = time.perf_counter() - started
        live = stores[level].stats()["sessions"]
        used = int(client.info("memory")["used_memory"])
        filled[level] = {
            "live_sessions": live,
            "fill_rate_per_s": level / max(fill_s, 1e-9),
            "used_memory_after_fill": used,
        }
        h.log(
            f"  namespace of {level:,} sessions: {live:,} live, filled at "
            f"{level / max(fill_s, 1e-9):,.0f} appends/s; used_memory {used / 2**20:,.0f} MiB"
        )
        if live != level:
            raise RuntimeError(f"scale: expected {level} live sessions, found {live}")

    ops = ("append", "context", "reference")
    per_round = max(1, s.scale_samples // SCALE_ROUNDS)
    samples: dict[tuple[str, int], list[float]] = {(op, lv): [] for op in ops for lv in levels}
    p50s: dict[tuple[str, int], list[float]] = {k: [] for k in samples}
    p99s: dict[tuple[str, int], list[float]] = {k: [] for k in samples}
    for rnd_i in range(s.warmup_rounds + SCALE_ROUNDS):
        shift = rnd_i % len(levels)
        for level in levels[shift:] + levels[:shift]:
            store = stores[level]
            cur: dict[str, list[float]] = {op: [] for op in ops}
            for _ in range(per_round):
                ckey = _scale_key(rnd.randrange(level))
                t0 = time.perf_counter_ns()
                store.append(ckey, AvatarMessage(text=text))
                t1 = time.perf_counter_ns()
                store.context(ckey, limit=20)
                t2 = time.perf_counter_ns()
                j = rnd.randrange(1000)
                client.evalsha(
                    sha, 4, f"{{bs}}:q:{j}", f"{{bs}}:t:{j}", "{bs}:meta", "{bs}:lru", text, f"m{j}"
                )
                t3 = time.perf_counter_ns()
                cur["append"].append((t1 - t0) / 1000)
                cur["context"].append((t2 - t1) / 1000)
                cur["reference"].append((t3 - t2) / 1000)
            if rnd_i < s.warmup_rounds:
                continue
            for op, vals in cur.items():
                vals.sort()
                samples[(op, level)].extend(vals)
                p50s[(op, level)].append(percentile(vals, 50))
                p99s[(op, level)].append(percentile(vals, 99))
    labels = {
        "append": "memtier append",
        "context": "memtier context (last 20)",
        "reference": "raw minimal script (noise reference)",
    }
    for op in ops:
        for level in levels:
            allv = sorted(samples[(op, level)])
            for q, per in (("p50", p50s[(op, level)]), ("p99", p99s[(op, level)])):
                first = (p50s if q == "p50" else p99s)[(op, levels[0])]
                res = Result(
                    f"scale.{op}.{q}.{level}",
                    "scale",
                    f"{labels[op]} {q} @ {level:,} sessions",
                    "us",
                    values=per,
                    higher_is_better=False,
                    baseline=None if level == levels[0] else f"scale.{op}.{q}.{levels[0]}",
                    ratios=None
                    if level == levels[0]
                    else [a / b for a, b in zip(per, first, strict=False) if b > 0],
                    extra={
                        "all_samples_p50": percentile(allv, 50),
                        "all_samples_p99": percentile(allv, 99),
                        "samples": len(allv),
                        **filled[level],
                    },
                )
                h.add(res)
                h.log(f"    {res.label:<58} {res.summary['median']:>9.1f} us")
    client.close()


def run_eviction(h: Harness, server: BenchRedis) -> None:
    """Appends that start a new session, with and without pressure."""
    client = server.client()
    text = chat_text(300)
    big = chat_text(4096)
    agg_bytes = 4 * 1024 * 1024
    free = ConversationStore(client, bench_config("bnoevict"))
    by_bytes = ConversationStore(
        client, bench_config("bevictb", max_aggregate_bytes=agg_bytes, max_session_bytes=256 * 1024)
    )
    by_bytes4 = ConversationStore(
        client,
        bench_config("bevictb4", max_aggregate_bytes=agg_bytes, max_session_bytes=256 * 1024),
    )
    by_count = ConversationStore(client, bench_config("bevictc", max_active_sessions=10_000))
    fill_b = [
        ConversationKey(uuid.UUID(int=(21 << 64) | i), "public")
        for i in range(agg_bytes // 300 + 100)
    ]
    fill_c = [ConversationKey(uuid.UUID(int=(22 << 64) | i), "public") for i in range(10_100)]
    populate(by_bytes, fill_b, text)
    populate(by_bytes4, fill_b, text)
    populate(by_count, fill_c, text)
    counters = {"tag": 100}
    evicted: dict[str, list[int]] = {}

    def measure(key: str, label: str, store: ConversationStore, payload: str) -> Measure:
        counters["tag"] += 1
        tag = counters["tag"]
        state = {"i": 0}
        evicted[key] = [0, 0]

        def run(n: int) -> None:
            i = state["i"]
            got = 0
            for j in range(i, i + n):
                receipt = store.append(
                    ConversationKey(uuid.UUID(int=(tag << 64) | j), "public"),
                    AvatarMessage(text=payload),
                )
                got += receipt.evicted
            state["i"] = i + n
            evicted[key][0] += got
            evicted[key][1] += n

        return Measure(key, label, timed(run))

    ms = [
        measure("evict.none.300B", "append starting a new session, no pressure [300B]", free, text),
        measure(
            "evict.bytes.300B",
            "same, partition at its aggregate-byte ceiling [300B]",
            by_bytes,
            text,
        ),
        measure(
            "evict.count.300B",
            "same, partition at its session-count ceiling [300B]",
            by_count,
            text,
        ),
        measure("evict.none.4KiB", "append starting a new session, no pressure [4KiB]", free, big),
        measure(
            "evict.bytes.4KiB",
            "same, partition at its aggregate-byte ceiling [4KiB]",
            by_bytes4,
            big,
        ),
    ]
    results = h.group(
        "eviction",
        ms,
        ratios={
            "evict.bytes.300B": "evict.none.300B",
            "evict.count.300B": "evict.none.300B",
            "evict.bytes.4KiB": "evict.none.4KiB",
        },
    )
    for res in results:
        got, n = evicted[res.key]
        if n:
            res.extra["evicted_per_append"] = got / n
            if "none" not in res.key:
                res.note = f"{got / n:.2f} sessions evicted per append"
    for store in (by_bytes, by_bytes4):
        held = store.stats()["bytes"]
        if held > agg_bytes:  # a sanity check of the run, not a test
            raise RuntimeError(f"eviction: aggregate ceiling exceeded ({held} bytes)")
    client.close()


def _namespace_bytes(client: Any, pattern: str) -> tuple[int, int, dict[str, int]]:
    """(bytes, keys, bytes by key kind) of every key matching ``pattern`` (MEMORY USAGE)."""
    total = count = 0
    kinds: dict[str, int] = {}
    for key in client.scan_iter(match=pattern, count=1000):
        usage = int(client.memory_usage(key, samples=0) or 0)
        total += usage
        count += 1
        name = key.decode() if isinstance(key, bytes) else str(key)
        kind = name.split("}:", 1)[-1].split(":", 1)[0]
        kinds[kind] = kinds.get(kind, 0) + usage
    return total, count, kinds


def run_memory(h: Harness, server: BenchRedis) -> None:
    s = h.settings
    client = server.client()
    for size, nbytes, sessions in (
        ("300B", 300, s.memory_sessions),
        ("4KiB", 4096, max(1, s.memory_sessions // 4)),
    ):
        turns = s.memory_turns
        text = chat_text(nbytes)
        ns = f"bmem{size}"
        store = ConversationStore(client, bench_config(ns))
        keys = [ConversationKey(uuid.UUID(int=(31 << 64) | i), "public") for i in range(sessions)]
        before = int(client.info("memory")["used_memory"])
        failures = populate(store, keys, text, turns=turns, unique_ids=True)
        if failures:
            raise RuntimeError(f"memory: {failures} appends not stored")
        after = int(client.info("memory")["used_memory"])
        stored, nkeys, kinds = _namespace_bytes(client, store.core.keyspace.pattern())
        n_turns = sessions * turns
        per_turn = stored / n_turns
        # The floor: the same text in plain lists, one per session.
        lists = [f"{{bmemraw{size}}}:{i}" for i in range(sessions)]
        pipe = client.pipeline(transaction=False)
        for key in lists:
            pipe.rpush(key, *([text] * turns))
        pipe.execute()
        raw = sum(int(client.memory_usage(k, samples=0) or 0) for k in lists)
        raw_per_turn = raw / n_turns
        h.add(
            Result(
                f"memory.turn.{size}",
                "memory",
                f"memtier Redis bytes per stored turn [{size}]",
                "B/turn",
                values=[per_turn],
                higher_is_better=False,
                baseline=f"payload {nbytes} B",
                ratios=[per_turn / nbytes],
                note=f"{sessions:,} sessions x {turns} turns; MEMORY USAGE of {nkeys:,} keys",
                extra={
                    "payload_bytes": nbytes,
                    "info_used_memory_delta_per_turn": (after - before) / n_turns,
                    "bytes_by_key_kind": kinds,
                    "turns": n_turns,
                },
            )
        )
        h.add(
            Result(
                f"memory.rawlist.{size}",
                "memory",
                f"same text in plain Redis lists (floor) [{size}]",
                "B/turn",
                values=[raw_per_turn],
                higher_is_better=False,
                baseline=f"payload {nbytes} B",
                ratios=[raw_per_turn / nbytes],
            )
        )
        h.log(
            f"  memory [{size}]: {per_turn:,.0f} B/turn stored for {nbytes} B payload "
            f"(x{per_turn / nbytes:.2f}); plain list x{raw_per_turn / nbytes:.2f}"
        )
        client.delete(*lists)
    client.close()
