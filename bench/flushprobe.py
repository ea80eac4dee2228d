"""What a snapshot flush spends its time on, against the disk it writes to.

``python -m bench.flushprobe [--quick] [--sessions N] [--turns T] [--out DIR]``

On a private ``redis-server`` (free loopback port, temp dir, stopped by pid), fills one
namespace with ``N`` sessions of ``T`` realistic 300 B turns (memtier's own
``append_turn``, pipelined), then runs ``ConversationStore.flush()`` three times into a
temp directory: twice plain (timed: the flush rate) and once under pyinstrument (the
profile, folded into the inclusive time of each stage: ``snapshot_page`` round trips,
HSCAN, reply decoding, ``session_to_json``, ``validate_session`` and its redaction re-run,
orjson, SHA-256, writes, fsync).  Between the flushes it measures the disk's sequential
write + fsync rate in the same directory with a file of the flush's size, so the ratio
compares the same disk at the same time.  ``SLOWLOG`` (threshold 0, reset before each
flush) gives the server time of every ``snapshot_page`` call: the longest one is how long
the flush held the shard, against the 2 ms target.  After each plain flush, the floor
(:mod:`bench.flushfloor`: the same ``snapshot_page`` calls with the replies written raw,
no decoding, fsync) gives ``flush vs floor`` and ``flush floor vs disk``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import pyprofile
from bench.flushfloor import flush_floor
from bench.probe import RESULTS_DIR, exit_on_sigterm, fmt, loadavg, machine_meta, spread, write_json
from bench.server import BenchRedis
from bench.workloads import KeyPool, chat_text, populate
from memtier import ConversationStore, MemtierConfig

__all__ = ["main", "sequential_write"]

TARGET_PAGE_US = 2000  # issue 12: no snapshot_page call may hold a shard longer

STAGES = [
    "flush_plan",
    "_PageWriter.write",  # the page work, run inside the executor's Overlap
    "page_lines",
    "LuaScript.__call__",
    "Redis.hscan",
    "iter_sessions",
    "session_to_json",
    "validate_session",
    "check_session_line",
    "_check_record_line",
    "check_no_secrets",
    "contains_secret",
    "validate_record",
    "GenerationWriter.add",
    "dumps",
    "HASH.update",
    "update",
    "BufferedWriter.write",
    "GenerationWriter.commit",
    "fsync",
    "SnapshotDir.retain",
    "emit_event_call",
]


def sequential_write(directory: Path, nbytes: int) -> dict[str, float]:
    """dd-like: write ``nbytes`` in 1 MiB blocks, fsync, delete; bytes per second."""
    path = directory / f".flushprobe-write-{os.getpid()}"
    block = os.urandom(1024 * 1024)
    written = 0
    t0 = time.perf_counter()
    try:
        with open(path, "wb") as fh:
            while written < nbytes:
                fh.write(block)
                written += len(block)
            fh.flush()
            os.fsync(fh.fileno())
        elapsed = time.perf_counter() - t0
    finally:
        path.unlink(missing_ok=True)
    return {"bytes": float(written), "seconds": elapsed, "bytes_per_s": written / elapsed}


def _page_durations(client: Any, sha: str) -> list[int]:
    out = []
    for entry in client.slowlog_get(1_000_000):
        cmd = bytes(entry.get("command", b""))
        if cmd.startswith(b"EVALSHA") and sha.encode() in cmd[:60]:
            out.append(int(entry["duration"]))
    return sorted(out)


def _flush(
    store: ConversationStore,
    client: Any,
    sha: str,
    profiler: Any = None,
    bounds: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """One flush (``bounds``: sessions / bytes per page instead of the defaults)."""
    from memtier.memory.persistence import flush_plan

    client.slowlog_reset()
    if profiler is not None:
        profiler.start()
    t0, cpu0 = time.perf_counter(), time.process_time()
    if bounds is None:
        res = store.flush()
    else:
        assert store.snapshots is not None
        plan = flush_plan(
            store.core, store.snapshots, page_sessions=bounds[0], page_bytes=bounds[1]
        )
        res = store.executor.run(plan)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    if profiler is not None:
        profiler.stop()
    pages = _page_durations(client, sha)
    return {
        "seconds": elapsed,
        # CPU of the whole flushing process (both threads): what load on shared cores
        # does not inflate the way it inflates wall time.
        "cpu_seconds": cpu,
        "bytes": res.bytes,
        "sessions": res.sessions,
        "skipped": dict(res.skipped),
        "bytes_per_s": res.bytes / elapsed,
        "sessions_per_s": res.sessions / elapsed,
        "page_calls": len(pages),
        "page_max_us": pages[-1] if pages else 0,
        "page_p90_us": pages[min(len(pages) - 1, int(len(pages) * 0.9))] if pages else 0,
        "page_p50_us": pages[len(pages) // 2] if pages else 0,
        "page_p99_us": pages[min(len(pages) - 1, int(len(pages) * 0.99))] if pages else 0,
        "pages_over_target": sum(1 for d in pages if d > TARGET_PAGE_US),
        "page_total_us": sum(pages),
    }


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.flushprobe", description=__doc__.split("\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="seconds: what the smoke test runs")
    p.add_argument("--sessions", type=int, default=0, help="sessions in the namespace (100k)")
    p.add_argument("--turns", type=int, default=0, help="300 B turns per session (4)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for JSON + profile")
    p.add_argument(
        "--py-spy", action="store_true", help="also sample one flush with py-spy (a child run)"
    )
    p.add_argument(
        "--bounds",
        default="",
        help="compare page bounds instead: SESSIONS/BYTES,... (e.g. 64/32768,32/16384)"
        " or 'default';"
        " each round flushes once per bound, interleaved, with a hold-floor caller",
    )
    p.add_argument("--rounds", type=int, default=3, help="rounds of --bounds (3)")
    p.add_argument("--spy-child", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


SPY_RATE = 100  # samples per second; blocking sampling pauses the child for each one


def _spy_child(sessions: int, turns: int) -> int:
    """What py-spy samples: fill a private server, then one plain flush."""
    storage = Path(tempfile.mkdtemp(prefix="memtier-flushprobe-spy-"))
    try:
        with BenchRedis() as server:
            store = ConversationStore.from_config(_config(server.url, storage), recover=False)
            populate(store, KeyPool(71, sessions).keys, chat_text(300), turns=turns, batch=1000)
            store.flush()
            store.close()
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    return 0


def _py_spy(out_dir: Path, sessions: int, turns: int, tag: str) -> dict[str, Any]:
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(exe).exists():
        return {"status": "not installed"}
    target = out_dir / f"pyspy-flush{tag}.txt"
    cmd = [exe, "record", "--format", "raw", "--rate", str(SPY_RATE), "-o", str(target), "--"]
    cmd += [sys.executable, "-m", "bench.flushprobe", "--spy-child"]
    cmd += ["--sessions", str(sessions), "--turns", str(turns)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False)
    if proc.returncode != 0:
        return {"status": "failed", "stderr": proc.stderr[-800:]}
    folded = pyprofile.fold_collapsed(
        target, "ConversationStore.flush", STAGES, rate_hz=SPY_RATE, ops=1
    )
    return {"status": "ok", "path": str(target), **folded}


def _config(url: str, storage: Path) -> MemtierConfig:
    return MemtierConfig.load(
        redis_url=url,
        namespace="flushprobe",
        conversation={
            "max_active_sessions": 1_000_000,
            "max_aggregate_bytes": 64 * 1024**3,
            "persistence_enabled": True,
            "storage_path": str(storage),
        },
    )


def _durations_of(client: Any, sha: str) -> list[int]:
    """SLOWLOG durations (us) of every call of the script ``sha``, sorted."""
    return _page_durations(client, sha)


def _pct(values: list[int], q: float) -> int:
    return values[min(len(values) - 1, int(len(values) * q))] if values else 0


def _parse_bounds(text: str) -> list[tuple[int, int]]:
    """``S/B,S/B,...``; ``default`` = the flush's own defaults (of the tree run)."""
    if text.strip().lower() == "default":
        from memtier.memory.persistence.flush import PAGE_BYTES, PAGE_SESSIONS

        return [(int(PAGE_SESSIONS), int(PAGE_BYTES))]
    out = []
    for part in text.split(","):
        n, _, b = part.strip().partition("/")
        out.append((int(n), int(b)))
    return out


