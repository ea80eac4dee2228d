"""prometheus-client collectors, all prefixed ``memtier_``.

Labels are bounded enums (reason codes, script names, operation names),
never avatar, user or channel ids.  Collectors live in the default registry
so ``memtier serve`` exposes them; with ``PROMETHEUS_MULTIPROC_DIR`` set,
prometheus-client writes them to per-process files and ``/metrics``
aggregates them (see :func:`memtier.metrics.render`).

``memtier_active_sessions`` and ``memtier_stored_bytes`` are not plain gauges: they
come from :data:`STORE_GAUGES`, a collector that reads the partition metas at scrape
time (one ``partition_stats`` script call per partition, at most once per
:data:`GAUGE_REFRESH_MIN_S`) through the reader that ``memtier serve`` and
``memtier worker`` attach; between reads it reports the last values seen (also from
``stats()``).  ``memtier_events_total`` is counted where the scripts report the
events they published (:func:`count_script_events`, :func:`count_event`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily

from memtier.memory.restorestatus import RestoreStatus
from memtier.memory.scriptspecs import DROP_SESSION, EMIT_EVENT

__all__ = [
    "ACTIVE_SESSIONS",
    "APPENDS",
    "CHECKPOINT_BYTES",
    "CHECKPOINT_OPERATIONS",
    "COMPACTIONS",
    "CONTENT_TYPE_LATEST",
    "EVENTS",
    "EVICTIONS",
    "EXPIRIES",
    "HTTP_REQUESTS",
    "HTTP_REQUEST_DURATION",
    "INTEGRATION_ITEMS_NOT_STORED",
    "POPS",
    "RETRIES",
    "SCRIPT_DURATION",
    "SNAPSHOT_FLUSHES",
    "SNAPSHOT_RESTORE_BYTES",
    "SNAPSHOT_RESTORE_SESSIONS",
    "SNAPSHOT_SESSIONS_SKIPPED",
    "STORED_BYTES",
    "STORE_GAUGES",
    "THREAD_HISTORY_ENTRIES",
    "THREAD_LEASE_BEATS",
    "THREAD_OPERATIONS",
    "THREAD_RUNNER_DURATION",
    "count_event",
    "count_script_events",
    "render",
    "serve",
]

log = logging.getLogger("memtier.metrics")

GAUGE_REFRESH_MIN_S: Final = 1.0  # scrapes closer together reuse the last read


APPENDS = Counter(
    "memtier_appends_total", "Turns appended to conversation memory.", ["role", "outcome"]
)


class StoreGauges:
    """``memtier_active_sessions`` / ``memtier_stored_bytes``, read from Redis at scrape time.

    :meth:`attach` a reader returning ``(sessions, bytes)`` (a store's ``stats``); each
    collection calls it at most once per :data:`GAUGE_REFRESH_MIN_S` and otherwise, or
    when it fails, reports the last values.  Async hosts (``memtier serve``) refresh
    with their own async read before rendering and :meth:`set` the result.  Registered
    in every registry this module builds, never written to multiprocess files: each
    process reads the same Redis, so there is nothing to aggregate.
    """

    NAMES: Final = ("memtier_active_sessions", "memtier_stored_bytes")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reader: Callable[[], tuple[int, int]] | None = None
        self._values = (0, 0)
        self._read_at = float("-inf")

    def attach(self, reader: Callable[[], tuple[int, int]] | None) -> None:
        with self._lock:
            self._reader = reader
            self._read_at = float("-inf")

    def set(self, sessions: int, nbytes: int) -> None:
        with self._lock:
            self._values = (int(sessions), int(nbytes))
            self._read_at = time.monotonic()

    def due(self) -> bool:
        with self._lock:
            return time.monotonic() - self._read_at >= GAUGE_REFRESH_MIN_S

    def values(self) -> tuple[int, int]:
        with self._lock:
            reader = self._reader
        if reader is not None and self.due():
            try:
                self.set(*reader())
            except Exception as exc:  # a scrape must not fail because Redis blinked
                log.warning("session/byte gauges not refreshed: %s", type(exc).__name__)
        with self._lock:
            return self._values

    def _families(self, values: tuple[int, int] | None) -> Iterator[GaugeMetricFamily]:
        sessions = GaugeMetricFamily(
            self.NAMES[0], "Live conversation-memory sessions, read from Redis at scrape time."
        )
        nbytes = GaugeMetricFamily(
            self.NAMES[1], "Conversation-memory bytes stored, read from Redis at scrape time."
        )
        if values is not None:
            sessions.add_metric([], values[0])
            nbytes.add_metric([], values[1])
        yield sessions
        yield nbytes

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return self._families(None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        return self._families(self.values())


class _GaugeSetter:
    """``STORED_BYTES.set(n)`` / ``ACTIVE_SESSIONS.set(n)``: feed :data:`STORE_GAUGES`."""

    def __init__(self, index: int) -> None:
        self._index = index

    def set(self, value: float) -> None:
        current = list(STORE_GAUGES._values)
        current[self._index] = int(value)
        STORE_GAUGES.set(current[0], current[1])


STORE_GAUGES = StoreGauges()
ACTIVE_SESSIONS = _GaugeSetter(0)
STORED_BYTES = _GaugeSetter(1)
EVICTIONS = Counter(
    "memtier_evictions_total", "Sessions evicted under pressure, by reason code.", ["reason"]
)
EXPIRIES = Counter(
    "memtier_expiries_total", "Sessions expired or rotated after inactivity, by reason.", ["reason"]
)
POPS = Counter(
    "memtier_pops_total", "Newest turns removed by pop, by outcome (popped or empty).", ["outcome"]
)
INTEGRATION_ITEMS_NOT_STORED = Counter(
    "memtier_integration_items_not_stored_total",
    "Framework items an adapter (memtier.integrations) did not store, by framework and reason.",
    ["framework", "reason"],
)
CHECKPOINT_OPERATIONS = Counter(
    "memtier_checkpoint_operations_total",
    "LangGraph checkpointer operations, by operation and outcome (ok or error code).",
    ["operation", "outcome"],
)
CHECKPOINT_BYTES = Counter(
    "memtier_checkpoint_bytes_written_total",
    "Bytes of checkpoints and pending writes stored by the LangGraph checkpointer.",
)
EVENTS = Counter("memtier_events_total", "Reason-code events observed, by reason.", ["reason"])
COMPACTIONS = Counter(
    "memtier_compactions_total",
    "Session compactions (inline and by workers), by outcome.",
    ["outcome"],
)
SNAPSHOT_FLUSHES = Counter(
    "memtier_snapshot_flushes_total", "Snapshot generation flushes, by outcome.", ["outcome"]
)
# Restore progress: what recovery has handled of the generation it restores, as it goes.
SNAPSHOT_RESTORE_SESSIONS = Counter(
    "memtier_snapshot_restore_sessions_total",
    "Snapshot sessions recovery has handled (restored, live already, expired, no room, skipped).",
)
SNAPSHOT_RESTORE_BYTES = Counter(
    "memtier_snapshot_restore_bytes_total",
    "Snapshot payload bytes of the sessions recovery has handled.",
)
SNAPSHOT_SESSIONS_SKIPPED = Counter(
    "memtier_snapshot_sessions_skipped_total",
    "Live sessions a flush could not write, or recovery could not restore, by stage/reason.",
    ["stage", "reason"],
)
RETRIES = Counter(
    "memtier_retries_total",
    "Operations retried after a transient Redis error.",
    ["operation", "error_type"],
)
SCRIPT_DURATION = Histogram(
    "memtier_script_duration_seconds",
    "Round-trip latency of one Lua script call, seconds.",
    ["script"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)

HTTP_REQUESTS = Counter(
    "memtier_http_requests_total",
    "HTTP requests served by memtier serve, by method, route template and status code.",
    ["method", "route", "status"],
)
HTTP_REQUEST_DURATION = Histogram(
    "memtier_http_request_duration_seconds",
    "Latency of one HTTP request in memtier serve, seconds, by method and route template.",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)

THREAD_OPERATIONS = Counter(
    "memtier_thread_operations_total",
    "Conversation-thread service operations, by operation and outcome (ok or error code).",
    ["operation", "outcome"],
)
THREAD_LEASE_BEATS = Counter(
    "memtier_thread_lease_beats_total",
    "Heartbeats of running turns, by outcome: renewed; missed (no answer before the next"
    " beat was due, or an error: the next beat tries again); lost (the lease was gone:"
    " the turn is stopped); cancelled (run_cancel marked the run).",
    ["outcome"],
)
THREAD_HISTORY_ENTRIES = Counter(
    "memtier_thread_history_entries_total",
    "History entries handed to agent turns, by where the claim found them: held (this"
    " process's history cache, not sent again), sent (inline in the claim's reply), read"
    " (fetched after the claim).  Mostly sent or read on long threads: the cache"
    " ([threads] history_cache_bytes) holds fewer threads than this process serves, and"
    " every turn sends and decodes its whole history again.",
    ["source"],
)
THREAD_RUNNER_DURATION = Histogram(
    "memtier_thread_runner_duration_seconds",
    "Wall time of one agent turn in the host runner, seconds, by outcome.",
    ["outcome"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
)


def count_event(reason: str, count: int = 1) -> None:
    """``memtier_events_total{reason}`` += count (reason: a ReasonCode value)."""
    if count > 0:
        EVENTS.labels(reason).inc(count)


_EVENT_SCRIPTS: Final = frozenset(
    ("drop_session", "sweep_expired", "emit_event", "apply_compaction", "restore_session")
)


def count_script_events(script: str, args: Sequence[Any], reply: Any) -> None:
    """Count the events a memory script reports it published (``append_turn``'s are
    counted from its receipt by the store)."""
    if script not in _EVENT_SCRIPTS:  # append_turn, context_head...: nothing to count here
        return
    try:
        if script == "drop_session" and int(reply[0]) == 1:
            count_event(_text(args[DROP_SESSION.index("reason")]))
        elif script == "sweep_expired":
            count_event("expired", int(reply[0]))
        elif script == "emit_event":
            count_event(_text(args[EMIT_EVENT.index("reason")]))
        elif script == "apply_compaction" and int(reply[0]) == 0:
            count_event("compacted")
        elif script == "restore_session":
            status = int(reply[0])
            if status == RestoreStatus.RESTORED:
                count_event("restored")
            elif status == RestoreStatus.EXPIRED:
                count_event("expired")
            elif status == RestoreStatus.NO_ROOM:
                pressure = "session" if _text(reply[1]) == "sessions" else "aggregate"
                count_event(f"evicted_{pressure}_pressure")
    except (IndexError, TypeError, ValueError):  # an unexpected reply: the caller reports it
        return


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _registry() -> CollectorRegistry:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        registry.register(STORE_GAUGES)
        return registry
    from prometheus_client import REGISTRY

    return REGISTRY


def _register_default() -> None:
    from prometheus_client import REGISTRY

    try:
        REGISTRY.register(STORE_GAUGES)
    except ValueError:  # already registered (this module imported a second time)
        pass


_register_default()


def serve(port: int, host: str = "127.0.0.1") -> Any:
    """Serve ``/metrics`` from a background thread (``memtier worker --metrics-port``).

    Returns the server; ``server.shutdown()`` stops it.  Port 0 picks a free port
    (``server.server_port``).
    """
    from prometheus_client import start_http_server

    server, _thread = start_http_server(port, addr=host, registry=_registry())
    return server


def render() -> bytes:
    """The exposition text: every process's collectors when multiprocess mode is on."""
    return generate_latest(_registry())
