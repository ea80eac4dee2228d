"""Every bound memtier enforces: a default and a hard ceiling in code.

Configuration may only lower a bound; a value above its hard ceiling is a
:class:`~memtier.errors.ConfigurationError` naming the field and the ceiling.

A configurable bound names its config ``section`` and ``field``: that one
:class:`Bound` is where the limit is written.  :mod:`memtier.config` takes from it the
field's default, its validation (minimum, finite, hard ceiling) and the section's
``BOUNDS``; the scripts get the field's value as their ARGV.  The section declares
the field with its type only (``max_events: int = FROM_BOUND``, see
:mod:`memtier.config`), and the config refuses
to import when a field and a Bound do not match (tests/memory/test_config_bounds.py
pins it too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["Bound", "configurable", "describe"]

KiB: Final = 1024
MiB: Final = 1024 * KiB
GiB: Final = 1024 * MiB


@dataclass(frozen=True, slots=True)
class Bound:
    """One configurable bound: ``default`` <= ``ceiling``; ``minimum`` keeps configs sane."""

    default: float
    ceiling: float
    minimum: float
    unit: str
    # The config section and field this bound is (""  = not configurable).
    section: str = ""
    field: str = ""

    def describe(self, value: float) -> str:
        """``value`` exactly, in this bound's unit (see :func:`describe`)."""
        return describe(value, self.unit)


def _exact(value: float) -> str:
    """``value`` without rounding: an integer as one, otherwise the shortest float repr."""
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


_BINARY_UNITS: Final = (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))


def describe(value: float, unit: str) -> str:
    """A bound for people: exact, with a human unit -- ``4 MiB (4194304 bytes)``,
    ``1800 s (30 min)``, ``100000 sessions``."""
    if unit == "bytes" and float(value).is_integer():
        n = int(value)
        for name, size in _BINARY_UNITS:
            if n >= size and n % size == 0:
                return f"{n // size} {name} ({n} bytes)"
        return f"{n} bytes"
    if unit == "s" and float(value).is_integer() and value >= 60:
        n = int(value)
        human = f"{n // 3600} h" if n % 3600 == 0 else f"{n // 60} min" if n % 60 == 0 else ""
        if human:
            return f"{n} s ({human})"
    return f"{_exact(value)} {unit}"


# --- conversation memory -------------------------------------------------------------------
# Spec: public sessions expire at exactly 30 minutes of inactivity, IM at exactly 24 hours.
# These are ceilings as well as defaults: configuration may shorten, never lengthen, them.
PUBLIC_TTL_SECONDS: Final = Bound(1800.0, 1800.0, 0.001, "s", "conversation", "public_ttl_seconds")
IM_TTL_SECONDS: Final = Bound(86400.0, 86400.0, 0.001, "s", "conversation", "im_ttl_seconds")
# 1M live sessions fit one Redis of a few GiB (see README, memory per session).
MAX_ACTIVE_SESSIONS: Final = Bound(
    100_000, 1_000_000, 1, "sessions", "conversation", "max_active_sessions"
)
MAX_TURNS_PER_SESSION: Final = Bound(
    200, 2_000, 4, "turns", "conversation", "max_turns_per_session"
)
MAX_SESSION_BYTES: Final = Bound(
    256 * KiB, 4 * MiB, 1 * KiB, "bytes", "conversation", "max_session_bytes"
)
MAX_AGGREGATE_BYTES: Final = Bound(
    1 * GiB, 64 * GiB, 1 * KiB, "bytes", "conversation", "max_aggregate_bytes"
)
MAX_TOOL_RESULTS: Final = Bound(
    32, 256, 1, "tool results per session", "conversation", "max_tool_results"
)
MAX_TOOL_RESULT_BYTES: Final = Bound(
    4 * KiB, 64 * KiB, 64, "bytes", "conversation", "max_tool_result_bytes"
)
MAX_SUMMARY_BYTES: Final = Bound(
    8 * KiB, 64 * KiB, 256, "bytes", "conversation", "max_summary_bytes"
)
# Minimum: the smallest generation file that can be written, an empty one -- the fixed
# header block of the snapshot format (memtier.memory.snapshot.HEADER_BLOCK, 4 KiB; a test
# keeps the two equal).  Below it a store would publish a file over its own ceiling.
MAX_SNAPSHOT_BYTES: Final = Bound(
    1 * GiB, 64 * GiB, 4 * KiB, "bytes", "conversation", "max_snapshot_bytes"
)
MAX_TURN_BYTES: Final = Bound(16 * KiB, 256 * KiB, 64, "bytes", "conversation", "max_turn_bytes")
MAX_EVENTS: Final = Bound(10_000, 100_000, 16, "events per partition", "conversation", "max_events")