def _sweep(args: argparse.Namespace, sessions: int, turns: int) -> int:
    """Flush once per page bound per round (order rotated each round), each with the
    hold-floor caller (:func:`bench.workerbench._hold_floor_caller`: a ``return 1``
    script every ms from another process) running, so the page hold and what the machine
    adds to a script of no cost are measured in the same flush."""
    import hashlib
    import multiprocessing

    from bench import workerbench

    bounds = _parse_bounds(args.bounds)
    tag = "-quick" if args.quick else ""
    args.out.mkdir(parents=True, exist_ok=True)
    storage = Path(tempfile.mkdtemp(prefix="memtier-flushprobe-"))
    extra = {"slowlog-log-slower-than": "0", "slowlog-max-len": "1000000"}
    runs: list[dict[str, Any]] = []
    ctx = multiprocessing.get_context("spawn")
    try:
        with BenchRedis(extra=extra) as server:
            client = server.client()
            store = ConversationStore.from_config(_config(server.url, storage), recover=False)
            keys = KeyPool(71, sessions).keys
            print(f"flushprobe --bounds: {sessions} sessions x {turns} turns; load {loadavg()}")
            failed = populate(store, keys, chat_text(300), turns=turns, batch=1000)
            sha = store.scripts["snapshot_page"].sha
            meta = machine_meta(client)
            meta.update(
                tool="bench.flushprobe --bounds",
                server_pid=server.pid(),
                sessions=sessions,
                turns=turns,
                payload_bytes=300,
                populate_failures=failed,
                bounds=bounds,
                rounds=args.rounds,
                page_target_us=TARGET_PAGE_US,
                hold_floor_interval_s=workerbench.HOLD_FLOOR_INTERVAL_S,
            )
            for r in range(args.rounds):
                order = bounds[r % len(bounds) :] + bounds[: r % len(bounds)]
                for bound in order:
                    script = workerbench.HOLD_FLOOR_SCRIPT.format(token=os.urandom(4).hex())
                    floor_sha = hashlib.sha1(script.encode()).hexdigest()
                    stop, out, ready = ctx.Event(), ctx.Queue(), ctx.Event()
                    proc = ctx.Process(
                        target=workerbench._hold_floor_caller,
                        args=(server.url, script, 0.0, stop, out, 0.001, ready),
                    )
                    proc.start()
                    try:
                        if not ready.wait(120):  # bounded: the caller imported, connected
                            raise RuntimeError("the hold-floor caller did not start")
                        time.sleep(0.05)  # its first calls are in flight
                        before = workerbench.server_sched(server.pid())
                        res = _flush(store, client, sha, bounds=bound)
                        after = workerbench.server_sched(server.pid())
                    finally:
                        stop.set()
                    calls = out.get(timeout=60)
                    proc.join(timeout=30)
                    floor = _durations_of(client, floor_sha)
                    res.update(
                        round=r,
                        page_sessions=bound[0],
                        page_bytes=bound[1],
                        load=loadavg(),
                        hold_floor_calls=calls,
                        hold_floor_logged=len(floor),
                        hold_floor_p50_us=_pct(floor, 0.5),
                        hold_floor_p99_us=_pct(floor, 0.99),
                        hold_floor_max_us=floor[-1] if floor else 0,
                        page_top_us=_durations_of(client, sha)[-5:],
                        # how often redis-server was preempted during the flush, and
                        # the run-queue wait that added to whatever it was running
                        server_preempted=after["nonvoluntary"] - before["nonvoluntary"],
                        server_runqueue_wait_ms=(
                            after["runqueue_wait_ns"] - before["runqueue_wait_ns"]
                        )
                        / 1e6,
                    )
                    runs.append(res)
                    print(
                        f"  round {r} {bound[0]}/{bound[1]}: {res['bytes_per_s'] / 2**20:.1f}"
                        f" MiB/s, {res['page_calls']} pages, p50/p99/max"
                        f" {res['page_p50_us']}/{res['page_p99_us']}/{res['page_max_us']} us;"
                        f" hold floor p99/max {res['hold_floor_p99_us']}/"
                        f"{res['hold_floor_max_us']} us ({calls} calls); top {res['page_top_us']};"
                        f" redis preempted {res['server_preempted']}x,"
                        f" {res['server_runqueue_wait_ms']:.0f} ms waiting; load {res['load']}",
                        flush=True,
                    )
            store.close()
            client.close()
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    summary = {}
    for n, b in bounds:
        mine = [x for x in runs if (x["page_sessions"], x["page_bytes"]) == (n, b)]
        summary[f"{n}/{b}"] = {
            key: spread([x[key] for x in mine])
            for key in (
                "bytes_per_s",
                "cpu_seconds",
                "page_calls",
                "page_p50_us",
                "page_p90_us",
                "page_p99_us",
                "page_max_us",
                "pages_over_target",
                "hold_floor_p99_us",
                "hold_floor_max_us",
            )
        }
    data = {"meta": {**meta, "load_at_end": loadavg()}, "summary": summary, "runs": runs}
    path = write_json(args.out / f"flushprobe-bounds{tag}.json", data)
    mib = 2**20
    for name, row in summary.items():
        rate = row["bytes_per_s"]
        print(
            f"{name:>12}: flush {rate['median'] / mib:.1f} [{rate['min'] / mib:.1f}-"
            f"{rate['max'] / mib:.1f}] MiB/s; page p50 {row['page_p50_us']['median']:.0f}"
            f" p99 {fmt(row['page_p99_us'], 0)} max {fmt(row['page_max_us'], 0)} us;"
            f" hold floor max {fmt(row['hold_floor_max_us'], 0)} us"
        )
    print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    exit_on_sigterm()
    sessions = args.sessions or (300 if args.quick else 100_000)
    turns = args.turns or (2 if args.quick else 4)
    if args.spy_child:
        return _spy_child(sessions, turns)
    if args.bounds:
        return _sweep(args, sessions, turns)
    tag = "-quick" if args.quick else ""
    args.out.mkdir(parents=True, exist_ok=True)
    storage = Path(tempfile.mkdtemp(prefix="memtier-flushprobe-"))
    extra = {"slowlog-log-slower-than": "0", "slowlog-max-len": "1000000"}
    try:
        with BenchRedis(extra=extra) as server:
            client = server.client()
            store = ConversationStore.from_config(_config(server.url, storage), recover=False)
            text = chat_text(300)
            keys = KeyPool(71, sessions).keys
            print(f"flushprobe: {sessions} sessions x {turns} turns; load {loadavg()}", flush=True)
            t0 = time.perf_counter()
            failed = populate(store, keys, text, turns=turns, batch=1000)
            fill_s = time.perf_counter() - t0
            sha = store.scripts["snapshot_page"].sha
            meta = machine_meta(client)
            meta.update(
                tool="bench.flushprobe",
                server_pid=server.pid(),
                sessions=sessions,
                turns=turns,
                payload_bytes=300,
                fill_s=fill_s,
                populate_failures=failed,
                storage_dir_fs=_fs_of(storage),
                page_target_us=TARGET_PAGE_US,
            )
            flushes = [{"profiled": False, "load": loadavg(), **_flush(store, client, sha)}]
            floors = [{"load": loadavg(), **flush_floor(store, storage)}]
            size = max(int(flushes[0]["bytes"]), 64 * 1024 * 1024)
            disks = [sequential_write(storage, size)]
            profile: dict[str, Any] = {}
            if pyprofile.available():
                from pyinstrument import Profiler

                profiler = Profiler(interval=0.001)
                flushes.append(
                    {"profiled": True, "load": loadavg(), **_flush(store, client, sha, profiler)}
                )
                path = args.out / f"profile-flush{tag}.txt"
                path.write_text(
                    profiler.output_text(unicode=False, color=False, show_all=False),
                    encoding="utf-8",
                )
                session = profiler.last_session
                root = None if session is None else session.root_frame()
                if root is not None:
                    profile = pyprofile.fold(root, STAGES, 1)
                    profile["profile_path"] = str(path)
            disks.append(sequential_write(storage, size))
            flushes.append({"profiled": False, "load": loadavg(), **_flush(store, client, sha)})
            floors.append({"load": loadavg(), **flush_floor(store, storage)})
            store.close()
            client.close()
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    spy: dict[str, Any] = (
        _py_spy(args.out, sessions, turns, tag) if args.py_spy else {"status": "skipped"}
    )
    plain = [f for f in flushes if not f["profiled"]]
    disk_rates = [d["bytes_per_s"] for d in disks]
    summary = {
        "flush_bytes_per_s": spread([f["bytes_per_s"] for f in plain]),
        "flush_sessions_per_s": spread([f["sessions_per_s"] for f in plain]),
        "flush_cpu_seconds": spread([f["cpu_seconds"] for f in plain]),
        "floor_cpu_seconds": spread([f["cpu_seconds"] for f in floors]),
        "disk_bytes_per_s": spread(disk_rates),
        "flush_vs_disk": spread(
            [f["bytes_per_s"] / r for f in plain for r in disk_rates]  # every pairing
        ),
        # The floor (bench/flushfloor.py): the same page calls, replies written raw.
        "floor_seconds": spread([f["seconds"] for f in floors]),
        "floor_bytes_per_s": spread(
            [p["bytes"] / f["seconds"] for p in plain for f in floors]  # the flush's bytes
        ),
        "flush_vs_floor": spread([f["seconds"] / p["seconds"] for p in plain for f in floors]),
        "floor_vs_disk": spread(
            [p["bytes"] / f["seconds"] / r for p in plain for f in floors for r in disk_rates]
        ),
        "page_max_us": spread([f["page_max_us"] for f in flushes]),
        "page_p99_us": spread([f["page_p99_us"] for f in flushes]),
        "pages_over_target": spread([f["pages_over_target"] for f in flushes]),
        "page_server_share_of_flush": spread(
            [f["page_total_us"] / 1e6 / f["seconds"] for f in plain]
        ),
    }
    data = {
        "meta": {**meta, "load_at_end": loadavg()},
        "summary": summary,
        "flushes": flushes,
        "floors": floors,
        "disk": disks,
        "profile": profile,
        "py_spy": spy,
    }
    out = write_json(args.out / f"flushprobe{tag}.json", data)
    _print(summary, flushes, profile)
    if spy.get("status") == "ok":
        print(
            f"\npy-spy, one flush: {spy['total_us'] / 1e6:.2f} s sampled, of which"
            f" {spy['waiting_us'] / 1e6:.2f} s reading the socket; inclusive (working):"
        )
        for name, us in sorted(spy["inclusive_working"].items(), key=lambda kv: -kv[1]):
            if us:
                print(f"  {us / 1e6:7.3f} s  {100 * us / spy['total_us']:5.1f} %  {name}")
    else:
        print(f"py-spy: {spy}")
    print(f"wrote {out}")
    return 0


