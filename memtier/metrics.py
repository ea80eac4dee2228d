"""prometheus-client collectors, all prefixed ``memtier_``.

Labels are bounded enums (reason codes, script names, operation names),
never avatar, user or channel ids.  Collectors live in the default registry
so ``memtier serve`` exposes them; with ``PROMETHEUS_MULTIPROC_DIR`` set,
prometheus-client writes them to per-process files and ``/metrics``
aggregates them (see :func:`memtier.metrics.render`).
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

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
    "INTEGRATION_ITEMS_NOT_STORED",
    "POPS",
    "RETRIES",
    "SCRIPT_DURATION",
    "SNAPSHOT_FLUSHES",
    "STORED_BYTES",
    "THREAD_OPERATIONS",
    "THREAD_RUNNER_DURATION",
    "render",
    "serve",
]

APPENDS = Counter(
    "memtier_appends_total", "Turns appended to conversation memory.", ["role", "outcome"]
)
STORED_BYTES = Gauge(
    "memtier_stored_bytes",
    "Conversation-memory bytes stored, as last reported by Redis.",
    multiprocess_mode="livemax",
)
ACTIVE_SESSIONS = Gauge(
    "memtier_active_sessions",
    "Live conversation-memory sessions, as last reported by Redis.",
    multiprocess_mode="livemax",
)
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

THREAD_OPERATIONS = Counter(
    "memtier_thread_operations_total",
    "Conversation-thread service operations, by operation and outcome (ok or error code).",
    ["operation", "outcome"],
)
THREAD_RUNNER_DURATION = Histogram(
    "memtier_thread_runner_duration_seconds",
    "Wall time of one agent turn in the host runner, seconds, by outcome.",
    ["outcome"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
)


def _registry() -> CollectorRegistry:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return registry
    from prometheus_client import REGISTRY

    return REGISTRY


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
