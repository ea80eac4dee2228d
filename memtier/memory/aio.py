"""The asyncio conversation-memory store: the twin of :mod:`memtier.memory.store`.

Same names, same semantics, same I/O-free base; only the I/O awaits."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from memtier import limits, metrics
from memtier.config import MemtierConfig
from memtier.connection import AsyncClientGuard, connect_async
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
from memtier.memory.plans import Command, Plan, drive_async
from memtier.retry import RetryPolicy, retry_async

log = logging.getLogger("memtier")

log = logging.getLogger("memtier")

__all__ = ["AsyncConversationStore"]

T = TypeVar("T")


class _OpenMethod:
    """``await AsyncConversationStore.open(config)`` builds and opens a store;
    ``await store.open()`` opens one that exists (both return the store)."""

    def __get__(
        self, store: AsyncConversationStore | None, owner: type[AsyncConversationStore]
    ) -> Callable[..., Awaitable[AsyncConversationStore]]:
        if store is None:
            return owner._open_new
        return store._open


class AsyncConversationStore(StoreBase):
    """The asyncio twin of :class:`~memtier.ConversationStore`: same methods, awaited.

    Build it with :meth:`from_config` / :meth:`open`, or from an existing asyncio
    redis-py client (``redis.asyncio.Redis`` or ``redis.asyncio.cluster.RedisCluster``).

    Life cycle: ``async with AsyncConversationStore.from_config(config) as store:``, or
    ``store = await AsyncConversationStore.open(config)`` / ``await store.open()`` and
    ``await store.close()``.  Opening initialises the client exactly once (a cluster
    client reads its slot map) and runs the restore on start; a store that was never
    opened opens its client lazily on the first call, once, however many calls start
    together.  At most ``redis.max_connections`` calls are in flight; the others wait up
    to ``redis.pool_timeout_seconds`` for a slot (then ``backend_busy``).
    """

    _recover_on_enter = False
    # Set by from_config with persistence and recovery on (see the sync store's).
    loss_watch: LossWatch | None = None
    open = _OpenMethod()

    def __init__(self, client: Any, config: MemtierConfig | None = None, **options: Any) -> None:
        super().__init__(client, config, **options)
        self.guard = AsyncClientGuard(client, self.config.redis)
        self.retry_policy = RetryPolicy.from_config(self.config)

    @classmethod
    def from_config(
        cls, config: MemtierConfig | None = None, *, recover: bool = True, **options: Any
    ) -> AsyncConversationStore:
        """Connect as configured (no I/O yet).

        With ``conversation.persistence_enabled`` the store keeps snapshot generations in
        ``<storage_path>/conversations``; the restore on start (unless ``recover=False``)
        runs when the store is entered (``async with``) or opened with :meth:`open` --
        a constructor cannot await.  ``options`` go to the constructor.
        """
        config = config or MemtierConfig.load()
        client, embedded = connect_async(config)
        snapshots = snapshot_dir_for(config) if config.conversation.persistence_enabled else None
        store = cls(client, config, embedded=embedded, snapshots=snapshots, **options)
        store._recover_on_enter = snapshots is not None and recover
        if store._recover_on_enter:
            store.loss_watch = LossWatch()
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
    ) -> AsyncConversationStore:
        """Connect to ``url`` with ``settings`` (any :class:`MemtierConfig` field, e.g.
        ``namespace="app"``, ``conversation={"persistence_enabled": True}``), as redis-py's
        ``from_url``; ``MEMTIER_*`` variables fill what is not given.  No I/O yet:
        ``async with AsyncConversationStore.from_url(url) as store: ...``.
        """
        config = MemtierConfig.load(**settings, **({} if url is None else {"redis_url": url}))
        return cls.from_config(
            config, recover=recover, summarizer=summarizer, inline_compaction=inline_compaction
        )

    @classmethod
    async def _open_new(
        cls, config: MemtierConfig | None = None, *, recover: bool = True, **options: Any
    ) -> AsyncConversationStore:
        """:meth:`from_config`, then :meth:`open` (the twin of the sync factory)."""
        return await cls.from_config(config, recover=recover, **options)._open()

    async def load_scripts(self) -> None:
        """``SCRIPT LOAD`` every memory script (see the sync store's :meth:`load_scripts`)."""
        script_registry = self.scripts
        await retry_async(
            "load_scripts",
            lambda: self.guard.call(lambda: script_registry.load_all_async(self.client)),
            self.retry_policy,
        )

    async def _open(self) -> AsyncConversationStore:
        """Initialise the client (once) and run the restore on start if one is pending."""
        await retry_async("open", self.guard.open, self.retry_policy)
        try:
            await self.load_scripts()
        except BackendError as exc:  # scripts then load on first use (NOSCRIPT)
            log.warning("memtier: could not preload the Lua scripts (%s); loading on demand", exc)
        if self._recover_on_enter:
            self._recover_on_enter = False
            await self.recover()
        return self

    # --- plumbing: the only I/O ----------------------------------------------------------------
    async def _run(self, call: ScriptCall) -> Any:
        script = self.scripts[call.script]
        reply = await self.guard.call(lambda: script.call_async(self.client, call.keys, call.args))
        metrics.count_script_events(call.script, call.args, reply)
        if self.on_script is not None:
            self.on_script(call.script, call.args, reply)
        return reply

    async def _retrying(self, operation: str, call: ScriptCall) -> Any:
        return await retry_async(operation, lambda: self._run(call), self.retry_policy)

    async def _retrying_append(self, call: ScriptCall) -> Any:
        """An append; with ``durability="replicated"`` it waits for the replicas."""
        durable = self.core.durable_for(call)
        if durable is None:
            return await self._retrying("append", call)
        script = self.scripts[call.script]

        async def attempt() -> Any:
            reply = await self.guard.call(
                lambda: script.call_replicated_async(self.client, call.keys, call.args, durable)
            )
            metrics.count_script_events(call.script, call.args, reply)
            return reply

        return await retry_async("append", attempt, self.retry_policy)

    async def _command(self, operation: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """One plain redis-py call, guarded and retried like a script."""
        bound = getattr(self.client, method)
        return await retry_async(
            operation, lambda: self.guard.call(lambda: bound(*args, **kwargs)), self.retry_policy
        )

    async def _execute(self, request: ScriptCall | Command) -> Any:
        if isinstance(request, ScriptCall):
            return await self._retrying(request.script, request)
        return await self._command(
            request.method, request.method, *request.args, **request.kwargs
        )

    async def _drive(self, plan: Plan[T]) -> T:
        """Run a sans-I/O plan (compaction, flush, recovery); its steps run in a thread."""
        return await drive_async(plan, self._execute)

    async def close(self) -> None:
        """Close the client (a later call opens it again)."""
        await self.guard.aclose()

    async def aclose(self) -> None:
        """Close the client's connections (as redis-py's ``aclose``); same as :meth:`close`."""
        await self.close()

    async def __aenter__(self) -> AsyncConversationStore:
        return await self._open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- the API -------------------------------------------------------------------------------
    async def append(self, key: KeyLike, turn: Turn) -> AppendReceipt:
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
            await self.check_data_loss()
        call = self.core.append_call(prepared)
        swept_first = 0  # expired sessions the refused first attempt swept
        try:
            try:
                receipt = self.core.decode_append(prepared, await self._retrying_append(call))
            except SessionFullError as full:
                if not self.inline_compaction:
                    raise
                swept_first = int(full.details.get("swept", 0))
                # Compact inline, then retry the same call (same turn id) once.
                outcome = await self._drive(self._inline_compaction(prepared))
                metrics.COMPACTIONS.labels(outcome.status.value).inc()
                receipt = self.core.decode_append(prepared, await self._retrying_append(call))
        except Exception as exc:
            self._count_append_error(prepared, exc, swept_first)
            raise
        if swept_first:
            receipt = receipt.model_copy(update={"swept": receipt.swept + swept_first})
        return self._count_append(prepared, receipt)

    async def context(self, key: KeyLike, *, limit: int = 0) -> Context:
        """The LLM-facing projection of exactly this key (empty if none or expired)."""
        ckey = self.core.coerce_key(key)
        if self.loss_watch is not None:
            await self.check_data_loss()
        reply = await self._retrying("context", self.core.context_call(ckey, limit))
        return self.core.decode_context(ckey, reply)

    async def list_metadata(
        self, cursor: str | None = None, *, limit: int | None = None
    ) -> MetadataPage:
        """One page of session metadata (never content); pass ``page.cursor`` for the next."""
        partition, call = self._metadata_call(cursor, limit)
        return self._metadata_page(partition, await self._retrying("list_metadata", call))

    async def iter_metadata(
        self, *, page_size: int | None = None
    ) -> AsyncIterator[SessionMetadata]:
        """Iterate every live session's metadata, page by page (bounded pages)."""
        cursor: str | None = None
        while True:
            page = await self.list_metadata(cursor, limit=page_size)
            for meta in page.sessions:
                yield meta
            if page.cursor is None:
                return
            cursor = page.cursor

    async def pop(self, key: KeyLike) -> TurnRecord | None:
        """Remove and return the newest turn of one exact key, atomically (None if none)."""
        reply = await self._retrying("pop", self._pop_call(key))
        return self._count_pop(self.core.decode_pop(reply))

    async def delete(self, key: KeyLike) -> bool:
        """Operator delete of one exact key; publishes ``operator_deleted``. False if absent."""
        call = self._drop_call(key, ReasonCode.OPERATOR_DELETED)
        return int((await self._retrying("delete", call))[0]) == 1

    async def expire(self, key: KeyLike) -> bool:
        """Operator expiry of one exact key; publishes ``operator_expired``. False if absent."""
        call = self._drop_call(key, ReasonCode.OPERATOR_EXPIRED)
        return int((await self._retrying("expire", call))[0]) == 1

    async def sweep(self, *, max_per_partition: int = limits.SWEEP_PER_CALL) -> int:
        """Remove expired sessions now (publishing ``expired`` events); returns how many.

        Each partition is swept until it reports no expired session left, at most
        :data:`~memtier.limits.SWEEP_ROUNDS` calls of ``max_per_partition`` each.
        """
        total = 0
        for part in self.core.keyspace.all_partitions():
            for _ in range(limits.SWEEP_ROUNDS):
                call = self.core.sweep_call(part, max_per_partition)
                swept, more = await self._retrying("sweep", call)
                total += int(swept)
                if not int(more):
                    break
        return self._count_swept(total)

    async def stats(self) -> StoreStats:
        """Live sessions and stored bytes over all partitions (also updates the gauges)."""
        return self._stats_result([await self._retrying("stats", c) for c in self._stats_calls()])

    async def events(self, *, after: str | None = None, limit: int | None = None) -> list[Event]:
        """Read the bounded event queue in time order, from the start or after a cursor.

        Each :class:`Event` carries ``cursor``: pass the last one back as ``after``.
        """
        start, count, ranges = self._event_ranges(after, limit)
        pages = [await self._command("events", "xrange", k, lo, "+", count) for k, lo in ranges]
        return self.core.merge_events(pages, start, count)

    # --- compaction and snapshots --------------------------------------------------------------
    async def compact(self, key: KeyLike, *, force: bool = False) -> CompactionOutcome:
        """Compact one session now (what a worker does for a queued job).

        Without ``force`` nothing happens below the compaction trigger
        (:data:`memtier.limits.COMPACTION_TRIGGER_PERCENT` of a bound).
        """
        ckey = self.core.coerce_key(key)
        return await self._drive(
            compaction_plan(self.core, ckey, summarizer=self.summarizer, force=force)
        )

    async def flush(self) -> FlushResult:
        """Write every live session into a new immutable snapshot generation (durability point).

        Retention then keeps only the newest generations that fit ``max_snapshot_bytes``.
        Raises SnapshotError (persistence off, a full disk, a flush larger than the
        ceiling -- older generations are intact in every case), BackendError.
        """
        snapshots = self._require_snapshots()
        try:
            result = await self._drive(flush_plan(self.core, snapshots))
        except Exception:
            metrics.SNAPSHOT_FLUSHES.labels("error").inc()
            raise
        metrics.SNAPSHOT_FLUSHES.labels("ok" if result.durable else "not_durable").inc()
        return result

    async def recover(self, *, force: bool = False, wait_s: float | None = None) -> RecoveryReport:
        """Restore the newest valid generation if the namespace is empty in Redis.

        Safe to call from many workers at once: exactly one restores, the others wait
        for it (at most ``wait_s``).  Never raises for bad files (they are quarantined)
        and never overwrites a live key.  ``force``: restore even into a non-empty or
        already initialised namespace (create-only all the same).
        """
        self.last_recovery = await self._drive(self._recover_plan(force, wait_s))
        if self.loss_watch is not None:
            self.loss_watch.saw(self.last_recovery)
        return self.last_recovery

    async def check_data_loss(self, *, force: bool = False) -> RecoveryReport | None:
        """The twin of :meth:`ConversationStore.check_data_loss` (never raises)."""
        watch = self.loss_watch
        if watch is None or self.snapshots is None or not watch.claim(force):
            return None
        try:
            report = await self._drive(loss_check_plan(self.core, self.snapshots, watch))
        except MemtierError as exc:
            log.warning("memtier: data-loss check failed (%s); trying again later", exc)
            return None
        finally:
            watch.release()
        if report is not None:
            self.last_recovery = report
        return report
