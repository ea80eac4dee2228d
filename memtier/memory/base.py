"""What the sync and asyncio conversation-memory stores share: state, bookkeeping, results.

Everything here is I/O-free.  :class:`StoreBase` holds the configuration and builds
the requests and results around each call; :class:`~memtier.memory.store.ConversationStore`
and :class:`~memtier.memory.aio.AsyncConversationStore` only perform the I/O (and the
retry around it), so the two APIs cannot drift.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from typing import Any

from memtier import limits, metrics
from memtier.config import MemtierConfig
from memtier.errors import SnapshotError, ValidationError
from memtier.memory.compaction import Summarizer, compaction_plan, with_fallback
from memtier.memory.core import MemoryCore, PreparedTurn, ScriptCall
from memtier.memory.models import (
    AppendReceipt,
    ConversationKey,
    MetadataPage,
    ReasonCode,
    Role,
    Turn,
    TurnRecord,
)
from memtier.memory.persistence import RecoveryReport, recover_plan
from memtier.memory.plans import Plan
from memtier.memory.snapshot import SnapshotDir
from memtier.scripts import load_registry

__all__ = ["KeyLike", "StoreBase", "StoreStats", "page_size"]

KeyLike = ConversationKey | tuple[Any, Any]


# APPENDS children by (role, duplicate): a small fixed set (4 roles x 2 outcomes).
_APPEND_COUNTERS: dict[tuple[Role, bool], Any] = {}


class StoreStats(dict[str, int]):
    """``{"sessions": n, "bytes": n}`` summed over partitions."""


def page_size(limit: int | None, bound: limits.Bound) -> int:
    """A page size within ``bound`` (its default when ``limit`` is None)."""
    if limit is None:
        return int(bound.default)
    if not 1 <= limit <= bound.ceiling:
        raise ValidationError(f"limit must be between 1 and {bound.ceiling:g}", field="limit")
    return int(limit)


class StoreBase:
    """State and I/O-free steps of a conversation-memory store (see the subclasses)."""

    def __init__(
        self,
        client: Any,
        config: MemtierConfig | None = None,
        *,
        clock: Callable[[], int] | None = None,
        embedded: bool = False,
        summarizer: Summarizer | None = None,
        inline_compaction: bool = True,
        snapshots: SnapshotDir | None = None,
    ) -> None:
        self.config = config or MemtierConfig.load()
        self.client = client
        self.embedded = embedded
        # ``clock`` is the test-only clock hook (ms); production leaves it None so the
        # scripts read Redis server TIME.  It is not reachable from configuration.
        self.core = MemoryCore(self.config, clock=clock)
        self.scripts = load_registry("memory")
        # Compaction (memtier.memory.compaction): the summarizer hook (None = the
        # deterministic default) and whether append compacts inline on SESSION_FULL.
        self.summarizer = summarizer
        self.inline_compaction = inline_compaction
        # Snapshot files (memtier.memory.snapshot): None = persistence off.
        self.snapshots = snapshots
        self.last_recovery: RecoveryReport | None = None
        # Called with (script, args, reply) after each script call: the CLI's progress
        # display (memtier.progress) hooks in here.  None by default.
        self.on_script: Callable[[str, Sequence[Any], Any], None] | None = None

    # --- append --------------------------------------------------------------------------------
    def _prepare(self, key: KeyLike, turn: Turn) -> PreparedTurn:
        return self.core.prepare_turn(self.core.coerce_key(key), turn)

    def _inline_compaction(self, prepared: PreparedTurn) -> Plan[Any]:
        """The compaction that makes room for ``prepared`` when its session is full."""
        return compaction_plan(
            self.core,
            prepared.key,
            summarizer=with_fallback(self.summarizer),
            force=True,
            incoming_bytes=prepared.turn_bytes,
            incoming_tool=prepared.turn.kind == "tool",
        )

    @staticmethod
    def _count_append(prepared: PreparedTurn, receipt: AppendReceipt) -> AppendReceipt:
        outcome = (prepared.turn.role, receipt.duplicate)
        child = _APPEND_COUNTERS.get(outcome)
        if child is None:  # one lookup per (role, outcome) per process, not per append
            label = "duplicate" if receipt.duplicate else "stored"
            child = _APPEND_COUNTERS[outcome] = metrics.APPENDS.labels(outcome[0].value, label)
        child.inc()
        if receipt.duplicate:  # a retry's first receipt: its events were counted then
            return receipt
        # The events append_turn published (memtier_events_total), from its receipt.
        if receipt.rotated:  # two events: the old session `expired`, the new one `rotated`
            metrics.EXPIRIES.labels(ReasonCode.ROTATED.value).inc()
            metrics.count_event(ReasonCode.EXPIRED.value)
            metrics.count_event(ReasonCode.ROTATED.value)
        if receipt.swept:
            metrics.EXPIRIES.labels(ReasonCode.EXPIRED.value).inc(receipt.swept)
            metrics.count_event(ReasonCode.EXPIRED.value, receipt.swept)
        if receipt.evicted_for_sessions:
            metrics.EVICTIONS.labels(ReasonCode.EVICTED_SESSION_PRESSURE.value).inc(
                receipt.evicted_for_sessions
            )
            metrics.count_event(
                ReasonCode.EVICTED_SESSION_PRESSURE.value, receipt.evicted_for_sessions
            )
        if receipt.evicted > receipt.evicted_for_sessions:
            by_bytes = receipt.evicted - receipt.evicted_for_sessions
            metrics.EVICTIONS.labels(ReasonCode.EVICTED_AGGREGATE_PRESSURE.value).inc(by_bytes)
            metrics.count_event(ReasonCode.EVICTED_AGGREGATE_PRESSURE.value, by_bytes)
        return receipt

    @staticmethod
    def _count_append_error(
        prepared: PreparedTurn, exc: BaseException, swept_before: int = 0
    ) -> None:
        """Count a failed append, and the expired sessions it swept before it was refused."""
        metrics.APPENDS.labels(prepared.turn.role.value, getattr(exc, "code", "error")).inc()
        details = getattr(exc, "details", None)
        swept = swept_before + (int(details.get("swept", 0)) if isinstance(details, dict) else 0)
        if swept:
            metrics.EXPIRIES.labels(ReasonCode.EXPIRED.value).inc(swept)

    # --- metadata, operators, sweeps, stats, events --------------------------------------------
    def _metadata_call(self, cursor: str | None, limit: int | None) -> tuple[int, ScriptCall]:
        count = page_size(limit, limits.METADATA_PAGE)
        partition, scan = self.core.decode_cursor(cursor)
        part = self.core.keyspace.partition(partition)
        return partition, self.core.metadata_call(part, scan, count)

    def _metadata_page(self, partition: int, reply: Sequence[Any]) -> MetadataPage:
        next_scan, sessions = self.core.decode_metadata(reply)
        if next_scan != "0":
            cursor: str | None = self.core.encode_cursor(partition, next_scan)
        elif partition + 1 < self.config.partitions:
            cursor = self.core.encode_cursor(partition + 1, "0")
        else:
            cursor = None
        return MetadataPage(sessions=tuple(sessions), cursor=cursor)

    def _drop_call(self, key: KeyLike, reason: ReasonCode) -> ScriptCall:
        """An operator drop with its own operation id: every retry of this one call (after
        a lost reply) finds the first attempt's receipt and returns the same result."""
        ckey = self.core.coerce_key(key)
        call = self.core.drop_call(ckey, reason)
        receipt = self.core.partition_for(ckey).drop_receipt(secrets.token_urlsafe(16))
        return ScriptCall(call.script, call.keys, (*call.args, receipt, limits.DROP_RECEIPT_MS))

    def _pop_call(self, key: KeyLike) -> ScriptCall:
        return self.core.pop_call(self.core.coerce_key(key))

    @staticmethod
    def _count_pop(record: TurnRecord | None) -> TurnRecord | None:
        metrics.POPS.labels("empty" if record is None else "popped").inc()
        return record

    @staticmethod
    def _count_swept(total: int) -> int:
        if total:
            metrics.EXPIRIES.labels(ReasonCode.EXPIRED.value).inc(total)
        return total

    def _stats_calls(self) -> list[ScriptCall]:
        return [self.core.stats_call(part) for part in self.core.keyspace.all_partitions()]

    @staticmethod
    def _stats_result(replies: Sequence[Sequence[Any]]) -> StoreStats:
        sessions = sum(int(r[0]) for r in replies)
        nbytes = sum(int(r[1]) for r in replies)
        metrics.STORE_GAUGES.set(sessions, nbytes)
        return StoreStats(sessions=sessions, bytes=nbytes)

    def _event_ranges(
        self, after: str | None, limit: int | None
    ) -> tuple[list[str], int, list[tuple[str, str]]]:
        """(start positions, page size, [(stream key, exclusive min id)] per partition)."""
        count = page_size(limit, limits.EVENTS_PAGE)
        start = self.core.decode_events_cursor(after)
        parts = self.core.keyspace.all_partitions()
        return start, count, [(p.events, "(" + s) for p, s in zip(parts, start, strict=True)]

    # --- snapshots -----------------------------------------------------------------------------
    def _require_snapshots(self) -> SnapshotDir:
        if self.snapshots is None:
            raise SnapshotError("persistence is off (conversation.persistence_enabled = false)")
        return self.snapshots

    def _recover_plan(self, force: bool, wait_s: float | None) -> Plan[RecoveryReport]:
        options: dict[str, Any] = {"force": force}
        if wait_s is not None:
            options["wait_s"] = wait_s
        return recover_plan(self.core, self._require_snapshots(), **options)
