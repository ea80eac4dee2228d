"""Measurements of the workers for ``bench/`` (import-light; nothing here runs on import).

Bench code, not part of the package: nothing under ``memtier/`` imports it.

* :func:`bench_flush_blocking` -- how long appends from *other processes* are blocked
  while a flush of N sessions (100k by default) runs, next to the same appends without
  a flush (same run, same server); plus the flush's own write rate and the longest
  single ``snapshot_page`` call (the longest the flush holds the shard).
  Next to it, the *hold floor* of the same run: the longest SLOWLOG duration of a
  script of fixed, tiny cost (:data:`HOLD_FLOOR_SCRIPT`, ``return 1``) called at a
  steady rate by one more process during the same flush under the same load.  Whatever
  it shows above its few microseconds is this machine (redis-server descheduled while
  the script runs), not script work: how far a page hold can come down here at all.
* :func:`bench_compaction` -- sessions compacted per second by one worker.
* :func:`bench_recovery_validation` -- records validated per second (pass 1 of recovery).
* :func:`bench_flush_restore` -- one flush of N sessions, then the full restore of that
  generation into the emptied namespace (both passes and every ``restore_session``
  call): sessions/s and bytes/s of each, same run, same server.
* :func:`sequential_write_rate` -- the disk's own sequential write + fsync rate, the
  baseline for the flush figure.

Writers run in separate processes so that the latency measured is Redis blocking, not
the flushing process's GIL.  Every function returns a plain ``dict`` of numbers (seconds,
bytes, counts); none asserts anything about speed.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

__all__ = [
    "bench_compaction",
    "bench_flush_blocking",
    "bench_flush_restore",
    "bench_recovery_validation",
    "delete_namespace",
    "populate_sessions",
    "sequential_write_rate",
    "server_sched",
]

TEXT = "The quick brown fox jumps over the lazy dog while the avatar waits for a reply. "


def _config(redis_url: str, namespace: str, storage: Path | None, **conversation: Any) -> Any:
    from memtier.config import MemtierConfig

    conv: dict[str, Any] = {
        "max_active_sessions": 1_000_000,
        "max_aggregate_bytes": 64 * 1024**3,
        **conversation,
    }
    if storage is not None:
        conv.update(persistence_enabled=True, storage_path=str(storage))
    return MemtierConfig.load(redis_url=redis_url, namespace=namespace, conversation=conv)


def _text(nbytes: int) -> str:
    return (TEXT * (nbytes // len(TEXT) + 1))[:nbytes]


def populate_sessions(
    store: Any, sessions: int, *, turns: int = 2, text_bytes: int = 300, batch: int = 1000
) -> None:
    """``sessions`` sessions of ``turns`` turns; pipelined on standalone Redis."""
    from memtier.memory.models import AgentResponse, AvatarMessage, ConversationKey

    core = store.core
    pipelined = hasattr(store.client, "pipeline") and not hasattr(store.client, "get_nodes")
    script = store.scripts["append_turn"]
    if pipelined:
        store.client.script_load(script.source)
    text = _text(text_bytes)
    pending = 0
    pipe = store.client.pipeline(transaction=False) if pipelined else None
    for i in range(sessions):
        key = ConversationKey(uuid.UUID(int=i + 1), "im" if i % 2 else "public")
        for t in range(turns):
            turn = AvatarMessage(text=text) if t % 2 == 0 else AgentResponse(text=text)
            prepared = core.prepare_turn(key, turn)
            call = core.append_call(prepared)
            if pipe is None:
                store.executor.execute(call, "append")
                continue
            pipe.evalsha(script.sha, script.num_keys, *call.keys, *call.args)
            pending += 1
            if pending >= batch:
                pipe.execute()
                pending = 0
    if pipe is not None and pending:
        pipe.execute()


def _writer(redis_url: str, namespace: str, start: float, stop_at: Any, out: Any, n: int) -> None:
    """A writer process: append to its own sessions until ``stop_at`` is set."""
    from memtier.memory.models import AvatarMessage, ConversationKey
    from memtier.memory.store import ConversationStore

    store = ConversationStore.from_config(_config(redis_url, namespace, None), recover=False)
    text = _text(300)
    samples: list[tuple[float, float]] = []
    i = 0
    while time.time() < start:
        time.sleep(0.001)
    while not stop_at.is_set():
        key = ConversationKey(uuid.UUID(int=10**12 + n * 10**6 + i % 1000), "public")
        t0 = time.perf_counter()
        store.append(key, AvatarMessage(text=text))
        samples.append((time.time(), time.perf_counter() - t0))
        i += 1
    out.put(samples)
    store.close()


# A script of fixed, tiny cost: its own work is a few microseconds, so its longest SLOWLOG
# duration under the flush's load is what the machine adds (preemption of redis-server),
# not work.  The token makes its SHA unique to the run (told apart from any other script).
HOLD_FLOOR_SCRIPT = "return 1 -- memtier bench hold floor {token}"
HOLD_FLOOR_INTERVAL_S = 0.001  # one call per ms: ~1,000 samples per second of flush


def _hold_floor_caller(
    redis_url: str,
    script: str,
    start: float,
    stop_at: Any,
    out: Any,
    interval_s: float,
    ready: Any = None,
) -> None:
    """Call ``script`` (no keys) every ``interval_s`` from ``start`` until ``stop_at`` is
    set (at least once); ``ready`` (an Event) is set once the script is loaded."""
    import redis

    client = redis.Redis.from_url(redis_url)
    sha = client.script_load(script)
    if ready is not None:
        ready.set()
    calls = 0
    while time.time() < start:
        time.sleep(0.001)
    while calls == 0 or not stop_at.is_set():
        client.evalsha(sha, 0)
        calls += 1
        time.sleep(interval_s)
    out.put(calls)
    client.close()


def server_sched(pid: int | None) -> dict[str, int]:
    """redis-server's main thread: involuntary context switches (preempted while
    runnable) and the ns it spent waiting on a run queue (/proc; zeros if unreadable)."""
    if pid is None:
        return {"nonvoluntary": 0, "runqueue_wait_ns": 0}
    try:
        status = Path(f"/proc/{pid}/task/{pid}/status").read_text()
        sched = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()
    except OSError:
        return {"nonvoluntary": 0, "runqueue_wait_ns": 0}
    nonvol = 0
    for line in status.splitlines():
        if line.startswith("nonvoluntary_ctxt_switches:"):
            nonvol = int(line.split()[1])
    return {"nonvoluntary": nonvol, "runqueue_wait_ns": int(sched[1])}


def _summary(latencies: list[float]) -> dict[str, float]:
    if not latencies:
        return {"n": 0, "p50_s": float("nan"), "p99_s": float("nan"), "max_s": float("nan")}
    ordered = sorted(latencies)
    return {
        "n": len(ordered),
        "p50_s": statistics.median(ordered),
        "p99_s": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "max_s": ordered[-1],
    }


def _run_writers(
    redis_url: str,
    namespace: str,
    writers: int,
    seconds: float | None,
    during: Any = None,
    hold_floor_script: str | None = None,
    calls_out: list[int] | None = None,
) -> list[float]:
    """Appends from ``writers`` processes (their latencies) while ``during`` runs (or for
    ``seconds``); with ``hold_floor_script``, one more process calls it at a steady rate
    (its call count goes to ``calls_out``)."""
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    out = ctx.Queue()
    floor_out = ctx.Queue()
    start = time.time() + 2.0  # every writer imported and connected
    procs = [
        ctx.Process(target=_writer, args=(redis_url, namespace, start, stop, out, n))
        for n in range(writers)
    ]
    floor_proc = None
    if hold_floor_script is not None:
        floor_proc = ctx.Process(
            target=_hold_floor_caller,
            args=(redis_url, hold_floor_script, start, stop, floor_out, HOLD_FLOOR_INTERVAL_S),
        )
        floor_proc.start()
    for p in procs:
        p.start()
    try:
        while time.time() < start:
            time.sleep(0.005)
        if during is not None:
            during()
        else:
            time.sleep(seconds or 0)
    finally:
        stop.set()
    latencies: list[float] = []
    for _ in procs:
        latencies += [lat for _, lat in out.get(timeout=120)]
    for p in procs:
        p.join(timeout=60)
    if floor_proc is not None:
        calls = floor_out.get(timeout=120)
        if calls_out is not None:
            calls_out.append(calls)
        floor_proc.join(timeout=60)
    return latencies


def bench_flush_blocking(
    redis_url: str,
    *,
    sessions: int = 100_000,
    turns: int = 2,
    text_bytes: int = 300,
    writers: int = 2,
    baseline_s: float = 3.0,
    storage_path: str | Path | None = None,
    namespace: str | None = None,
    page_bounds: tuple[int, int] | None = None,
    server_pid: int | None = None,
    sample_pages: bool = False,
) -> dict[str, Any]:
    """Append latency from other processes while a flush of ``sessions`` sessions runs.

    ``page_bounds``: (sessions, bytes) per ``snapshot_page`` call instead of the flush's
    defaults (to compare bounds; the flush clamps them to its ceilings).  ``server_pid``
    (a server on this host): also ``server_preempted`` / ``server_runqueue_wait_ms``,
    how often redis-server was preempted during the flush and how long it waited to run.
    ``sample_pages`` (with ``server_pid``): redis-server's scheduler counters are read
    before and after every ``snapshot_page`` call, which tells the calls during which it
    was preempted (an involuntary switch) from those during which it ran undisturbed, and
    each call's hold inside Redis is read from SLOWLOG right after it (``page_sched``:
    ``calls_undisturbed``, ``longest_undisturbed_call_s``, ``calls_disturbed``,
    ``longest_disturbed_call_s``, ``longest_disturbed_wait_s``; holds under the SLOWLOG
    threshold count as 0).  The reads (two /proc files twice, one SLOWLOG GET per call)
    slow the flush: its rate is then not the flush's.

    Returns ``flush_s``, ``flush_bytes``, ``flush_bytes_per_s``, ``sessions``,
    ``floor_s`` (:func:`bench.flushfloor.flush_floor` of the same sessions, right after),
    ``longest_page_call_s`` (the longest ``snapshot_page`` round trip seen by the
    flusher, of the calls not overlapped with page work: client time included),
    ``server_max_page_us`` (the longest one ran inside Redis, from SLOWLOG: the
    longest the flush blocked other clients) with ``server_page_p50_us`` /
    ``server_page_p99_us`` / ``server_page_calls``, ``hold_floor_max_us`` (the longest
    SLOWLOG duration of :data:`HOLD_FLOOR_SCRIPT`, called every
    :data:`HOLD_FLOOR_INTERVAL_S` by one more process during the flush; 0 = none above
    the SLOWLOG threshold ``slowlog_threshold_us``) and ``hold_floor_calls``,
    ``server_max_other_us``, ``baseline`` and
    ``during_flush`` latency summaries
    (``n``, ``p50_s``, ``p99_s``, ``max_s``) and ``blocked_extra_max_s`` (max during the
    flush minus max without).  The namespace's keys are deleted at the end.
    """
    from bench.flushfloor import flush_floor
    from memtier.engine import Overlap, drive_sync
    from memtier.memory.persistence import flush_plan
    from memtier.memory.store import ConversationStore

    namespace = namespace or "benchflush" + os.urandom(3).hex()
    owned_dir = None
    if storage_path is None:
        owned_dir = tempfile.TemporaryDirectory(prefix="memtier-bench-flush-")
        storage_path = owned_dir.name
    config = _config(redis_url, namespace, Path(storage_path))
    store = ConversationStore.from_config(config, recover=False)
    try:
        populate_sessions(store, sessions, turns=turns, text_bytes=text_bytes)
        baseline = _run_writers(redis_url, namespace, writers, baseline_s)
        page_times: list[float] = []
        result: dict[str, Any] = {}

        # (hold in Redis s, 0 = under the SLOWLOG threshold; preempted; run-queue wait ns)
        sampled: list[tuple[float, int, int]] = []
        sampling = sample_pages and server_pid is not None
        page_sha = store.scripts["snapshot_page"].sha
        last_logged = [-1]

        def page_hold_s() -> float:
            """The call just made, from SLOWLOG: the newest page entry not seen yet (the
            flusher's calls run one at a time; the writers' appends are logged too)."""
            for entry in store.client.slowlog_get(32):
                if page_sha in _slowlog_text(entry) and int(entry["id"]) > last_logged[0]:
                    last_logged[0] = int(entry["id"])
                    return int(entry["duration"]) / 1e6
            return 0.0

        def execute(request: Any) -> Any:
            # A page call comes alone or in an Overlap (the page work runs while Redis
            # runs it): every one is sampled; only the lone ones time a round trip.
            inner = request.request if isinstance(request, Overlap) else request
            page = getattr(inner, "script", "") == "snapshot_page"
            before = server_sched(server_pid) if page and sampling else None
            t0 = time.perf_counter()
            try:
                return store.executor.execute(request)
            finally:
                if page:
                    if inner is request:
                        page_times.append(time.perf_counter() - t0)
                    if before is not None:
                        after = server_sched(server_pid)
                        sampled.append(
                            (
                                page_hold_s(),
                                after["nonvoluntary"] - before["nonvoluntary"],
                                after["runqueue_wait_ns"] - before["runqueue_wait_ns"],
                            )
                        )

        def flush() -> None:
            assert store.snapshots is not None
            before = server_sched(server_pid)
            t0 = time.perf_counter()
            bounds = {}
            if page_bounds is not None:
                bounds = {"page_sessions": page_bounds[0], "page_bytes": page_bounds[1]}
            res = drive_sync(flush_plan(store.core, store.snapshots, **bounds), execute)
            result["flush_s"] = time.perf_counter() - t0
            result["flush_bytes"] = res.bytes
            result["sessions"] = res.sessions
            after = server_sched(server_pid)
            result["server_preempted"] = after["nonvoluntary"] - before["nonvoluntary"]
            result["server_runqueue_wait_ms"] = (
                after["runqueue_wait_ns"] - before["runqueue_wait_ns"]
            ) / 1e6

        floor_script = HOLD_FLOOR_SCRIPT.format(token=os.urandom(4).hex())
        floor_sha = hashlib.sha1(floor_script.encode()).hexdigest()
        floor_calls: list[int] = []
        slowlog = _SlowLog(store.client)
        during = _run_writers(
            redis_url,
            namespace,
            writers,
            None,
            during=flush,
            hold_floor_script=floor_script,
            calls_out=floor_calls,
        )
        server = slowlog.collect(store.scripts["snapshot_page"].sha, floor_sha)
        # The floor of that flush (bench/flushfloor.py): the same page calls, replies
        # written raw, right after it (the writers have stopped).
        floor = flush_floor(store, Path(storage_path))
        base, under = _summary(baseline), _summary(during)
        if sampling:
            result["page_sched"] = _page_sched(sampled)
        return {
            **result,
            **server,
            "floor_s": floor["seconds"],
            "floor_page_calls": floor["page_calls"],
            "flush_bytes_per_s": result["flush_bytes"] / result["flush_s"],
            "longest_page_call_s": max(page_times, default=0.0),
            "page_calls": len(page_times),
            "hold_floor_calls": sum(floor_calls),
            "baseline": base,
            "during_flush": under,
            "blocked_extra_max_s": under["max_s"] - base["max_s"],
        }
    finally:
        delete_namespace(store.client, namespace)
        store.close()
        if owned_dir is not None:
            owned_dir.cleanup()


def _page_sched(sampled: list[tuple[float, int, int]]) -> dict[str, Any]:
    """The page calls split by whether redis-server was preempted during them.  (Not by
    run-queue wait: redis-server waits to run after nearly every wakeup, before it reads
    the request, which SLOWLOG does not time; an involuntary switch takes it off a CPU
    while it runs.)"""
    calm = [t for t, preempted, _ in sampled if preempted == 0]
    hit = [(t, wait) for t, preempted, wait in sampled if preempted]
    return {
        "calls": len(sampled),
        "calls_undisturbed": len(calm),
        "longest_undisturbed_call_s": max(calm, default=0.0),
        "calls_disturbed": len(hit),
        "longest_disturbed_call_s": max((t for t, _ in hit), default=0.0),
        "longest_disturbed_wait_s": max((w for _, w in hit), default=0) / 1e9,
    }


def _slowlog_text(entry: dict[str, Any]) -> str:
    """A SLOWLOG entry's command line as text (redis-py gives bytes or str)."""
    command = entry.get("command", b"")
    return command.decode("utf-8", "replace") if isinstance(command, bytes) else str(command)


