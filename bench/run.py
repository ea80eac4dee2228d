"""memtier benchmarks: ``python -m bench.run [--quick | --tiny]``.

Starts its own ``redis-server`` (free loopback port, temp dir), runs every
section in this process tree (plus ``redis-benchmark`` and the worker
processes it starts), prints a table of medians, spreads and same-run ratios,
writes ``bench/results/latest-<size>.json`` and ``.md``, and stops the server,
also on error or Ctrl-C.  See ``docs/performance.md``.

Sizes: ``--tiny`` (seconds; the smoke test), ``--quick`` (a few minutes:
1k/10k/100k sessions), default full run (1k/100k/1M sessions; ~20-30 minutes on
two cores).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SECTIONS = (
    "append",
    "async",
    "read",
    "metadata",
    "procs",
    "breakdown",
    "profile",
    "eviction",
    "memory",
    "scale",
    "workers",
    "threads",
    "checkpoints",
)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="a few-minute run (1k/10k/100k)")
    size.add_argument("--tiny", action="store_true", help="seconds; what the smoke test runs")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for JSON/MD/profiles")
    p.add_argument("--only", default="", help=f"comma-separated sections of: {','.join(SECTIONS)}")
    p.add_argument("--skip", default="", help="comma-separated sections to skip")
    p.add_argument("--rounds", type=int, default=0, help="override measured rounds per group")
    p.add_argument("--no-peers", action="store_true", help="leave the peer libraries out")
    return p.parse_args(argv)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks: the server stops


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for dist in ("memtier", "redis", "hiredis", "orjson", "pydantic", "pyinstrument"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "not installed"
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    from bench.framework import Harness, Settings
    from bench.probe import git_commit
    from bench.server import BenchRedis

    settings = Settings.named("tiny" if args.tiny else "quick" if args.quick else "full")
    if args.rounds > 0:
        settings.rounds = args.rounds
    wanted = set(filter(None, args.only.split(","))) or set(SECTIONS)
    wanted -= set(filter(None, args.skip.split(",")))
    unknown = wanted - set(SECTIONS)
    if unknown:
        print(f"unknown sections: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    out_dir: Path = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _on_sigterm)

    def log(msg: str) -> None:
        print(msg, flush=True)

    started = time.time()
    log(f"memtier benchmarks ({settings.profile}): starting redis-server ...")
    with BenchRedis() as server:
        admin = server.client()
        h = Harness(settings, admin, log)
        log(
            f"redis-server {server.version} on 127.0.0.1:{server.port} (pid {server.pid()},"
            f" dir {server.workdir})"
        )
        meta: dict[str, Any] = {
            "profile": settings.profile,
            "settings": vars(settings),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "git_commit": git_commit(),  # "+dirty": a tree with uncommitted changes
            "versions": {**_versions(), "redis-server": server.version},
            "cpus": os.cpu_count(),
            "server_pid": server.pid(),
            "server_port": server.port,
            "server_dir": str(server.workdir),
            "sections": sorted(wanted),
            "section_errors": {},
        }
        round_trips: float | None = None
        try:
            round_trips = _run_sections(h, server, wanted, settings, args, out_dir, meta)
        finally:
            admin.close()
    meta["duration_s"] = round(time.time() - started, 1)
    from bench.report import evaluate_targets, render_markdown, render_text, write_json

    targets = evaluate_targets(h, round_trips)
    table = render_text(h, targets)
    print(table)
    base = out_dir / f"latest-{settings.profile}"
    write_json(base.with_suffix(".json"), meta, h, targets)
    header = (
        f"memtier benchmarks, `{settings.profile}` run of {meta['started']} "
        f"(commit {meta['git_commit']}, {meta['duration_s']:.0f} s, redis-server "
        f"{server.version}, {meta['cpus']} CPUs)\n\n"
    )
    base.with_suffix(".md").write_text(header + render_markdown(h, targets), encoding="utf-8")
    log(
        f"wrote {base.with_suffix('.json')} and {base.with_suffix('.md')} "
        f"in {meta['duration_s']:.0f} s"
    )
    return 1 if meta["section_errors"] else 0


def _run_sections(
    h: Any,
    server: Any,
    wanted: set[str],
    settings: Any,
    args: argparse.Namespace,
    out_dir: Path,
    meta: dict[str, Any],
) -> float | None:
    from bench import checkpoints, multiproc, profiling, scale, workers_threads
    from bench.peers import PeerSet
    from bench.turnitems import TURN_ITEMS, turn_items_measures
    from bench.workloads import (
        CONCURRENCY,
        PAYLOAD_SIZES,
        AsyncLoop,
        Baselines,
        MemtierBench,
        chat_text,
    )

    loop = AsyncLoop()
    texts = {size: chat_text(n) for size, n in PAYLOAD_SIZES.items()}
    round_trips: float | None = None

    def section(name: str, fn: Callable[[], Any]) -> Any:
        if name not in wanted:
            return None
        h.log(f"\n-- {name} --")
        t0 = time.perf_counter()
        try:
            return fn()
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:
            meta["section_errors"][name] = f"{type(exc).__name__}: {exc}"
            h.log(f"  ! section {name} failed:\n{traceback.format_exc()}")
            h.add_error(name, exc)
            return None
        finally:
            h.log(f"  ({time.perf_counter() - t0:.0f} s)")

    try:
        base = Baselines(server, loop)
        mem = MemtierBench(server, loop)
        peers = PeerSet(server, loop)

        def peer_measures(size: str, op: str, sync: bool) -> list[Any]:
            if args.no_peers:
                return []
            ms = []
            if sync:
                ms += peers.langchain(size, texts[size]) + peers.llama_index(size, texts[size])
            else:
                ms += peers.openai_agents(size, texts[size])
            return [m for m in ms if f".{op}." in m.key]

        def append_group() -> None:
            for size, text in texts.items():
                ms = [
                    *base.append_measures(size, text),
                    base.floor_append_measure(size, text),
                    mem.append_sync(size, text),
                    mem.append_lean(size, text),
                    mem.append_script_socket(size, text),
                    mem.append_batched(size, text),
                    *peer_measures(size, "append", True),
                ]
                b = f"base.append.{size}.redispy"
                h.group(
                    f"append, sync, one connection [{size}]",
                    ms,
                    ratios={m.key: b for m in ms if m.key != b},
                )

        def async_group() -> None:
            for size, text in texts.items():
                hist = mem.histories(text)
                peer = peer_measures(size, "append", False) + peer_measures(size, "read20", False)
                ms = [
                    base.append_async_measure(size, text),
                    mem.append_async(size, text),
                    base.read_async_measure(size, text),
                    mem.read_async(size, hist),
                    *peer,
                ]
                ba, br = f"base.append.{size}.asyncio", f"base.read20.{size}.asyncio"
                h.group(
                    f"asyncio, one connection [{size}]",
                    ms,
                    ratios={
                        m.key: (ba if ".append." in m.key else br)
                        for m in ms
                        if m.key not in (ba, br)
                    },
                )
                ms = [
                    *base.concurrent_async_measures(size, text),
                    *mem.concurrent_async(size, text, hist),
                ]
                ba, br = (f"base.{op}.{size}.asyncio{CONCURRENCY}" for op in ("append", "read20"))
                h.group(
                    f"asyncio, {CONCURRENCY} coroutines on one loop [{size}]",
                    ms,
                    ratios={
                        m.key: (ba if ".append." in m.key else br)
                        for m in ms
                        if m.key not in (ba, br)
                    },
                )
            ms = [] if args.no_peers else turn_items_measures(peers, mem, texts["300B"])
            if ms:  # (the SDK not installed: reported unavailable, no group)
                b = ms[0].key
                h.group(
                    f"one agent turn's {TURN_ITEMS} items per call, asyncio, one connection [300B]",
                    ms,
                    ratios={m.key: b for m in ms[1:]},
                )

        def read_group() -> None:
            nonlocal round_trips
            for size, text in texts.items():
                hist = mem.histories(text)
                ms = [
                    *base.read_measures(size, text),
                    base.floor_read_measure(size, text),
                    mem.read_sync(size, hist),
                    mem.read_sync(size, hist, cold=True),
                    mem.read_script_socket(size, hist),
                    *peer_measures(size, "read20", True),
                ]
                b = f"base.read20.{size}.redispy"
                h.group(
                    f"read last 20 of 100 turns, sync, one connection [{size}]",
                    ms,
                    ratios={m.key: b for m in ms if m.key != b},
                )
                if size == "300B":
                    round_trips = _count_round_trips(server, mem, hist)

        def metadata_group() -> None:
            store, ms = mem.metadata(settings.metadata_sessions, texts["300B"])
            ms.append(base.metadata_measure(store, settings.metadata_sessions, 100))
            h.group(
                f"list_metadata over {settings.metadata_sessions:,} sessions",
                ms,
                ratios={
                    "memtier.metadata.page100": "base.metadata.page100",
                    "memtier.metadata.page1000": "base.metadata.page100",
                },
            )

        def procs_group() -> None:
            pool = multiproc.ProcPool(server, settings.procs)
            try:
                floor = base.floor_append_measure("300B", texts["300B"], clients=settings.procs)
                ms = [
                    *pool.measures(settings.proc_ops),
                    dataclasses.replace(floor, fixed_ops=settings.proc_ops),
                ]
                h.group(
                    f"{settings.procs} worker processes, one connection each [300B]",
                    ms,
                    ratios={
                        "procs.memtier-own": "procs.base-own",
                        "procs.memtier-shared": "procs.base-shared",
                        "procs.base-shared": "procs.base-own",
                        "procs.floor-own": "procs.base-own",
                        "procs.script-own": "procs.base-own",
                    },
                )
            finally:
                pool.close()

        section("append", append_group)
        section("async", async_group)
        section("read", read_group)
        if "append" in wanted or "read" in wanted or "async" in wanted:
            if not args.no_peers:
                peers.module_peers()
            for u in peers.unavailable:
                h.unavailable("peers", u.key, u.label, u.why)
            meta["versions"].update(peers.versions)
        section("metadata", metadata_group)
        section("procs", procs_group)
        section("breakdown", lambda: profiling.run_breakdown(h, server))
        section(
            "profile",
            lambda: meta.update(
                profiles=profiling.run_profiles(h, server, out_dir, settings.profile)
            ),
        )
        section("eviction", lambda: scale.run_eviction(h, server))
        section("memory", lambda: scale.run_memory(h, server))
        if "scale" in wanted:
            with server.client() as admin2:
                admin2.flushall()  # our own server: the growth curve starts from empty
        section("scale", lambda: scale.run_scale(h, server))
        section("workers", lambda: workers_threads.run_workers(h, server))
        section(
            "threads",
            lambda: workers_threads.run_threads(
                h,
                server,
                dataclasses.replace(
                    base.append_measures("300B", texts["300B"])[0],
                    key="threads.base.append.300B.redispy",
                ),
            ),
        )
        section("checkpoints", lambda: checkpoints.run_checkpoints(h, server))
    finally:
        loop.close()
    return round_trips


def _count_round_trips(server: Any, mem: Any, hist: Any) -> float:
    """Round trips to Redis per ``context()``: writes of a connection that counts them.

    One ``send_packed_command`` is one request on the wire whatever it carries (a
    command, a pipeline, a ``MULTI``/``EXEC`` transaction), and every reply of it is read
    before the next: counting execute_command would miss a pipeline and a lean call.  The
    client is a plain ``redis.Redis`` (memtier's lean path, as users get it)."""
    import redis

    from memtier import ConversationStore

    class Counting(redis.Connection):
        writes = 0

        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            Counting.writes += 1
            # redis-py leaves this method unannotated; the override only counts writes.
            super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]

    pool = redis.ConnectionPool(host="127.0.0.1", port=server.port, connection_class=Counting)
    client = redis.Redis(connection_pool=pool)
    store = ConversationStore(client, mem.config)
    store.context(hist.keys[0], limit=20)  # script cached on the server, connection made
    Counting.writes = 0
    n = 100
    for i in range(n):
        store.context(hist.keys[i % len(hist.keys)], limit=20)
    client.close()
    pool.disconnect()
    return Counting.writes / n


if __name__ == "__main__":
    sys.exit(main())
