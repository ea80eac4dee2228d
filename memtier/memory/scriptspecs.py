"""Declared inputs of every ``lua/memory`` script: KEYS by role, ARGV by name.

Callers build calls by name (``APPEND_TURN.call(keys, turn_id=..., ...)``); the order
is the script's, declared once here and checked against each script's header by
tests/memory/test_memory_script_specs.py.  Variadic tails (``snapshot_page``'s members)
follow the declared ARGV.

Variadic tails (``snapshot_page``'s members, ``restore_session``'s records and
receipts) are appended with :meth:`~memtier.scriptspec.ScriptSpec.call_with_tail`.
"""

from __future__ import annotations

from typing import Final

from memtier.scriptspec import ScriptSpec

__all__ = [
    "APPEND_TURN",
    "APPLY_COMPACTION",
    "CONTEXT_HEAD",
    "DROP_SESSION",
    "EMIT_EVENT",
    "LIST_METADATA",
    "MEMORY_SPECS",
    "PARTITION_STATS",
    "POP_TURN",
    "READ_CONTEXT",
    "READ_SESSION",
    "RESTORE_GATE",
    "RESTORE_SESSION",
    "SNAPSHOT_PAGE",
    "SWEEP_EXPIRED",
]

# The keys of one session, and of its partition that scripts touch alongside.
_SESSION: Final = ("session", "turns", "turn_ids")

APPEND_TURN: Final = ScriptSpec(
    "append_turn",
    keys=(*_SESSION, "lru", "lru_other", "index", "meta", "events", "compact"),
    argv=(
        "prefix",
        "member",
        "turn_id",
        "payload",
        "turn_bytes",
        "flags",
        "new_session_id",
        "ttl_ms",
        "other_ttl_ms",
        "max_sessions",
        "max_turns",
        "max_session_bytes",
        "max_aggregate",
        "max_tool_results",
        "max_events",
        "clock_override",
        "compact_percent",
        "id_window",
        "max_evictions",
        "sweep_n",
        "grace_ms",
        "sweep_interval_ms",
        "ttl_refresh_ms",
    ),
)
APPLY_COMPACTION: Final = ScriptSpec(
    "apply_compaction",
    keys=("session", "turns", "index", "meta", "events", "compact", "turn_ids"),
    argv=(
        "member",
        "session_id",
        "expected_sv",
        "fold_n",
        "first_seq",
        "last_seq",
        "summary",
        "ttl_ms",
        "max_session_bytes",
        "max_summary_bytes",
        "max_aggregate",
        "max_events",
        "clock_override",
        "group",
        "job_id",
    ),
)
DROP_SESSION: Final = ScriptSpec(
    "drop_session",
    keys=(*_SESSION, "lru", "index", "meta", "events"),
    argv=(
        "prefix",
        "member",
        "reason",
        "max_events",
        "clock_override",
        "receipt_key",
        "receipt_ttl_ms",
    ),
)
EMIT_EVENT: Final = ScriptSpec(
    "emit_event",
    keys=("meta", "events"),
    argv=("reason", "member", "session_id", "detail", "max_events", "clock_override"),
)
LIST_METADATA: Final = ScriptSpec(
    "list_metadata",
    keys=("index", "meta", "lru_public"),
    argv=("prefix", "cursor", "count", "public_ttl_ms", "im_ttl_ms", "clock_override"),
)
PARTITION_STATS: Final = ScriptSpec(
    "partition_stats", keys=("lru_public", "lru_im", "meta", "index"), argv=()
)
POP_TURN: Final = ScriptSpec(
    "pop_turn",
    keys=(*_SESSION, "index", "meta", "events"),
    argv=("member", "ttl_ms", "max_events", "clock_override"),
)
# The session check of a context read (MULTI + this + LRANGE of the turns + EXEC).
CONTEXT_HEAD: Final = ScriptSpec(
    "context_head",
    keys=("session", "meta"),
    argv=("ttl_ms", "clock_override"),
)
# The former context read (the turns through Lua): kept as the reference the
# transactional read is tested against (tests/memory/test_context_read.py).
READ_CONTEXT: Final = ScriptSpec(
    "read_context",
    keys=("session", "turns", "meta"),
    argv=("ttl_ms", "clock_override", "limit"),
)
READ_SESSION: Final = ScriptSpec(
    "read_session",
    keys=("session", "turns", "meta"),
    argv=("member", "ttl_ms", "clock_override"),
)
RESTORE_GATE: Final = ScriptSpec(
    "restore_gate",
    keys=("lock", "state"),
    argv=("op", "token", "lock_ms", "generation", "outcome", "force", "epoch", "unhandled"),
)
RESTORE_SESSION: Final = ScriptSpec(
    "restore_session",
    keys=(*_SESSION, "lru", "other_lru", "index", "meta", "events"),
    argv=(
        "member",
        "session_id",
        "created_ms",
        "created_wall_ms",
        "last_ms",
        "last_wall_ms",
        "seq",
        "summary",
        "summary_version",
        "age_ms",
        "read_wall_ms",
        "flush_wall_ms",
        "ttl_ms",
        "grace_ms",
        "max_sessions",
        "max_aggregate",
        "max_session_bytes",
        "max_turns",
        "max_events",
        "clock_override",
        "detail",
        "n_records",
    ),  # then the records and the receipts
)
SNAPSHOT_PAGE: Final = ScriptSpec(
    "snapshot_page",
    keys=("index", "meta"),
    argv=("prefix", "public_ttl_ms", "im_ttl_ms", "clock_override"),  # then the members
)
SWEEP_EXPIRED: Final = ScriptSpec(
    "sweep_expired",
    keys=("lru_public", "lru_im", "index", "meta", "events"),
    argv=("prefix", "public_ttl_ms", "im_ttl_ms", "max_n", "max_events", "clock_override"),
)

# Script name -> spec, for every memory script that has one.
MEMORY_SPECS: Final[dict[str, ScriptSpec]] = {
    spec.script: spec
    for spec in (
        APPEND_TURN,
        APPLY_COMPACTION,
        CONTEXT_HEAD,
        DROP_SESSION,
        EMIT_EVENT,
        LIST_METADATA,
        PARTITION_STATS,
        POP_TURN,
        READ_CONTEXT,
        READ_SESSION,
        RESTORE_GATE,
        RESTORE_SESSION,
        SNAPSHOT_PAGE,
        SWEEP_EXPIRED,
    )
}
