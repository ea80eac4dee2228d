"""Where the time of one memtier append and one context read goes.

Two views, both from the same run:

* a **breakdown**: each client-side stage of ``append`` timed alone in a loop
  (turn model, ``prepare_turn`` = validation + redaction + bounding + JSON, of
  which the redaction, ``append_call`` = keys and ARGV, ``decode_append``), the
  whole call, and the server's CPU time per script call from ``INFO
  commandstats`` (memtier's ``append_turn`` against the minimal script);
* a **pyinstrument profile** of a loop of appends and of context reads, saved
  as text next to the JSON results (``profile-*.txt``) and excerpted in
  ``docs/performance.md``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.framework import Harness, Result, command_stats
from bench.server import BenchRedis
from bench.workloads import MINIMAL_SCRIPT, KeyPool, bench_config, chat_text, populate
from memtier import AvatarMessage, ConversationStore

__all__ = ["per_op_us", "run_breakdown", "run_profiles"]


def per_op_us(fn: Callable[[], Any], n: int) -> float:
    """Wall time per call of ``fn`` over ``n`` calls in a loop, us."""
    started = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - started) / n * 1e6


def _server_us(client: Any, command: str, fn: Callable[[], Any], n: int) -> float:
    before = command_stats(client).get(command, (0, 0))
    for _ in range(n):
        fn()
    after = command_stats(client).get(command, (0, 0))
    calls = after[0] - before[0]
    return (after[1] - before[1]) / calls if calls else float("nan")


def _per_command(client: Any, fn: Callable[[], Any], n: int) -> dict[str, tuple[float, float]]:
    """``{command: (calls per op, server us per op)}`` over ``n`` calls of ``fn``.

    Commands run inside a script are counted by Redis under their own names too, so
    this splits a script call's server time by the commands it ran; the rest of
    ``evalsha``'s time is the Lua interpreter itself (argument and reply conversion).
    """
    before = command_stats(client)
    for _ in range(n):
        fn()
    after = command_stats(client)
    out = {}
    for cmd, (calls, usec) in after.items():
        c0, u0 = before.get(cmd, (0, 0))
        if calls - c0 > 0:
            out[cmd] = ((calls - c0) / n, (usec - u0) / n)
    return dict(sorted(out.items(), key=lambda kv: -kv[1][1]))


def _command_rows(h: Harness, what: str, per: dict[str, tuple[float, float]]) -> None:
    script = per.get("evalsha", (0.0, 0.0))[1]
    inner = sum(us for cmd, (_, us) in per.items() if cmd != "evalsha")
    for cmd, (calls, us) in per.items():
        h.add(
            Result(
                f"breakdown.commands.{what}.{cmd}",
                "breakdown: Redis server time per operation, by command",
                f"{what}: {cmd.upper()} ({calls:.2f} calls/op)",
                "us/op",
                values=[us],
                higher_is_better=False,
                baseline="evalsha total" if cmd != "evalsha" else None,
                ratios=[us / script] if cmd != "evalsha" and script else None,
            )
        )
    if script:
        h.add(
            Result(
                f"breakdown.commands.{what}.lua",
                "breakdown: Redis server time per operation, by command",
                f"{what}: Lua itself (EVALSHA minus the commands it ran)",
                "us/op",
                values=[script - inner],
                higher_is_better=False,
                baseline="evalsha total",
                ratios=[(script - inner) / script],
            )
        )


def _stages(
    client: Any, store: ConversationStore, sha: str, nbytes: int, n: int
) -> list[tuple[str, str, float]]:
    """(stage, label, us per op) for one payload size."""
    from memtier.redaction import redact

    core = store.core
    text = chat_text(nbytes)
    pool = KeyPool(40 + nbytes, 1000)
    key = pool.keys[0]
    turn = AvatarMessage(text=text)
    prepared = core.prepare_turn(key, turn)
    store.append(key, turn)  # loads the script
    call = core.append_call(prepared)
    reply = store.scripts["append_turn"](client, call.keys, call.args)
    stages: list[tuple[str, str, float]] = [
        (
            "model",
            "AvatarMessage(text=...) (pydantic)",
            per_op_us(lambda: AvatarMessage(text=text), n),
        ),
        (
            "prepare",
            "core.prepare_turn: validate + redact + bound + JSON",
            per_op_us(lambda: core.prepare_turn(key, turn), n),
        ),
        ("redact", "  of which redaction.redact() once", per_op_us(lambda: redact(text), n)),
        (
            "append_call",
            "core.append_call: keys + 21 ARGV",
            per_op_us(lambda: core.append_call(prepared), n),
        ),
        (
            "decode",
            "core.decode_append: receipt model",
            per_op_us(lambda: core.decode_append(prepared, reply), n),
        ),
        (
            "total",
            "store.append: the whole call (one round trip)",
            per_op_us(lambda: store.append(pool.next(), AvatarMessage(text=text)), n),
        ),
        (
            "server",
            "  of which Redis CPU in append_turn (commandstats)",
            _server_us(
                client,
                "evalsha",
                lambda: store.append(pool.next(), AvatarMessage(text=text)),
                n,
            ),
        ),
        (
            "server_min",
            "Redis CPU in the minimal script (commandstats)",
            _server_us(
                client,
                "evalsha",
                lambda: client.evalsha(
                    sha, 4, "{bq}:q:0", "{bq}:t:0", "{bq}:meta", "{bq}:lru", text, "m0"
                ),
                n,
            ),
        ),
        (
            "rtt_min",
            "raw EVALSHA minimal script, redis-py: the whole call",
            per_op_us(
                lambda: client.evalsha(
                    sha, 4, "{bq}:q:1", "{bq}:t:1", "{bq}:meta", "{bq}:lru", text, "m1"
                ),
                n,
            ),
        ),
    ]
    return stages


def run_breakdown(h: Harness, server: BenchRedis) -> None:
    n = h.settings.profile_ops
    client = server.client()
    store = ConversationStore(client, bench_config("bprof"))
    sha = client.script_load(MINIMAL_SCRIPT.read_text(encoding="utf-8"))
    text = chat_text(300)
    pool = KeyPool(45, 1000)
    reads = KeyPool(46, 32)
    populate(store, reads.keys, text, turns=100, unique_ids=True)
    for key in pool.keys[:100]:
        store.append(key, AvatarMessage(text=text))
    _command_rows(
        h,
        "append 300B",
        _per_command(client, lambda: store.append(pool.next(), AvatarMessage(text=text)), n),
    )
    _command_rows(
        h,
        "context last 20 of 100",
        _per_command(client, lambda: store.context(reads.next(), limit=20), n),
    )
    for size, nbytes in (("300B", 300), ("4KiB", 4096)):
        stages = _stages(client, store, sha, nbytes, n)
        total = next(v for k, _, v in stages if k == "total")
        for stage, label, us in stages:
            h.add(
                Result(
                    f"breakdown.append.{size}.{stage}",
                    "breakdown",
                    f"{label} [{size}]",
                    "us/op",
                    values=[us],
                    higher_is_better=False,
                    baseline="store.append total",
                    ratios=[us / total] if total else None,
                )
            )
        h.log(f"  append [{size}]: " + ", ".join(f"{k} {v:.1f}" for k, _, v in stages) + " us")
    client.close()


def run_profiles(h: Harness, server: BenchRedis, out_dir: Path, tag: str) -> dict[str, str]:
    """pyinstrument text profiles of append and context loops; returns {name: path}."""
    try:
        from pyinstrument import Profiler
    except ImportError:
        h.log("  pyinstrument not installed: no profiles (pip install 'memtier[bench]')")
        return {}
    n = h.settings.profile_ops
    client = server.client()
    store = ConversationStore(client, bench_config("bprof2"))
    text = chat_text(300)
    pool = KeyPool(77, 1000)
    reads = KeyPool(78, 32)
    populate(store, reads.keys, text, turns=100)
    for _ in range(min(n, 200)):
        store.append(pool.next(), AvatarMessage(text=text))
    out: dict[str, str] = {}
    loops: dict[str, Callable[[], Any]] = {
        "append-300B": lambda: store.append(pool.next(), AvatarMessage(text=text)),
        "context-300B": lambda: store.context(reads.next(), limit=20),
    }
    for name, fn in loops.items():
        profiler = Profiler(interval=0.0002)
        profiler.start()
        for _ in range(n):
            fn()
        profiler.stop()
        text_out = profiler.output_text(unicode=False, color=False, show_all=False)
        path = out_dir / f"profile-{tag}-{name}.txt"
        path.write_text(text_out, encoding="utf-8")
        out[name] = str(path)
        h.log(f"  profile {name}: {path}")
    client.close()
    return out
