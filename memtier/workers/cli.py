"""``memtier worker | flush | restore | inspect``: each takes argv and returns an exit code.

Configuration comes from ``--config FILE.toml`` and/or ``MEMTIER_*`` environment
variables (``MEMTIER_REDIS_URL``, ``MEMTIER_CONVERSATION__PERSISTENCE_ENABLED=true``,
``MEMTIER_CONVERSATION__STORAGE_PATH=/var/lib/memtier`` ...); ``--redis-url`` and
``--namespace`` override both.  Output is JSON (one object, or one per line), so it
pipes into ``jq``; it never carries conversation content.

Exit codes: 0 success, 1 the operation failed (message on stderr), 2 bad usage or
configuration.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from memtier import metrics
from memtier.config import MemtierConfig
from memtier.errors import ConfigurationError, MemtierError
from memtier.memory.models import ConversationKey
from memtier.memory.snapshot import (
    HEADER_BLOCK,
    MAGIC,
    Rejection,
    verify_generation,
)
from memtier.memory.store import ConversationStore
from memtier.workers.worker import GROUP, Worker, WorkerOptions

__all__ = ["flush_main", "inspect_main", "restore_main", "worker_main"]

log = logging.getLogger("memtier.cli")

RESTORE_OK = ("restored", "empty", "live", "done_already", "waited")


def _parser(command: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"memtier {command}", description=description)
    parser.add_argument("--config", type=Path, help="TOML configuration file")
    parser.add_argument("--redis-url", help="overrides redis_url / MEMTIER_REDIS_URL")
    parser.add_argument("--namespace", help="overrides namespace / MEMTIER_NAMESPACE")
    parser.add_argument(
        "--log-level", default="WARNING", help="DEBUG, INFO, WARNING (default), ERROR"
    )
    return parser


def _config(args: argparse.Namespace) -> MemtierConfig:
    overrides: dict[str, Any] = {}
    if args.redis_url:
        overrides["redis_url"] = args.redis_url
    if args.namespace:
        overrides["namespace"] = args.namespace
    if args.config is not None:
        return MemtierConfig.from_toml(args.config, **overrides)
    return MemtierConfig.load(**overrides)


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.WARNING),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _emit(obj: Any) -> None:
    print(json.dumps(obj, default=str, sort_keys=True), flush=True)


def _fail(command: str, exc: BaseException | str, code: int = 1) -> int:
    print(f"memtier {command}: {exc}", file=sys.stderr)
    return code


def _open(command: str, args: argparse.Namespace, *, recover: bool) -> ConversationStore | int:
    try:
        config = _config(args)
        return ConversationStore.from_config(config, recover=recover)
    except ConfigurationError as exc:
        return _fail(command, exc, 2)
    except MemtierError as exc:
        return _fail(command, exc)


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
    _setup_logging(args.log_level if args.log_level != "WARNING" else "INFO")
    if args.metrics_port is not None:
        server = metrics.serve(args.metrics_port, args.metrics_host)
        log.info("metrics on http://%s:%d/metrics", args.metrics_host, server.server_port)
    opened = _open("worker", args, recover=True)
    if isinstance(opened, int):
        return opened
    store = opened
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
        store.close()
    _emit({"consumer": worker.consumer, **asdict(stats)})
    return 0


# --------------------------------------------------------------------------- flush


def flush_main(argv: Sequence[str]) -> int:
    """Write a new snapshot generation now."""
    parser = _parser("flush", "Write every live session into a new snapshot generation.")
    args = parser.parse_args(list(argv))
    _setup_logging(args.log_level)
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
        result = store.flush()
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
    args = parser.parse_args(list(argv))
    _setup_logging(args.log_level)
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
        report = store.recover(force=args.force, wait_s=args.wait)
    except MemtierError as exc:
        return _fail("restore", exc)
    finally:
        store.close()
    _emit(asdict(report))
    return 0 if report.outcome in RESTORE_OK else 1


# --------------------------------------------------------------------------- inspect


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
    args = parser.parse_args(list(argv))
    _setup_logging(args.log_level)
    if args.limit < 1:
        return _fail("inspect", "--limit must be at least 1", 2)
    opened = _open("inspect", args, recover=False)
    if isinstance(opened, int):
        return opened
    store = opened
    try:
        if args.what == "sessions":
            wanted = ConversationKey.from_member(args.key) if args.key else None
            shown = 0
            for meta in store.iter_metadata():
                if wanted and (meta.avatar, meta.channel) != (wanted.avatar, wanted.channel):
                    continue
                _emit(meta.model_dump(mode="json"))
                shown += 1
                if shown >= args.limit:
                    break
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
