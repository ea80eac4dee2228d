"""The synchronous conversation-memory store: drives :mod:`memtier.memory.operations`.

Every method is one plan run by a :class:`~memtier.executor.SyncExecutor` (guard,
retry, script hooks); the logic is in the plans and :class:`~memtier.memory.core.MemoryCore`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from memtier import limits, metrics
from memtier.config import MemtierConfig
from memtier.connection import SyncClientGuard, connect_sync
from memtier.engine import drive_sync
from memtier.errors import BackendError
from memtier.executor import ScriptHook, SyncExecutor
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
from memtier.retry import RetryPolicy
from memtier.scripts import load_registry

log = logging.getLogger("memtier")

__all__ = ["ConversationStore", "StoreStats"]


class ConversationStore:
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
        # ``clock`` is the test-only clock hook (ms); production leaves it None so the
        # scripts read Redis server TIME.  It is not reachable from configuration.
        self.core = MemoryCore(self.config, clock=clock)
        # Compaction: the summarizer hook (None = the deterministic default) and whether
        # append compacts inline on SESSION_FULL.  Snapshot files: None = persistence off.
        self.summarizer, self.inline_compaction = summarizer, inline_compaction
        self.snapshots = snapshots
        self.last_recovery: RecoveryReport | None = None
        self.scripts = load_registry("memory")
        self.guard = SyncClientGuard(self.config.redis)
        self.retry_policy = RetryPolicy.from_config(self.config)
        self.executor = SyncExecutor(
            client, self.scripts, self.guard, self.retry_policy, handoff=self._blocking
        )
        self.on_script = None

    @property
    def on_script(self) -> ScriptHook | None:
        """Called with (script, ARGV, reply) after each script reply: the CLI's progress
        display (memtier.progress) hooks in here.  None by default."""
        return self._on_script

    @on_script.setter
    def on_script(self, hook: ScriptHook | None) -> None:
        self._on_script = hook
        self.executor.on_script = [metrics.count_script_events, *([hook] if hook else [])]

    def _blocking(self, work: BlockingPlan) -> Any:
        return drive_sync(work.plan, self.executor.bind(None))

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
        sources = self.scripts.sources_for(self.client)
        self.executor.run(ops.load_scripts(sources), "load_scripts")

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
        return self.executor.run(ops.append(self, key, turn), "append")

    def append_many(self, key: KeyLike, turns: Sequence[Turn]) -> list[AppendReceipt]:
        """Append ``turns`` to one session, in order, in as few round trips as it can.

        What is stored is what ``append`` of each turn in turn would store, stopping at
        the first error: a prefix of ``turns``, in order, each with its own receipt (a
        full session is compacted inline as ``append`` does).  Every turn is validated
        and redacted before anything is sent, so bad input stores nothing.  The turns
        go in script calls of up to 16 turns or 512 KiB, one round trip each; the script
        stores a call's turns in order and stops at the first refused, so no turn is
        stored after one that was refused.

        Raises what ``append`` raises; an error after some turns were stored names
        how many in ``error.details["stored"]`` (the first that many of ``turns``;
        with ``outcome_unknown`` later ones may be too: resending them with the same
        turn ids stores nothing twice).  More than 1,024 turns: ValidationError.
        """
        return self.executor.run(ops.append_many(self, key, turns), "append")

    def context(self, key: KeyLike, *, limit: int = 0) -> Context:
        """The LLM-facing projection of exactly this key (empty if none or expired)."""
        return self.executor.run(ops.context(self, key, limit), "context")

    def list_metadata(self, cursor: str | None = None, *, limit: int | None = None) -> MetadataPage:
        """One page of session metadata (never content); pass ``page.cursor`` for the next."""
        return self.executor.run(ops.list_metadata(self.core, cursor, limit), "list_metadata")

    def iter_metadata(self, *, page_size: int | None = None) -> Iterator[SessionMetadata]:
        """Iterate every live session's metadata, page by page (bounded pages)."""
        cursor: str | None = ""  # "": the first page (no real cursor is empty)
        while cursor is not None:
            page = self.list_metadata(cursor or None, limit=page_size)
            yield from page.sessions
            cursor = page.cursor

    def pop(self, key: KeyLike) -> TurnRecord | None:
        """Remove and return the newest turn of one exact key, atomically (None if none).

        The session's bytes, turn and tool counts and the partition total drop by exactly
        the popped turn's; its turn id may be appended again; one ``popped`` event.
        Seqs are never reused (the next append continues after the popped seq).
        """
        return self.executor.run(ops.pop(self.core, key), "pop")

    def delete(self, key: KeyLike) -> bool:
        """Operator delete of one exact key; publishes ``operator_deleted``. False if absent."""
        plan = ops.drop(self.core, key, ReasonCode.OPERATOR_DELETED)
        return self.executor.run(plan, "delete")

    def expire(self, key: KeyLike) -> bool:
        """Operator expiry of one exact key; publishes ``operator_expired``. False if absent."""
        plan = ops.drop(self.core, key, ReasonCode.OPERATOR_EXPIRED)
        return self.executor.run(plan, "expire")

    def sweep(self, *, max_per_partition: int = limits.SWEEP_PER_CALL) -> int:
        """Remove expired sessions now (publishing ``expired`` events); returns how many.

        Each partition is swept until it reports no expired session left, at most
        :data:`~memtier.limits.SWEEP_ROUNDS` calls of ``max_per_partition`` each.
        """
        return self.executor.run(ops.sweep(self.core, max_per_partition), "sweep")

    def stats(self) -> StoreStats:
        """Live sessions and stored bytes over all partitions (also updates the gauges)."""
        return self.executor.run(ops.stats(self.core), "stats")

    def events(self, *, after: str | None = None, limit: int | None = None) -> list[Event]:
        """Read the bounded event queue in time order, from the start or after a cursor.

        Each :class:`Event` carries ``cursor``: pass the last one back as ``after``.
        """
        return self.executor.run(ops.events(self.core, after, limit), "events")

    # --- compaction and snapshots --------------------------------------------------------------
    def compact(self, key: KeyLike, *, force: bool = False) -> CompactionOutcome:
        """Compact one session now (what a worker does for a queued job).

        Without ``force`` nothing happens below the compaction trigger
        (:data:`memtier.limits.COMPACTION_TRIGGER_PERCENT` of a bound).
        """
        return self.executor.run(ops.compact(self, key, force))

    def flush(self) -> FlushResult:
        """Write every live session into a new immutable snapshot generation (durability point).

        Retention then keeps only the newest generations that fit ``max_snapshot_bytes``.
        Raises SnapshotError (persistence off, a full disk, a flush larger than the
        ceiling -- older generations are intact in every case), BackendError.
        """
        return self.executor.run(ops.flush(self))

    def recover(
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
        already initialised namespace (create-only all the same).  The report is also
        kept in :attr:`last_recovery`.  ``progress``: called with a
        :class:`~memtier.memory.persistence.RestoreProgress` (sessions and bytes of the
        generation handled so far, of its totals) at most once a second while a
        generation is restored, and once when it is complete.
        """
        return self.executor.run(ops.recover(self, force, wait_s, progress))

    def check_data_loss(self, *, force: bool = False) -> RecoveryReport | None:
        """If a check is due (or ``force``): did Redis lose its data under this process?
        Then restore the absent sessions, create-only; returns that recovery's report.

        One ``HMGET`` of the restore gate state per ``loss_watch.interval_s``; the
        appends and reads that call it wait only when a restore runs.  Never raises:
        Redis not answering is logged and tried again at the next check.
        """
        return self.executor.run(ops.check_data_loss(self, force))
