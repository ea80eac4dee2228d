"""The synchronous conversation-memory store: a thin I/O shell over :class:`StoreBase`."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, TypeVar

from memtier import limits, metrics
from memtier.config import MemtierConfig
from memtier.connection import SyncClientGuard, connect_sync
from memtier.errors import BackendError, MemtierError, SessionFullError
from memtier.memory.base import KeyLike, StoreBase, StoreStats
from memtier.memory.compaction import CompactionOutcome, Summarizer, compaction_plan
from memtier.memory.core import ScriptCall
from memtier.memory.models import (
    AppendReceipt,
    Context,
    Event,
    MetadataPage,
    ReasonCode,
    SessionMetadata,
    Turn,
    TurnRecord,
)
from memtier.memory.persistence import (
    FlushResult,
    LossWatch,
    RecoveryReport,
    flush_plan,
    loss_check_plan,
    snapshot_dir_for,
)
from memtier.memory.plans import Command, Plan, drive_sync
from memtier.retry import RetryPolicy, retry_sync

log = logging.getLogger("memtier")

__all__ = ["ConversationStore", "StoreStats"]

T = TypeVar("T")


class ConversationStore(StoreBase):
    """Bounded, expiring conversation memory per (avatar UUID, channel), on Redis.

    Build it with :meth:`from_config` (URL from the config or ``MEMTIER_REDIS_URL``;
    the embedded in-process Redis when none) or from an existing redis-py client
    (standalone or :class:`redis.cluster.RedisCluster`):
    ``ConversationStore(client, config)``.  :class:`~memtier.AsyncConversationStore`
    is the asyncio twin with the same methods.

    The client may be shared by many threads: at most ``redis.max_connections`` calls
    are in flight at once, the others wait up to ``redis.pool_timeout_seconds`` for a
    slot (then ``backend_busy``).
    """

    # Set by from_config with persistence and recovery on: append and context check on
    # a bounded schedule whether Redis lost its data since (see check_data_loss).
    loss_watch: LossWatch | None = None

    def __init__(self, client: Any, config: MemtierConfig | None = None, **options: Any) -> None:
        super().__init__(client, config, **options)
        self.guard = SyncClientGuard(self.config.redis)
        self.retry_policy = RetryPolicy.from_config(self.config)

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
        try:
            store.load_scripts()
        except BackendError as exc:  # Redis not up yet: scripts load on first use instead
            log.warning("memtier: could not preload the Lua scripts (%s); loading on demand", exc)
        if snapshots is not None and recover:
            store.loss_watch = LossWatch()
            store.recover()
        return store

    @classmethod
    def from_url(
        cls,
        url: str | None,
        *,
        recover: bool = True,
        summarizer: Summarizer | None = None,
        inline_compaction: bool = True,
        **settings: Any,
    ) -> ConversationStore:
        """Connect to ``url`` with ``settings`` (any :class:`MemtierConfig` field, e.g.
        ``namespace="app"``, ``conversation={"persistence_enabled": True}``), as redis-py's
        ``from_url``; ``MEMTIER_*`` variables fill what is not given.  ``None``:
        ``MEMTIER_REDIS_URL``, else the embedded in-process Redis.
        ``with ConversationStore.from_url(url) as store: ...``.
        """
        config = MemtierConfig.load(**settings, **({} if url is None else {"redis_url": url}))
        return cls.from_config(
            config, recover=recover, summarizer=summarizer, inline_compaction=inline_compaction
        )

    def load_scripts(self) -> None:
        """``SCRIPT LOAD`` every memory script (on Cluster: on every primary).

        :meth:`from_config` does it: Redis can tell that a read script is ``no-writes``
        only once it has the script, so until then an ``EVALSHA`` of it waits out a
        ``CLIENT PAUSE WRITE`` like any write.  NOSCRIPT later (a restart, a failover)
        still reloads one script on demand.
        """
        retry_sync("load_scripts", lambda: self.scripts.load_all(self.client))

    # --- plumbing: the only I/O ----------------------------------------------------------------
    def _run(self, call: ScriptCall) -> Any:
        script = self.scripts[call.script]
        reply = self.guard.call(lambda: script(self.client, call.keys, call.args))
        metrics.count_script_events(call.script, call.args, reply)
        if self.on_script is not None:
            self.on_script(call.script, call.args, reply)
        return reply

    def _retrying(self, operation: str, call: ScriptCall) -> Any:
        return retry_sync(operation, lambda: self._run(call), self.retry_policy)

    def _retrying_append(self, call: ScriptCall) -> Any:
        """An append; with ``durability="replicated"`` it waits for the replicas."""
        durable = self.core.durable_for(call)
        if durable is None:
            return self._retrying("append", call)
        script = self.scripts[call.script]

        def attempt() -> Any:
            reply = self.guard.call(
                lambda: script.call_replicated(self.client, call.keys, call.args, durable)
            )
            metrics.count_script_events(call.script, call.args, reply)
            return reply

        return retry_sync("append", attempt, self.retry_policy)

    def _command(self, operation: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """One plain redis-py call, guarded and retried like a script."""
        bound = getattr(self.client, method)
        return retry_sync(
            operation, lambda: self.guard.call(lambda: bound(*args, **kwargs)), self.retry_policy
        )

    def _execute(self, request: ScriptCall | Command) -> Any:
        if isinstance(request, ScriptCall):
            return self._retrying(request.script, request)
        return self._command(request.method, request.method, *request.args, **request.kwargs)

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
        if self.loss_watch is not None:
            self.check_data_loss()
        call = self.core.append_call(prepared)
        swept_first = 0  # expired sessions the refused first attempt swept
        try:
            try:
                receipt = self.core.decode_append(prepared, self._retrying_append(call))
            except SessionFullError as full:
                if not self.inline_compaction:
                    raise
                swept_first = int(full.details.get("swept", 0))
                # Compact inline, then retry the same call (same turn id) once.
                outcome = self._drive(self._inline_compaction(prepared))
                metrics.COMPACTIONS.labels(outcome.status.value).inc()
                receipt = self.core.decode_append(prepared, self._retrying_append(call))
        except Exception as exc:
            self._count_append_error(prepared, exc, swept_first)
            raise
        if swept_first:
            receipt = receipt.model_copy(update={"swept": receipt.swept + swept_first})
        return self._count_append(prepared, receipt)

    def context(self, key: KeyLike, *, limit: int = 0) -> Context:
        """The LLM-facing projection of exactly this key (empty if none or expired)."""
        ckey = self.core.coerce_key(key)
        if self.loss_watch is not None:
            self.check_data_loss()
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

    def pop(self, key: KeyLike) -> TurnRecord | None:
        """Remove and return the newest turn of one exact key, atomically (None if none).

        The session's bytes, turn and tool counts and the partition total drop by exactly
        the popped turn's; its turn id may be appended again; one ``popped`` event.
        Seqs are never reused (the next append continues after the popped seq).
        """
        return self._count_pop(self.core.decode_pop(self._retrying("pop", self._pop_call(key))))

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
        pages = [self._command("events", "xrange", k, lo, "+", count) for k, lo in ranges]
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
        metrics.SNAPSHOT_FLUSHES.labels("ok" if result.durable else "not_durable").inc()
        return result

    def recover(self, *, force: bool = False, wait_s: float | None = None) -> RecoveryReport:
        """Restore the newest valid generation if the namespace is empty in Redis.

        Safe to call from many workers at once: exactly one restores, the others wait
        for it (at most ``wait_s``).  Never raises for bad files (they are quarantined)
        and never overwrites a live key.  ``force``: restore even into a non-empty or
        already initialised namespace (create-only all the same).
        """
        self.last_recovery = self._drive(self._recover_plan(force, wait_s))
        if self.loss_watch is not None:
            self.loss_watch.saw(self.last_recovery)
        return self.last_recovery

    def check_data_loss(self, *, force: bool = False) -> RecoveryReport | None:
        """If a check is due (or ``force``): did Redis lose its data under this process?
        Then restore the absent sessions, create-only; returns that recovery's report.

        One ``HMGET`` of the restore gate state per ``loss_watch.interval_s``; the
        appends and reads that call it wait only when a restore runs.  Never raises:
        Redis not answering is logged and tried again at the next check.
        """
        watch = self.loss_watch
        if watch is None or self.snapshots is None or not watch.claim(force):
            return None
        try:
            report = self._drive(loss_check_plan(self.core, self.snapshots, watch))
        except MemtierError as exc:
            log.warning("memtier: data-loss check failed (%s); trying again later", exc)
            return None
        finally:
            watch.release()
        if report is not None:
            self.last_recovery = report
        return report
