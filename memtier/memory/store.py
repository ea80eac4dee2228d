"""The synchronous conversation-memory store: a thin I/O shell over :class:`StoreBase`."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any, TypeVar

from memtier import limits, metrics
from memtier.config import MemtierConfig
from memtier.connection import connect_sync
from memtier.errors import SessionFullError
from memtier.memory.base import KeyLike, StoreBase, StoreStats
from memtier.memory.compaction import CompactionOutcome, compaction_plan
from memtier.memory.core import ScriptCall
from memtier.memory.models import (
    AppendReceipt,
    Context,
    Event,
    MetadataPage,
    ReasonCode,
    SessionMetadata,
    Turn,
)
from memtier.memory.persistence import FlushResult, RecoveryReport, flush_plan, snapshot_dir_for
from memtier.memory.plans import Command, Plan, drive_sync
from memtier.retry import retry_sync

__all__ = ["ConversationStore", "StoreStats"]

T = TypeVar("T")


class ConversationStore(StoreBase):
    """Bounded, expiring conversation memory per (avatar UUID, channel), on Redis.

    Build it with :meth:`from_config` (URL from the config or ``MEMTIER_REDIS_URL``;
    the embedded in-process Redis when none) or from an existing redis-py client
    (standalone or :class:`redis.cluster.RedisCluster`):
    ``ConversationStore(client, config)``.  :class:`~memtier.AsyncConversationStore`
    is the asyncio twin with the same methods.
    """

    @classmethod
    def from_config(
        cls, config: MemtierConfig | None = None, *, recover: bool = True, **options: Any
    ) -> ConversationStore:
        """Connect as configured.

        With ``conversation.persistence_enabled`` the store keeps snapshot generations in
        ``<storage_path>/conversations`` and (unless ``recover=False``) restores the
        newest valid one right here when the namespace is empty in Redis: see
        :meth:`recover`; the report is in :attr:`last_recovery`.  ``options`` go to the
        constructor (``summarizer``, ``inline_compaction``).
        """
        config = config or MemtierConfig.load()
        client, embedded = connect_sync(config)
        snapshots = snapshot_dir_for(config) if config.conversation.persistence_enabled else None
        store = cls(client, config, embedded=embedded, snapshots=snapshots, **options)
        if snapshots is not None and recover:
            store.recover()
        return store

    # --- plumbing: the only I/O ----------------------------------------------------------------
    def _run(self, call: ScriptCall) -> Any:
        return self.scripts[call.script](self.client, call.keys, call.args)

    def _retrying(self, operation: str, call: ScriptCall) -> Any:
        return retry_sync(operation, lambda: self._run(call))

    def _execute(self, request: ScriptCall | Command) -> Any:
        if isinstance(request, ScriptCall):
            return self._retrying(request.script, request)
        method = getattr(self.client, request.method)
        return retry_sync(request.method, lambda: method(*request.args, **request.kwargs))

    def _drive(self, plan: Plan[T]) -> T:
        """Run a sans-I/O plan (compaction, flush, recovery) on this store's client."""
        return drive_sync(plan, self._execute)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> ConversationStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the API -------------------------------------------------------------------------------
    def append(self, key: KeyLike, turn: Turn) -> AppendReceipt:
        """Append one turn; a retry with the same ``turn_id`` returns the first receipt.

        Every append carries a turn id (the client's, or one generated here before
        the first attempt), so the bounded retries on transient errors can never
        store a turn twice.

        A session at one of its bounds is compacted inline (its oldest turns folded
        into the summary, exactly as a ``memtier worker`` would) and the append is
        retried once, so a host without workers still gets bounded sessions; with
        ``inline_compaction=False`` the SessionFullError is raised instead.

        Raises: ValidationError, SessionFullError (session at its bounds and not
        compacted), CapacityError, TurnTooLargeError, BackendError.
        """
        prepared = self._prepare(key, turn)
        call = self.core.append_call(prepared)
        swept_first = 0  # expired sessions the refused first attempt swept
        try:
            try:
                receipt = self.core.decode_append(prepared, self._retrying("append", call))
            except SessionFullError as full:
                if not self.inline_compaction:
                    raise
                swept_first = int(full.details.get("swept", 0))
                # Compact inline, then retry the same call (same turn id) once.
                outcome = self._drive(self._inline_compaction(prepared))
                metrics.COMPACTIONS.labels(outcome.status.value).inc()
                receipt = self.core.decode_append(prepared, self._retrying("append", call))
        except Exception as exc:
            self._count_append_error(prepared, exc, swept_first)
            raise
        if swept_first:
            receipt = receipt.model_copy(update={"swept": receipt.swept + swept_first})
        return self._count_append(prepared, receipt)

    def context(self, key: KeyLike, *, limit: int = 0) -> Context:
        """The LLM-facing projection of exactly this key (empty if none or expired)."""
        ckey = self.core.coerce_key(key)
        reply = self._retrying("context", self.core.context_call(ckey, limit))
        return self.core.decode_context(ckey, reply)

    def list_metadata(self, cursor: str | None = None, *, limit: int | None = None) -> MetadataPage:
        """One page of session metadata (never content); pass ``page.cursor`` for the next."""
        partition, call = self._metadata_call(cursor, limit)
        return self._metadata_page(partition, self._retrying("list_metadata", call))

    def iter_metadata(self, *, page_size: int | None = None) -> Iterator[SessionMetadata]:
        """Iterate every live session's metadata, page by page (bounded pages)."""
        cursor: str | None = None
        while True:
            page = self.list_metadata(cursor, limit=page_size)
            yield from page.sessions
            if page.cursor is None:
                return
            cursor = page.cursor

    def delete(self, key: KeyLike) -> bool:
        """Operator delete of one exact key; publishes ``operator_deleted``. False if absent."""
        call = self._drop_call(key, ReasonCode.OPERATOR_DELETED)
        return int(self._retrying("delete", call)[0]) == 1

    def expire(self, key: KeyLike) -> bool:
        """Operator expiry of one exact key; publishes ``operator_expired``. False if absent."""
        call = self._drop_call(key, ReasonCode.OPERATOR_EXPIRED)
        return int(self._retrying("expire", call)[0]) == 1

    def sweep(self, *, max_per_partition: int = limits.SWEEP_PER_CALL) -> int:
        """Remove expired sessions now (publishing ``expired`` events); returns how many.

        Each partition is swept until it reports no expired session left, at most
        :data:`~memtier.limits.SWEEP_ROUNDS` calls of ``max_per_partition`` each.
        """
        total = 0
        for part in self.core.keyspace.all_partitions():
            for _ in range(limits.SWEEP_ROUNDS):
                call = self.core.sweep_call(part, max_per_partition)
                swept, more = self._retrying("sweep", call)
                total += int(swept)
                if not int(more):
                    break
        return self._count_swept(total)

    def stats(self) -> StoreStats:
        """Live sessions and stored bytes over all partitions (also updates the gauges)."""
        return self._stats_result([self._retrying("stats", c) for c in self._stats_calls()])

    def events(self, *, after: str | None = None, limit: int | None = None) -> list[Event]:
        """Read the bounded event queue in time order, from the start or after a cursor.

        Each :class:`Event` carries ``cursor``: pass the last one back as ``after``.
        """
        start, count, ranges = self._event_ranges(after, limit)
        pages = [
            retry_sync("events", partial(self.client.xrange, k, lo, "+", count)) for k, lo in ranges
        ]
        return self.core.merge_events(pages, start, count)

    # --- compaction and snapshots --------------------------------------------------------------
    def compact(self, key: KeyLike, *, force: bool = False) -> CompactionOutcome:
        """Compact one session now (what a worker does for a queued job).

        Without ``force`` nothing happens below the compaction trigger
        (:data:`memtier.limits.COMPACTION_TRIGGER_PERCENT` of a bound).
        """
        ckey = self.core.coerce_key(key)
        return self._drive(
            compaction_plan(self.core, ckey, summarizer=self.summarizer, force=force)
        )

    def flush(self) -> FlushResult:
        """Write every live session into a new immutable snapshot generation (durability point).

        Retention then keeps only the newest generations that fit ``max_snapshot_bytes``.
        Raises SnapshotError (persistence off, a full disk, a flush larger than the
        ceiling -- older generations are intact in every case), BackendError.
        """
        snapshots = self._require_snapshots()
        try:
            result = self._drive(flush_plan(self.core, snapshots))
        except Exception:
            metrics.SNAPSHOT_FLUSHES.labels("error").inc()
            raise
        metrics.SNAPSHOT_FLUSHES.labels("ok").inc()
        return result

    def recover(self, *, force: bool = False, wait_s: float | None = None) -> RecoveryReport:
        """Restore the newest valid generation if the namespace is empty in Redis.

        Safe to call from many workers at once: exactly one restores, the others wait
        for it (at most ``wait_s``).  Never raises for bad files (they are quarantined)
        and never overwrites a live key.  ``force``: restore even into a non-empty or
        already initialised namespace (create-only all the same).
        """
        self.last_recovery = self._drive(self._recover_plan(force, wait_s))
        return self.last_recovery