# Not configurable: fixed protocol bounds.
MAX_PARTITIONS: Final = 1024  # one hash tag (slot) each; 1 = exact global LRU
MAX_NAME_BYTES: Final = 64  # tool and action names (ASCII: memtier.memory.models.NAME_GRAMMAR)
# Raw text longer than this many times max_turn_bytes is refused before redaction runs, so
# one call cannot make the caller's process scan megabytes (redaction is linear, not free).
MAX_RAW_INPUT_FACTOR: Final = 16
# A script that evicts blocks its shard: cap victims per append (64 sessions is well
# under a millisecond of Lua). An append that would need more is refused, nothing changed.
MAX_EVICTIONS_PER_CALL: Final = 64
# Expired sessions swept opportunistically by each write script, and per sweep call.
SWEEP_PER_WRITE: Final = 8
# ... at most this often per partition (clock ms), and always before evicting anything.
SWEEP_INTERVAL_MS: Final = 1_000
SWEEP_PER_CALL: Final = 256
# store.sweep() calls per partition (each of SWEEP_PER_CALL sessions): a backlog clears in
# one sweep() without an unbounded loop.
SWEEP_ROUNDS: Final = 64
# Receipts kept per session for idempotent retries: retries come seconds after the
# first attempt, so the newest 1024 turn ids of a session are far more than enough.
IDEMPOTENCY_WINDOW: Final = 1024
# Redis key TTL = channel TTL + grace: the sweeper publishes the expiry event within the
# grace; if no sweeper runs, Redis still drops the content at most this late.
EXPIRY_GRACE_MS: Final = 5_000
# An append re-sets its keys' TTLs only when this much server time passed since the last
# PEXPIRE (must stay below the grace: keys then live ttl + grace - this .. ttl + grace).
TTL_REFRESH_MS: Final = 1_000
# append_many: turns one call takes (its turn ids then fit the idempotency window, so the
# same call sent again with the same ids stores nothing twice), and turns and payload bytes
# of one append_turn call (one round trip).  One call of 16 turns holds the shard for less
# than one snapshot page (~1 ms); append_turn itself refuses more than 16 turns a call.
MAX_APPEND_MANY_TURNS: Final = IDEMPOTENCY_WINDOW
APPEND_BATCH_TURNS: Final = 16
APPEND_BATCH_BYTES: Final = 512 * KiB
# Paging: list_metadata and events pages.
METADATA_PAGE: Final = Bound(100, 1_000, 1, "sessions per page")
EVENTS_PAGE: Final = Bound(100, 1_000, 1, "events per page")
# A compaction job is queued when a session passes this fraction of any of its bounds.
COMPACTION_TRIGGER_PERCENT: Final = 80

# --- the Redis connection (MEMTIER_REDIS__*) --------------------------------------------------
# Connections per Redis node (and commands in flight per store or service): callers beyond it
# wait up to the pool timeout for a free connection (back-pressure), then get backend_busy.
REDIS_MAX_CONNECTIONS: Final = Bound(
    50, 1_000, 1, "connections per node", "redis", "max_connections"
)
REDIS_POOL_TIMEOUT_SECONDS: Final = Bound(10.0, 60.0, 0.001, "s", "redis", "pool_timeout_seconds")
# memtier's own socket deadlines (redis-py < 8 had none): a reply or a connect slower than
# this is a timeout (an unknown outcome, retried).  Above the worker's XREADGROUP block.
REDIS_SOCKET_TIMEOUT_SECONDS: Final = Bound(5.0, 60.0, 0.05, "s", "redis", "socket_timeout_seconds")
REDIS_CONNECT_TIMEOUT_SECONDS: Final = Bound(
    2.0, 30.0, 0.05, "s", "redis", "connect_timeout_seconds"
)
# Transient failures are retried until this long after the first attempt: Redis Cluster's
# default cluster-node-timeout (15 s) plus a margin, so a primary's failover is covered.
RETRY_HORIZON_SECONDS: Final = Bound(20.0, 120.0, 0.0, "s", "redis", "retry_horizon_seconds")
# ... and never more than this many attempts in all, whatever the horizon.
RETRY_MAX_ATTEMPTS: Final = 40
# Auto-pipelining (asyncio, standalone): script calls issued in one event-loop tick share one
# write and one round trip on one pooled connection.  A batch holds at most this many calls and
# this many packed bytes (one call larger than the byte bound goes alone); a bigger tick is
# split into several batches.  Both bound how much one connection failure can put in doubt
# and how long one batch holds its connection.
REDIS_PIPELINE_MAX_CALLS: Final = Bound(
    128, 1_024, 1, "script calls per round trip", "redis", "pipeline_max_calls"
)
REDIS_PIPELINE_MAX_BYTES: Final = Bound(
    1 * MiB, 16 * MiB, 1 * KiB, "bytes", "redis", "pipeline_max_bytes"
)
# durability="replicated": an append is acknowledged only once this many replicas confirmed
# it (WAIT), waiting at most this long; otherwise outcome_unknown.
WAIT_REPLICAS: Final = Bound(1, 8, 1, "replicas", "redis", "wait_replicas")
WAIT_TIMEOUT_MS: Final = Bound(1_000, 30_000, 10, "ms", "redis", "wait_timeout_ms")
# How long an operator delete/expire keeps its result for its own retries: longer than the
# longest retry horizon, so a retry after a lost reply reports what the first attempt did.
DROP_RECEIPT_MS: Final = 300_000

