"""``memtier worker | flush | restore | inspect``: each takes argv and returns an exit code.

Configuration comes from ``--config FILE.toml`` and/or ``MEMTIER_*`` environment
variables (``MEMTIER_REDIS_URL``, ``MEMTIER_CONVERSATION__PERSISTENCE_ENABLED=true``,
``MEMTIER_CONVERSATION__STORAGE_PATH=/var/lib/memtier`` ...); the environment overrides
the file, and ``--redis-url`` / ``--namespace`` override both.  Every subcommand takes
the same flags (:mod:`memtier.clicommon`): ``-v``/``-q`` and ``--log-format json``.
Output is JSON (one object, or one per line), so it pipes into ``jq``; it never
carries conversation content.  ``flush``, ``restore`` and ``inspect sessions`` show
progress on stderr (:mod:`memtier.progress`).

The worker logs one INFO line per action by default (``-q``: warnings only).

Exit codes: 0 success, 1 the operation failed (one line on stderr), 2 bad usage or
configuration (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from memtier import metrics
from memtier.clicommon import (
    CliParser,
    add_common_arguments,
    fail,
    guarded,
    load_config,
    setup_logging,
)
from memtier.config import MemtierConfig
from memtier.errors import MemtierError
from memtier.memory.models import ConversationKey
from memtier.memory.snapshot import (
    HEADER_BLOCK,
    MAGIC,
    Rejection,
    verify_generation,
)
from memtier.memory.store import ConversationStore
from memtier.progress import Progress
from memtier.workers.worker import GROUP, Worker, WorkerOptions

__all__ = ["flush_main", "inspect_main", "restore_main", "worker_main"]

log = logging.getLogger("memtier.cli")

RESTORE_OK = ("restored", "empty", "live", "done_already", "waited")


def _parser(command: str, description: str) -> argparse.ArgumentParser:
    parser = CliParser(prog=f"memtier {command}", description=description)
    add_common_arguments(parser)
    return parser


def _config(args: argparse.Namespace) -> MemtierConfig:
    return load_config(args)


def _emit(obj: Any) -> None:
    print(json.dumps(obj, default=str, sort_keys=True), flush=True)


_fail = fail


def _open(command: str, args: argparse.Namespace, *, recover: bool) -> ConversationStore | int:
    opened: list[ConversationStore] = []

    def body() -> int:
        opened.append(ConversationStore.from_config(_config(args), recover=recover))
        return 0

    code = guarded(command, body)
    return opened[0] if opened else code


def _start_logging(command: str, args: argparse.Namespace, default: int = logging.WARNING) -> int:
    def body() -> int:
        setup_logging(args, default)
        return 0

    return guarded(command, body)


def _progress(args: argparse.Namespace, what: str, total: int | None) -> Progress | None:
    return None if args.no_progress else Progress(what, total)


def _add_progress_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")


# --------------------------------------------------------------------------- worker


def worker_main(argv: Sequence[str]) -> int:
    """Run compaction consumers, expiry sweeps and (with persistence) periodic flushes."""
    parser = _parser("worker", "Compaction jobs, expiry sweeps, snapshot flushes.")
    defaults = WorkerOptions()
    parser.add_argument("--consumer", help="consumer name (default <host>-<pid>)")
    parser.add_argument("--batch", type=int, default=defaults.batch, help="jobs per read")
    parser.add_argument("--block-ms", type=int, default=defaults.block_ms)
    parser.add_argument(
        "--claim-idle-ms",
        type=int,
        default=defaults.claim_idle_ms,
        help="take over jobs claimed by a worker that went quiet this long",
    )
    parser.add_argument("--max-deliveries", type=int, default=defaults.max_deliveries)
    parser.add_argument("--sweep-interval", type=float, default=defaults.sweep_interval_s)
    parser.add_argument(
        "--flush-interval",
        type=float,
        default=defaults.flush_interval_s,
        help="seconds between snapshot flushes when persistence is on (0 = never)",
    )
    parser.add_argument("--no-flush-on-stop", action="store_true")
    parser.add_argument(
        "--drain", action="store_true", help="exit once no job is queued or claimed"
    )
    parser.add_argument("--deadline", type=float, help="stop after this many seconds")
    parser.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus /metrics on this port (compactions, flushes, sweeps, retries)",
    )
    parser.add_argument("--metrics-host", default="127.0.0.1", help="address for --metrics-port")
    args = parser.parse_args(list(argv))
    code = guarded("worker", lambda: _check_worker_args(args))
    if code:
        return code
    code = _start_logging("worker", args, logging.INFO)  # one line per action; -q: warnings
    if code:
        return code
    opened = _open("worker", args, recover=True)
    if isinstance(opened, int):
        return opened
    store = opened
    if args.metrics_port is not None:
        # memtier_active_sessions / memtier_stored_bytes: read at scrape time (bounded).
        metrics.STORE_GAUGES.attach(lambda: _gauge_values(store))
        try:
            server = metrics.serve(args.metrics_port, args.metrics_host)
        except OSError as exc:
            store.close()
            metrics.STORE_GAUGES.attach(None)
            return _fail("worker", f"--metrics-port {args.metrics_port}: {exc}", 2)
        log.info("metrics on http://%s:%d/metrics", args.metrics_host, server.server_port)
    if store.embedded:
        log.warning("worker on the embedded in-process Redis: it only sees its own process")
    if store.last_recovery is not None:
        log.info("recovery: %s (%s)", store.last_recovery.outcome, store.last_recovery.message)
    options = WorkerOptions(
        consumer=args.consumer,
        batch=args.batch,
        block_ms=args.block_ms,
        claim_idle_ms=args.claim_idle_ms,
        max_deliveries=args.max_deliveries,
        sweep_interval_s=args.sweep_interval,
        flush_interval_s=args.flush_interval or None,
        flush_on_stop=not args.no_flush_on_stop,
    )
    worker = Worker(store, options)
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("signal %d: finishing the current job and stopping", signum)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        stats = worker.run(stop, drain=args.drain, deadline_s=args.deadline)
    except MemtierError as exc:
        return _fail("worker", exc)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        metrics.STORE_GAUGES.attach(None)
        store.close()
    _emit({"consumer": worker.consumer, **asdict(stats)})
    return 0


def _gauge_values(store: ConversationStore) -> tuple[int, int]:
    stats = store.stats()
    return stats["sessions"], stats["bytes"]


def _check_worker_args(args: argparse.Namespace) -> int:
    from memtier.errors import ConfigurationError

    if args.batch < 1:
        raise ConfigurationError("--batch must be at least 1")
    if args.deadline is not None and args.deadline <= 0:
        raise ConfigurationError("--deadline must be a positive number of seconds")
    if args.flush_interval is not None and args.flush_interval < 0:
        raise ConfigurationError("--flush-interval must be 0 (never) or positive")
    return 0


# --------------------------------------------------------------------------- flush


def flush_main(argv: Sequence[str]) -> int:
    """Write a new snapshot generation now."""
    parser = _parser("flush", "Write every live session into a new snapshot generation.")
    _add_progress_flag(parser)
    args = parser.parse_args(list(argv))
    code = _start_logging("flush", args)
    if code:
        return code
    opened = _open("flush", args, recover=False)
    if isinstance(opened, int):
        return opened
    store = opened
    try:
        if store.snapshots is None:
            return _fail(
                "flush",
                "persistence is off: set conversation.persistence_enabled = true"
                " (MEMTIER_CONVERSATION__PERSISTENCE_ENABLED=true)",
                2,
            )
        progress = _progress(args, "flush", store.stats()["sessions"])
        if progress is not None:
            store.on_script = progress.observe
        result = store.flush()
        if progress is not None:
            progress.finish()
    except MemtierError as exc:
        return _fail("flush", exc)
    finally:
        store.close()
    _emit(asdict(result))
    return 0


# --------------------------------------------------------------------------- restore


def restore_main(argv: Sequence[str]) -> int:
    """Recover from the newest valid snapshot generation (the same rules as on start)."""
    parser = _parser(
        "restore",
        "Restore the newest valid generation into an empty namespace (create-only).",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="restore even into a non-empty or already initialised namespace"
        " (live keys are never overwritten)",
    )
    parser.add_argument("--wait", type=float, help="seconds to wait for another restorer")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="only check every generation (read-only: nothing restored or quarantined)",
    )
    _add_progress_flag(parser)
    args = parser.parse_args(list(argv))
    code = _start_logging("restore", args)
    if code:
        return code
    opened = _open("restore", args, recover=False)
    if isinstance(opened, int):
        return opened
    store = opened
    try:
        if store.snapshots is None:
            return _fail("restore", "persistence is off (conversation.persistence_enabled)", 2)
        if args.verify:
            any_valid = False
            for gen in store.snapshots.generations():
                result = verify_generation(
                    gen, store.config.namespace, store.core.conv, store.snapshots.max_bytes
                )
                row: dict[str, Any] = {
                    "generation": gen.generation,
                    "path": str(gen.path),
                    "bytes": gen.size,
                    "valid": not isinstance(result, Rejection),
                }
                if isinstance(result, Rejection):
                    row.update(reason=result.reason, detail=result.detail)
                else:
                    any_valid = True
                    row["sessions"] = result.header["sessions"]
                    row["flush_wall_ms"] = result.header["flush_wall_ms"]
                _emit(row)
            return 0 if any_valid else 1
        progress = _progress(args, "restore", _newest_sessions(store))
        if progress is not None:
            store.on_script = progress.observe
        report = store.recover(force=args.force, wait_s=args.wait)
        if progress is not None:
            progress.finish()
    except MemtierError as exc:
        return _fail("restore", exc)
    finally:
        store.close()
    _emit(asdict(report))
    return 0 if report.outcome in RESTORE_OK else 1


# --------------------------------------------------------------------------- inspect


def _newest_sessions(store: ConversationStore) -> int | None:
    """Sessions in the newest generation's header (the restore's likely total)."""
    assert store.snapshots is not None
    for gen in store.snapshots.generations():
        sessions = _header_only(gen.path).get("sessions")
        return int(sessions) if isinstance(sessions, int) else None
    return None


def _header_only(path: Path) -> dict[str, Any]:
    with open(path, "rb") as fh:
        block = fh.read(HEADER_BLOCK)
    if not block.startswith(MAGIC):
        return {}
    try:
        parsed = json.loads(block[len(MAGIC) :].rstrip(b" \n"))
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def inspect_main(argv: Sequence[str]) -> int:
    """Operators' view: sessions (metadata, never content), stats, snapshots, events, jobs."""
    parser = _parser("inspect", "List session metadata, stats, snapshots, events or jobs.")
    parser.add_argument(
        "what",
        nargs="?",
        default="sessions",
        choices=("sessions", "stats", "snapshots", "events", "jobs"),
    )
    parser.add_argument("--limit", type=int, default=100, help="sessions or events shown")
    parser.add_argument("--verify", action="store_true", help="snapshots: run every check")
    parser.add_argument("--key", help="sessions: only this '<avatar-uuid>:<channel>'")
    _add_progress_flag(parser)
    args = parser.parse_args(list(argv))
    code = _start_logging("inspect", args)
    if code:
        return code
    if args.limit < 1:
        return _fail("inspect", "--limit must be at least 1", 2)
    opened = _open("inspect", args, recover=False)
    if isinstance(opened, int):
        return opened
    store = opened
    try:
        if args.what == "sessions":
            wanted = ConversationKey.from_member(args.key) if args.key else None
            total = min(store.stats()["sessions"], args.limit) if wanted is None else None
            progress = _progress(args, "inspect", total)
            shown = 0
            for meta in store.iter_metadata():
                if progress is not None:
                    progress.advance(0 if wanted else 1, meta.bytes)
                if wanted and (meta.avatar, meta.channel) != (wanted.avatar, wanted.channel):
                    continue
                _emit(meta.model_dump(mode="json"))
                shown += 1
                if shown >= args.limit:
                    break
            if progress is not None:
                progress.finish()
        elif args.what == "stats":
            _emit(dict(store.stats()))
        elif args.what == "events":
            for event in store.events(limit=min(args.limit, 1000)):
                _emit(event.model_dump(mode="json"))
        elif args.what == "jobs":
            for part in store.core.keyspace.all_partitions():
                row: dict[str, Any] = {
                    "partition": part.partition,
                    "queued": int(store.client.xlen(part.compact)),
                }
                try:
                    summary = store.client.xpending(part.compact, GROUP)
                    row["claimed"] = int(summary.get("pending", 0))
                except Exception:  # no group yet: nothing claimed
                    row["claimed"] = 0
                _emit(row)
        else:
            if store.snapshots is None:
                return _fail("inspect", "persistence is off (conversation.persistence_enabled)", 2)
            for gen in store.snapshots.generations():
                header = _header_only(gen.path)
                row = {
                    "generation": gen.generation,
                    "path": str(gen.path),
                    "bytes": gen.size,
                    "sessions": header.get("sessions"),
                    "flush_wall_ms": header.get("flush_wall_ms"),
                    "schema_version": header.get("schema_version"),
                }
                if args.verify:
                    result = verify_generation(
                        gen, store.config.namespace, store.core.conv, store.snapshots.max_bytes
                    )
                    row["valid"] = not isinstance(result, Rejection)
                    if isinstance(result, Rejection):
                        row["reason"] = result.reason
                _emit(row)
            for path in store.snapshots.quarantined():
                _emit({"quarantined": str(path), "bytes": path.stat().st_size})
    except MemtierError as exc:
        return _fail("inspect", exc)
    finally:
        store.close()
    return 0