def _fs_of(path: Path) -> str:
    best, fs = "", ""
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mnt, kind = line.split()[:3]
            if str(path).startswith(mnt) and len(mnt) > len(best):
                best, fs = mnt, f"{kind} on {mnt} ({dev})"
    except OSError:
        return ""
    return fs


def _print(summary: dict[str, Any], flushes: list[dict[str, Any]], profile: dict[str, Any]) -> None:
    mib = 1024 * 1024
    for f in flushes:
        print(
            f"  flush{' (profiled)' if f['profiled'] else ''}: {f['sessions']} sessions,"
            f" {f['bytes'] / mib:.1f} MiB in {f['seconds']:.2f} s = {f['bytes_per_s'] / mib:.1f}"
            f" MiB/s; {f['page_calls']} snapshot_page calls, longest {f['page_max_us']} us,"
            f" p99 {f['page_p99_us']} us, {f['pages_over_target']} over {TARGET_PAGE_US} us"
        )
    d = summary["disk_bytes_per_s"]
    print(
        f"  disk write+fsync: {d['median'] / mib:.0f} MiB/s"
        f" [{d['min'] / mib:.0f}-{d['max'] / mib:.0f}]"
    )
    fl = summary["floor_seconds"]
    print(
        f"  floor (same snapshot_page calls, replies written raw + fsync):"
        f" {fl['median']:.2f} s [{fl['min']:.2f}-{fl['max']:.2f}]"
    )
    fc, flc = summary["flush_cpu_seconds"], summary["floor_cpu_seconds"]
    print(
        f"  CPU of the process: flush {fc['median']:.2f} s [{fc['min']:.2f}-{fc['max']:.2f}],"
        f" floor {flc['median']:.2f} s [{flc['min']:.2f}-{flc['max']:.2f}]"
    )
    print(f"  flush / disk: {fmt(summary['flush_vs_disk'], 3)}")
    print(f"  flush floor / disk: {fmt(summary['floor_vs_disk'], 3)}")
    print(f"  flush / floor (floor seconds / flush seconds): {fmt(summary['flush_vs_floor'], 3)}")
    if profile:
        total = profile["total_us"] / 1e6
        print(f"\npyinstrument, profiled flush ({total:.2f} s): inclusive time per stage")
        for name, us in sorted(profile["inclusive"].items(), key=lambda kv: -kv[1]):
            if us:
                print(f"  {us / 1e6:7.3f} s  {100 * us / profile['total_us']:5.1f} %  {name}")
        print("self time, top 15:")
        for name, us in profile["self"][:15]:
            print(f"  {us / 1e6:7.3f} s  {name}")


if __name__ == "__main__":
    raise SystemExit(main())