# --- conversation threads (spec "frozen limits": default / hard cap) -------------------------
THREAD_LIST_PAGE: Final = Bound(50, 200, 1, "threads", "threads", "list_page")
REPLAY_PAGE_ROWS: Final = Bound(100, 500, 1, "rows", "threads", "replay_page_rows")
CURSOR_BYTES: Final = Bound(4 * KiB, 16 * KiB, 256, "bytes", "threads", "cursor_bytes")
THREAD_TITLE_BYTES: Final = Bound(256, 2 * KiB, 1, "bytes", "threads", "title_bytes")
REQUEST_ID_BYTES: Final = Bound(256, 2 * KiB, 1, "bytes", "threads", "request_id_bytes")
ACTIVE_BRANCHES: Final = Bound(16, 64, 1, "branches", "threads", "max_active_branches")
EXPORT_BYTES: Final = Bound(8 * MiB, 32 * MiB, 1 * KiB, "bytes", "threads", "export_bytes")
EXPORT_PAGES: Final = Bound(100, 500, 1, "pages", "threads", "export_pages")
REQUEST_BODY_BYTES: Final = Bound(
    64 * KiB, 1 * MiB, 1 * KiB, "bytes", "threads", "request_body_bytes"
)
# The history cache of one service (memtier.threads.historycache): entry bytes it keeps in
# all (plus the models decoded from them), and threads.  A process serving more long
# threads than fit sends and decodes each turn's whole history again (0: keep none).
HISTORY_CACHE_BYTES: Final = Bound(8 * MiB, 256 * MiB, 0, "bytes", "threads", "history_cache_bytes")
HISTORY_CACHE_THREADS: Final = Bound(256, 16_384, 0, "threads", "threads", "history_cache_threads")

# Fixed bounds of the threads service (not configurable; memtier/threads/__init__.py explains).
THREAD_MESSAGE_BYTES: Final = 256 * KiB  # one user message (refused above) or reply (truncated)
THREAD_METADATA_BYTES: Final = 16 * KiB  # host metadata of one thread, as JSON
THREAD_EVENT_BYTES: Final = 16 * KiB  # data of one runner event after redaction (cut above)
THREAD_RUN_OPTIONS_BYTES: Final = 16 * KiB  # run options of one continue, as JSON
THREAD_EVENTS_PER_TURN: Final = 256  # runner events kept per turn; later ones counted, dropped
THREAD_MAX_ENTRIES: Final = 2_000  # entries per thread (a turn adds 2): 1000 turns
THREAD_MAX_EVENTS: Final = 100_000  # ledger rows per thread (the ledger is never trimmed)
THREAD_MAX_BYTES: Final = 64 * MiB  # entries + ledger bytes per thread
THREADS_PER_OWNER: Final = 10_000  # threads one (tenant, user) may hold
THREAD_LEASE_MS: Final = 30_000  # lease of a running turn; renewed every third of it
THREAD_WAIT_CEILING_S: Final = 300.0  # longest a continue may wait for a busy thread/duplicate

# --- LangGraph checkpointer (memtier.integrations.langgraph) ------------------------------
# Per thread: a TTL refreshed on every write, and a byte ceiling over everything it stores.
CHECKPOINT_THREAD_TTL_SECONDS: Final = Bound(7 * 86400.0, 30 * 86400.0, 1.0, "s")
CHECKPOINT_THREAD_BYTES: Final = Bound(16 * MiB, 256 * MiB, 1 * KiB, "bytes")
CHECKPOINT_LIST_PAGE: Final = 100  # checkpoints read per round trip while listing
CHECKPOINT_LIST_THREADS: Final = 10_000  # threads one list(None) call walks at most
CHECKPOINT_RUN_THREADS: Final = 10_000  # threads one delete_for_runs walks per run id
CHECKPOINT_ID_CHARS: Final = 1024  # thread ids, namespaces, checkpoint ids, channels


def configurable(section: str) -> dict[str, Bound]:
    """The bounds of one config section (``conversation``, ``threads``, ``redis``), by
    field name, in the order they are written here."""
    return {
        value.field: value
        for value in globals().values()
        if isinstance(value, Bound) and value.section == section
    }
