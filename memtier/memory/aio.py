"""The asyncio conversation-memory store: the twin of :mod:`memtier.memory.store`.

Same names, same semantics, same plans (:mod:`memtier.memory.operations`), driven by an
:class:`~memtier.executor.AsyncExecutor`.  The hot path (append, context) steps inline on
the event loop; plans that block between requests (snapshot files, a summarizer hook)
run their steps in a worker thread.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from memtier import limits, metrics
from memtier.autopipeline import PipelineBounds
from memtier.config import MemtierConfig
from memtier.connection import AsyncClientGuard, connect_async
from memtier.engine import drive_async
from memtier.errors import BackendError
from memtier.executor import AsyncExecutor, ScriptHook
from memtier.memory import operations as ops
from memtier.memory.compaction import CompactionOutcome
from memtier.memory.core import MemoryCore
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
from memtier.memory.operations import BlockingPlan, KeyLike, StoreStats
from memtier.memory.persistence import (
    FlushResult,
    LossWatch,
    RecoveryReport,
    RestoreProgress,
    snapshot_dir_for,
)
from memtier.memory.snapshot import SnapshotDir
from memtier.memory.summary import Summarizer
from memtier.retry import RetryPolicy, retry_async
from memtier.scripts import load_registry

log = logging.getLogger("memtier")

__all__ = ["AsyncConversationStore"]


class _OpenMethod:
    """``await AsyncConversationStore.open(config)`` builds and opens a store;
    ``await store.open()`` opens one that exists (both return the store)."""

    def __get__(
        self, store: AsyncConversationStore | None, owner: type[AsyncConversationStore]
    ) -> Callable[..., Awaitable[AsyncConversationStore]]:
        if store is None:
            return owner._open_new
        return store._open


class AsyncConversationStore:
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
        self.client, self.embedded = client, embedded
        self.core = MemoryCore(self.config, clock=clock)  # clock: the test-only hook
        self.summarizer, self.inline_compaction = summarizer, inline_compaction
        self.snapshots = snapshots
        self.last_recovery: RecoveryReport | None = None
        self.scripts = load_registry("memory")
        self.guard = AsyncClientGuard(client, self.config.redis)
        self.retry_policy = RetryPolicy.from_config(self.config)
        self.executor = AsyncExecutor(
            client,
            self.scripts,
            self.guard,
            self.retry_policy,
            handoff=self._blocking,
            pipeline=PipelineBounds.from_settings(self.config.redis),
        )
        self.on_script = None

    @property
    def on_script(self) -> ScriptHook | None:
        """Called with (script, ARGV, reply) after each script reply (see the sync store's)."""
        return self._on_script

    @on_script.setter
    def on_script(self, hook: ScriptHook | None) -> None:
        self._on_script = hook
        self.executor.on_script = [metrics.count_script_events, *([hook] if hook else [])]

    async def _blocking(self, work: BlockingPlan) -> Any:
        return await drive_async(work.plan, self.executor.bind(None), offload=True)

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
        sources = self.scripts.sources_for(self.client)
        await self.executor.run(ops.load_scripts(sources), "load_scripts")

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
        return await self.executor.run(ops.append(self, key, turn), "append")

    async def append_many(self, key: KeyLike, turns: Sequence[Turn]) -> list[AppendReceipt]:
        """Append ``turns`` to one session, in order, in as few round trips as it can
        (one script call per 16 turns, each riding the loop tick's auto-pipelined write).

        Stores, returns and raises exactly as
        :meth:`~memtier.memory.store.ConversationStore.append_many`.
        """
        return await self.executor.run(ops.append_many(self, key, turns), "append")

    async def context(self, key: KeyLike, *, limit: int = 0) -> Context:
        """The LLM-facing projection of exactly this key (empty if none or expired)."""
        return await self.executor.run(ops.context(self, key, limit), "context")

    async def list_metadata(
        self, cursor: str | None = None, *, limit: int | None = None
    ) -> MetadataPage:
        """One page of session metadata (never content); pass ``page.cursor`` for the next."""
        return await self.executor.run(ops.list_metadata(self.core, cursor, limit), "list_metadata")

    async def iter_metadata(
        self, *, page_size: int | None = None
    ) -> AsyncIterator[SessionMetadata]:
        """Iterate every live session's metadata, page by page (bounded pages)."""
        cursor: str | None = ""  # "": the first page (no real cursor is empty)
        while cursor is not None:
            page = await self.list_metadata(cursor or None, limit=page_size)
            for meta in page.sessions:
                yield meta
            cursor = page.cursor

    async def pop(self, key: KeyLike) -> TurnRecord | None:
        """Remove and return the newest turn of one exact key, atomically (None if none)."""
        return await self.executor.run(ops.pop(self.core, key), "pop")

    async def delete(self, key: KeyLike) -> bool:
        """Operator delete of one exact key; publishes ``operator_deleted``. False if absent."""
        plan = ops.drop(self.core, key, ReasonCode.OPERATOR_DELETED)
        return await self.executor.run(plan, "delete")

    async def expire(self, key: KeyLike) -> bool:
        """Operator expiry of one exact key; publishes ``operator_expired``. False if absent."""
        plan = ops.drop(self.core, key, ReasonCode.OPERATOR_EXPIRED)
        return await self.executor.run(plan, "expire")

    async def sweep(self, *, max_per_partition: int = limits.SWEEP_PER_CALL) -> int:
        """Remove expired sessions now (publishing ``expired`` events); returns how many.

        Each partition is swept until it reports no expired session left, at most
        :data:`~memtier.limits.SWEEP_ROUNDS` calls of ``max_per_partition`` each.
        """
        return await self.executor.run(ops.sweep(self.core, max_per_partition), "sweep")

    async def stats(self) -> StoreStats:
        """Live sessions and stored bytes over all partitions (also updates the gauges)."""
        return await self.executor.run(ops.stats(self.core), "stats")

    async def events(self, *, after: str | None = None, limit: int | None = None) -> list[Event]:
        """Read the bounded event queue in time order, from the start or after a cursor.

        Each :class:`Event` carries ``cursor``: pass the last one back as ``after``.
        """
        return await self.executor.run(ops.events(self.core, after, limit), "events")

    # --- compaction and snapshots: their steps may block, so they run in a worker thread --------
    async def compact(self, key: KeyLike, *, force: bool = False) -> CompactionOutcome:
        """Compact one session now (what a worker does for a queued job).

        Without ``force`` nothing happens below the compaction trigger
        (:data:`memtier.limits.COMPACTION_TRIGGER_PERCENT` of a bound).
        """
        return await self.executor.run(ops.compact(self, key, force), offload=True)

    async def flush(self) -> FlushResult:
        """Write every live session into a new immutable snapshot generation (durability point).

        Retention then keeps only the newest generations that fit ``max_snapshot_bytes``.
        Raises SnapshotError (persistence off, a full disk, a flush larger than the
        ceiling -- older generations are intact in every case), BackendError.
        """
        return await self.executor.run(ops.flush(self), offload=True)

    async def recover(
        self,
        *,
        force: bool = False,
        wait_s: float | None = None,
        progress: Callable[[RestoreProgress], Any] | None = None,
    ) -> RecoveryReport:
        """Restore the newest valid generation if the namespace is empty in Redis.

        Safe to call from many workers at once: exactly one restores, the others wait
        for it (at most ``wait_s``).  Never raises for bad files (they are quarantined)
        and never overwrites a live key.  ``force``: restore even into a non-empty or
        already initialised namespace (create-only all the same).  ``progress``: as
        :meth:`ConversationStore.recover` (called from the worker thread driving the plan).
        """
        return await self.executor.run(ops.recover(self, force, wait_s, progress), offload=True)

    async def check_data_loss(self, *, force: bool = False) -> RecoveryReport | None:
        """The twin of :meth:`ConversationStore.check_data_loss` (never raises)."""
        return await self.executor.run(ops.check_data_loss(self, force))