SLOWLOG_THRESHOLD_US = 100  # every page (~0.5-2 ms) is logged; most appends (~50 us) not


class _SlowLog:
    """Server-side durations from SLOWLOG (threshold :data:`SLOWLOG_THRESHOLD_US` while
    the flush runs; restored).

    ``server_max_page_us``: the longest one ``snapshot_page`` call ran inside Redis --
    how long the flush blocked every other client at most -- with its p50 / p99 over the
    page calls logged; ``hold_floor_max_us``: the longest call of the hold-floor script
    (0 = none above the threshold); ``server_max_other_us``: the longest other command
    (appends) above the threshold.  None where CONFIG is not allowed.
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self.saved: dict[str, Any] | None = None
        try:
            cfg = client.config_get("slowlog-*")
            self.saved = {
                "slowlog-log-slower-than": cfg["slowlog-log-slower-than"],
                "slowlog-max-len": cfg["slowlog-max-len"],
            }
            client.config_set("slowlog-log-slower-than", SLOWLOG_THRESHOLD_US)
            client.config_set("slowlog-max-len", 100_000)
            client.slowlog_reset()
        except Exception:  # managed Redis without CONFIG: no server-side figure
            self.saved = None

    def collect(self, page_sha: str, floor_sha: str = "") -> dict[str, Any]:
        if self.saved is None:
            return {
                "server_max_page_us": None,
                "server_max_other_us": None,
                "hold_floor_max_us": None,
            }
        try:
            entries = self.client.slowlog_get(100_000)
        finally:
            for name, value in self.saved.items():
                self.client.config_set(name, value)
        pages: list[int] = []
        floor = other = 0
        for entry in entries:
            text = _slowlog_text(entry)
            duration = int(entry["duration"])
            if page_sha in text:
                pages.append(duration)
            elif floor_sha and floor_sha in text:
                floor = max(floor, duration)
            else:
                other = max(other, duration)
        pages.sort()
        return {
            "server_max_page_us": pages[-1] if pages else 0,
            "server_page_p50_us": pages[len(pages) // 2] if pages else 0,
            "server_page_p99_us": pages[min(len(pages) - 1, int(len(pages) * 0.99))]
            if pages
            else 0,
            "server_page_calls": len(pages),
            "hold_floor_max_us": floor,
            "slowlog_threshold_us": SLOWLOG_THRESHOLD_US,
            "server_max_other_us": other,
        }


def delete_namespace(client: Any, namespace: str) -> None:
    """Delete every key of ``namespace`` on ``client``'s server (SCAN, 500 keys per DEL):
    a server of our own (on a cluster, call it with each primary's own client)."""
    batch: list[Any] = []
    for key in client.scan_iter(match=f"*{namespace}*", count=1000):
        batch.append(key)
        if len(batch) >= 500:
            client.delete(*batch)
            batch.clear()
    if batch:
        client.delete(*batch)


def bench_flush_restore(
    redis_url: str,
    *,
    sessions: int = 10_000,
    turns: int = 2,
    text_bytes: int = 300,
    storage_path: str | Path | None = None,
    namespace: str | None = None,
) -> dict[str, Any]:
    """Flush ``sessions`` sessions, empty the namespace, restore the generation: rates.

    Returns ``flush_s``, ``restore_s``, the generation's ``bytes``, ``sessions`` and
    ``restored``, their per-second rates, and ``progress_calls`` (how often the restore
    reported progress).  The namespace's keys are deleted at the end.
    """
    from memtier.memory.store import ConversationStore

    namespace = namespace or "benchrestore" + os.urandom(3).hex()
    owned_dir = None
    if storage_path is None:
        owned_dir = tempfile.TemporaryDirectory(prefix="memtier-bench-restore-")
        storage_path = owned_dir.name
    store = ConversationStore.from_config(
        _config(redis_url, namespace, Path(storage_path)), recover=False
    )
    try:
        populate_sessions(store, sessions, turns=turns, text_bytes=text_bytes)
        t0 = time.perf_counter()
        flushed = store.flush()
        flush_s = time.perf_counter() - t0
        delete_namespace(store.client, namespace)
        t0 = time.perf_counter()
        report = store.recover(force=True)
        restore_s = time.perf_counter() - t0
        if report.outcome != "restored":
            raise RuntimeError(f"restore did not complete: {report.message}")
        return {
            "sessions": flushed.sessions,
            "bytes": flushed.bytes,
            "flush_s": flush_s,
            "restore_s": restore_s,
            "restored": report.restored,
            "flush_bytes_per_s": flushed.bytes / flush_s,
            "restore_bytes_per_s": flushed.bytes / restore_s,
            "flush_sessions_per_s": flushed.sessions / flush_s,
            "restore_sessions_per_s": report.restored / restore_s,
        }
    finally:
        delete_namespace(store.client, namespace)
        store.close()
        if owned_dir is not None:
            owned_dir.cleanup()


def bench_compaction(
    redis_url: str, *, sessions: int = 2000, namespace: str | None = None
) -> dict[str, Any]:
    """One worker compacting ``sessions`` queued jobs: sessions/s (and summary sizes)."""
    from memtier.memory.models import AgentResponse, AvatarMessage, ConversationKey
    from memtier.memory.store import ConversationStore
    from memtier.workers.worker import Worker, WorkerOptions

    namespace = namespace or "benchcompact" + os.urandom(3).hex()
    config = _config(redis_url, namespace, None, max_turns_per_session=50)
    store = ConversationStore.from_config(config, recover=False, inline_compaction=False)
    try:
        text = _text(300)
        for i in range(sessions):
            key = ConversationKey(uuid.UUID(int=i + 1), "public")
            for t in range(40):  # 80 % of 50 turns: one job each
                store.append(key, AvatarMessage(text=text) if t % 2 else AgentResponse(text=text))
        worker = Worker(store, WorkerOptions(block_ms=10, flush_interval_s=None))
        t0 = time.perf_counter()
        stats = worker.run(drain=True, deadline_s=3600)
        elapsed = time.perf_counter() - t0
        return {
            "sessions": sessions,
            "compacted": stats.outcomes.get("applied", 0),
            "seconds": elapsed,
            "sessions_per_s": stats.outcomes.get("applied", 0) / elapsed,
        }
    finally:
        delete_namespace(store.client, namespace)
        store.close()


def bench_recovery_validation(generation_path: str | Path, namespace: str) -> dict[str, Any]:
    """Pass 1 of recovery over one generation file: records and bytes validated per second."""
    from memtier.config import ConversationConfig
    from memtier.memory.snapshot import GenerationFile, Rejection, verify_generation

    path = Path(generation_path)
    number = int(path.name.rsplit(".", 2)[-2])
    gen = GenerationFile(number, path, path.stat().st_size)
    conv = ConversationConfig(max_snapshot_bytes=64 * 1024**3)
    t0 = time.perf_counter()
    result = verify_generation(gen, namespace, conv, 64 * 1024**3)
    elapsed = time.perf_counter() - t0
    if isinstance(result, Rejection):
        raise ValueError(f"generation rejected: {result.reason}: {result.detail}")
    return {
        "sessions": result.header["sessions"],
        "bytes": gen.size,
        "seconds": elapsed,
        "bytes_per_s": gen.size / elapsed,
        "sessions_per_s": result.header["sessions"] / elapsed,
    }


def sequential_write_rate(
    directory: str | Path, nbytes: int = 256 * 1024 * 1024
) -> dict[str, float]:
    """Write ``nbytes`` in 1 MiB blocks, fsync, delete: the disk's bytes per second."""
    path = Path(directory) / f".memtier-write-rate-{os.getpid()}"
    block = os.urandom(1024 * 1024)
    t0 = time.perf_counter()
    try:
        with open(path, "wb") as fh:
            written = 0
            while written < nbytes:
                fh.write(block)
                written += len(block)
            fh.flush()
            os.fsync(fh.fileno())
        elapsed = time.perf_counter() - t0
    finally:
        path.unlink(missing_ok=True)
    return {"bytes": float(written), "seconds": elapsed, "bytes_per_s": written / elapsed}
