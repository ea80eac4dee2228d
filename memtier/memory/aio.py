"""The asyncio conversation-memory store: the twin of :mod:`memtier.memory.store`.

Same names, same semantics, same I/O-free core; only the I/O awaits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from memtier import limits, metrics
from memtier.config import MemtierConfig
from memtier.connection import connect_async
from memtier.errors import SessionFullError, SnapshotError
from memtier.memory.compaction import (
    CompactionOutcome,
    Summarizer,
    compaction_plan,
    with_fallback,
)
from memtier.memory.core import MemoryCore, PreparedTurn, ScriptCall
from memtier.memory.models import (
    AppendReceipt,
    Context,
    ConversationKey,
    Event,
    MetadataPage,
    ReasonCode,
    Turn,
)
from memtier.memory.persistence import (
    FlushResult,
    RecoveryReport,
    flush_plan,
    recover_plan,
    snapshot_dir_for,
)
from memtier.memory.plans import Command, Plan, drive_async
from memtier.memory.snapshot import SnapshotDir
from memtier.memory.store import StoreStats, _page_size
from memtier.retry import retry_async
from memtier.scripts import load_registry

__all__ = ["AsyncConversationStore"]

KeyLike = ConversationKey | tuple[Any, Any]
T = TypeVar("T")


class AsyncConversationStore:
    """Bounded, expiring conversation memory per (avatar UUID, channel), on Redis.

    Build it with :meth:`from_config` (URL from the config or ``MEMTIER_REDIS_URL``;
    the embedded in-process Redis when none) or from an existing redis-py client
    (standalone or :class:`redis.cluster.RedisCluster`).
    """

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
        self.core = MemoryCore(self.config, clock=clock)
        self.scripts = load_registry("memory")
        # Compaction (memtier.memory.compaction): the summarizer hook (None = the
        # deterministic default; a blocking hook runs in a worker thread) and whether
        # append compacts inline on SESSION_FULL.
        self.summarizer = summarizer
        self.inline_compaction = inline_compaction
        # Snapshot files (memtier.memory.snapshot): None = persistence off.
        self.snapshots = snapshots
        self.last_recovery: RecoveryReport | None = None
        self._recover_on_enter = False

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
        return store

    @classmethod
    async def open(
        cls, config: MemtierConfig | None = None, *, recover: bool = True, **options: Any
    ) -> AsyncConversationStore:
        """:meth:`from_config`, then the restore on start (the twin of the sync factory)."""
        store = cls.from_config(config, recover=recover, **options)
        await store._startup()
        return store

    async def _startup(self) -> None:
        if self._recover_on_enter:
            self._recover_on_enter = False
            await self.recover()

    # --- plumbing ------------------------------------------------------------------------------
    async def _run(self, call: ScriptCall) -> Any:
        return await self.scripts[call.script].call_async(self.client, call.keys, call.args)

    async def _retrying(self, operation: str, call: ScriptCall) -> Any:
        return await retry_async(operation, lambda: self._run(call))

    async def _execute(self, request: ScriptCall | Command) -> Any:
        if isinstance(request, ScriptCall):
            return await self._retrying(request.script, request)
        method = getattr(self.client, request.method)
        return await retry_async(request.method, lambda: method(*request.args, **request.kwargs))

    async def _drive(self, plan: Plan[T]) -> T:
        """Run a sans-I/O plan (compaction, flush, recovery) on this store's client."""
        return await drive_async(plan, self._execute)

    async def close(self) -> None:
        await self.client.aclose()

    async def __aenter__(self) -> AsyncConversationStore:
        await self._startup()
        return self

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
        ckey = self.core.coerce_key(key)
        prepared = self.core.prepare_turn(ckey, turn)
        return await self._append_prepared(prepared)

    async def _append_prepared(self, prepared: PreparedTurn) -> AppendReceipt:
        call = self.core.append_call(prepared)
        try:
            reply = await self._retrying("append", call)
            try:
                receipt = self.core.decode_append(prepared, reply)
            except SessionFullError:
                if not self.inline_compaction:
                    raise
                # Compact inline, then retry the same call (same turn id) once.
                outcome = await self._drive(
                    compaction_plan(
                        self.core,
                        prepared.key,
                        summarizer=with_fallback(self.summarizer),
                        force=True,
                        incoming_bytes=prepared.turn_bytes,
                        incoming_tool=prepared.turn.kind == "tool",
                    )
                )
                metrics.COMPACTIONS.labels(outcome.status.value).inc()
                reply = await self._retrying("append", call)
                receipt = self.core.decode_append(prepared, reply)
        except Exception as exc:
            metrics.APPENDS.labels(prepared.turn.role.value, getattr(exc, "code", "error")).inc()
            raise
        metrics.APPENDS.labels(
            prepared.turn.role.value, "duplicate" if receipt.duplicate else "stored"
        ).inc()
        if receipt.rotated and not receipt.duplicate:
            metrics.EXPIRIES.labels(ReasonCode.ROTATED.value).inc()
        if receipt.evicted:
            metrics.EVICTIONS.labels("pressure").inc(receipt.evicted)
        return receipt

    async def context(self, key: KeyLike, *, limit: int = 0) -> Context:
        """The LLM-facing projection of exactly this key (empty if none or expired)."""
        ckey = self.core.coerce_key(key)
        reply = await self._retrying("context", self.core.context_call(ckey, limit))
        return self.core.decode_context(ckey, reply)

    async def flush(self) -> FlushResult:
        """Write every live session into a new immutable snapshot generation (durability point).

        Retention then keeps only the newest generations that fit ``max_snapshot_bytes``.
        File I/O runs in a worker thread.  Raises SnapshotError (persistence off, a full
        disk, a flush larger than the ceiling -- older generations are intact in every
        case), BackendError.
        """
        if self.snapshots is None:
            raise SnapshotError("persistence is off (conversation.persistence_enabled = false)")
        try:
            result = await self._drive(flush_plan(self.core, self.snapshots))
        except Exception:
            metrics.SNAPSHOT_FLUSHES.labels("error").inc()
            raise
        metrics.SNAPSHOT_FLUSHES.labels("ok").inc()
        return result

    async def recover(self, *, force: bool = False, wait_s: float | None = None) -> RecoveryReport:
        """Restore the newest valid generation if the namespace is empty in Redis.

        Safe to call from many workers at once: exactly one restores, the others wait
        for it (at most ``wait_s``).  Never raises for bad files (they are quarantined)
        and never overwrites a live key.  ``force``: restore even into a non-empty or
        already initialised namespace (create-only all the same).
        """
        if self.snapshots is None:
            raise SnapshotError("persistence is off (conversation.persistence_enabled = false)")
        options: dict[str, Any] = {"force": force}
        if wait_s is not None:
            options["wait_s"] = wait_s
        self.last_recovery = await self._drive(recover_plan(self.core, self.snapshots, **options))
        return self.last_recovery

    async def compact(self, key: KeyLike, *, force: bool = False) -> CompactionOutcome:
        """Compact one session now (what a worker does for a queued job).

        Without ``force`` nothing happens below the compaction trigger
        (:data:`memtier.limits.COMPACTION_TRIGGER_PERCENT` of a bound).
        """
        ckey = self.core.coerce_key(key)
        return await self._drive(
            compaction_plan(self.core, ckey, summarizer=self.summarizer, force=force)
        )

    async def list_metadata(
        self, cursor: str | None = None, *, limit: int | None = None
    ) -> MetadataPage:
        """One page of session metadata (never content); pass ``page.cursor`` for the next."""
        count = _page_size(limit, limits.METADATA_PAGE)
        partition, scan = self.core.decode_cursor(cursor)
        part = self.core.keyspace.partition(partition)
        reply = await self._retrying("list_metadata", self.core.metadata_call(part, scan, count))
        next_scan, sessions = self.core.decode_metadata(reply)
        return MetadataPage(
            sessions=tuple(sessions), cursor=self._next_cursor(partition, next_scan)
        )

    async def iter_metadata(self, *, page_size: int | None = None) -> Any:
        """Iterate every live session's metadata, page by page (bounded pages)."""
        cursor: str | None = None
        while True:
            page = await self.list_metadata(cursor, limit=page_size)
            for meta in page.sessions:
                yield meta
            if page.cursor is None:
                return
            cursor = page.cursor

    def _next_cursor(self, partition: int, next_scan: str) -> str | None:
        if next_scan != "0":
            return self.core.encode_cursor(partition, next_scan)
        if partition + 1 < self.config.partitions:
            return self.core.encode_cursor(partition + 1, "0")
        return None

    async def delete(self, key: KeyLike) -> bool:
        """Operator delete of one exact key; publishes ``operator_deleted``. False if absent."""
        return await self._drop(key, ReasonCode.OPERATOR_DELETED)

    async def expire(self, key: KeyLike) -> bool:
        """Operator expiry of one exact key; publishes ``operator_expired``. False if absent."""
        return await self._drop(key, ReasonCode.OPERATOR_EXPIRED)

    async def _drop(self, key: KeyLike, reason: ReasonCode) -> bool:
        ckey = self.core.coerce_key(key)
        reply = await self._retrying(reason.value, self.core.drop_call(ckey, reason))
        return int(reply[0]) == 1

    async def sweep(self, *, max_per_partition: int = limits.SWEEP_PER_CALL) -> int:
        """Remove expired sessions now (publishing ``expired`` events); returns how many."""
        total = 0
        for part in self.core.keyspace.all_partitions():
            reply = await self._retrying("sweep", self.core.sweep_call(part, max_per_partition))
            swept = int(reply[0])
            total += swept
        if total:
            metrics.EXPIRIES.labels(ReasonCode.EXPIRED.value).inc(total)
        return total

    async def stats(self) -> StoreStats:
        """Live sessions and stored bytes over all partitions (also updates the gauges)."""
        sessions = nbytes = 0
        for part in self.core.keyspace.all_partitions():
            reply = await self._retrying("stats", self.core.stats_call(part))
            sessions += int(reply[0])
            nbytes += int(reply[1])
        metrics.ACTIVE_SESSIONS.set(sessions)
        metrics.STORED_BYTES.set(nbytes)
        return StoreStats(sessions=sessions, bytes=nbytes)

    async def events(self, *, after: str | None = None, limit: int | None = None) -> list[Event]:
        """Read the bounded event queue in time order, from the start or after a cursor.

        Each :class:`Event` carries ``cursor``: pass the last one back as ``after``.
        """
        count = _page_size(limit, limits.EVENTS_PAGE)
        start = self.core.decode_events_cursor(after)
        pages = []
        for part, position in zip(self.core.keyspace.all_partitions(), start, strict=True):
            key = part.events
            pages.append(
                await retry_async(
                    "events",
                    lambda key=key, position=position: self.client.xrange(  # type: ignore[misc]
                        key, min="(" + position, max="+", count=count
                    ),
                )
            )
        return self.core.merge_events(pages, start, count)
