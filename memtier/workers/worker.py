"""``memtier worker``: compaction consumers, expiry sweeps and periodic snapshot flushes.

Any number of worker processes, on any number of hosts, share the work:

* **Compaction jobs** -- ``append_turn`` queues one job per session on its partition's
  ``T:compact`` stream.  Workers read them through one consumer group
  (:data:`GROUP`, ``XREADGROUP``), process each with the compare-and-swap compaction
  (:func:`memtier.memory.compaction.compaction_plan`) and acknowledge it *inside* the
  same script that applies the summary, so a job is done at most once even if the
  worker dies right after.  A worker that dies holding jobs leaves them pending; after
  ``claim_idle_ms`` another worker takes them over (``XAUTOCLAIM``) and does them.  A job
  delivered ``max_deliveries`` times without success (a summarizer that keeps failing)
  is dropped and the session's marker cleared, so the next append can queue it again.
* **Expiry sweeps** every ``sweep_interval_s``: expired sessions are removed with an
  ``expired`` event even if nobody touches them again.
* **Snapshot flushes** every ``flush_interval_s`` when persistence is enabled, and once
  more on every clean exit -- a stop signal, ``deadline_s`` or the end of a drain -- so
  the last generation holds the last appends (``flush_on_stop``).
* **Data-loss checks** every ``loss_check_interval_s`` when persistence is enabled, right
  away when the consumer group has vanished (NOGROUP: Redis came back empty), and before
  every flush: the restore gate state missing, or created again by a start that found
  only the new appends, means Redis lost its data under this worker; it restores the
  absent sessions of the newest valid generation, create-only (one restorer at a time:
  the restore gate).  While such a loss is not recovered the worker does not flush: a
  generation written then would lack every lost session and become the newest.

The loop has no round cap: it runs until it is stopped, its deadline passes or its
drain finds nothing left.  Each action is one INFO line on ``memtier.worker`` (a job
compacted, sessions swept, a flush with its counts, bytes and time), with the numbers
also as record extras for ``--log-format json``.

A worker holds no state that Redis or the snapshot files do not have: kill it at any
moment and start another.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from redis.exceptions import ResponseError

from memtier import metrics
from memtier.errors import MemtierError, SnapshotError
from memtier.keys import PartitionKeys
from memtier.memory.compaction import CompactionOutcome, JobRef, apply_call, compaction_plan
from memtier.memory.models import ConversationKey
from memtier.memory.persistence import LOSS_CHECK_MIN_S, LOSS_CHECK_S, LossWatch
from memtier.memory.store import ConversationStore
from memtier.retry import retry_sync
from memtier.wire import text

__all__ = ["GROUP", "Worker", "WorkerOptions", "WorkerStats"]

log = logging.getLogger("memtier.worker")

GROUP: Final = "memtier-compactors"
# Hard bound of one round: at most this many jobs read per partition.
MAX_BATCH: Final = 256


@dataclass(frozen=True)
class WorkerOptions:
    """Tunables of one worker (seconds and milliseconds as named)."""

    consumer: str | None = None  # default: <host>-<pid>
    batch: int = 16  # jobs read per partition per round (<= MAX_BATCH)
    block_ms: int = 1000  # wait for new jobs (one partition: XREADGROUP BLOCK; else a poll)
    claim_idle_ms: int = 60_000  # a claimed job idle this long is taken over
    max_deliveries: int = 5  # then the job is dropped (logged)
    sweep_interval_s: float = 30.0
    flush_interval_s: float | None = 300.0  # None: no periodic flush
    flush_on_stop: bool = True
    consumer_idle_gc_ms: int = 3_600_000  # consumers idle this long with nothing pending go
    # Did Redis lose its data under us? (persistence on; None: never check)
    loss_check_interval_s: float | None = LOSS_CHECK_S


@dataclass
class WorkerStats:
    """Counters of one worker's life (or of one :meth:`Worker.run_once`)."""

    jobs: int = 0
    reclaimed: int = 0
    dropped: int = 0
    failed: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    swept: int = 0
    flushes: int = 0
    flush_errors: int = 0
    flushes_held: int = 0  # flushes not written: a data loss not recovered yet
    data_losses: int = 0  # data losses under this worker that it detected
    restored: int = 0  # sessions this worker restored after them

    def add(self, other: WorkerStats) -> None:
        self.jobs += other.jobs
        self.reclaimed += other.reclaimed
        self.dropped += other.dropped
        self.failed += other.failed
        self.swept += other.swept
        self.flushes += other.flushes
        self.flush_errors += other.flush_errors
        self.flushes_held += other.flushes_held
        self.data_losses += other.data_losses
        self.restored += other.restored
        for k, v in other.outcomes.items():
            self.outcomes[k] = self.outcomes.get(k, 0) + v


def default_consumer() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Worker:
    """One worker process's loop over a :class:`~memtier.memory.store.ConversationStore`.

    ``on_claimed`` is called with each job before it is processed (tests use it to
    kill a worker mid-job); it is not reachable from configuration.
    """

    def __init__(
        self,
        store: ConversationStore,
        options: WorkerOptions | None = None,
        *,
        on_claimed: Callable[[JobRef], None] | None = None,
    ) -> None:
        self.store = store
        self.options = options or WorkerOptions()
        self.consumer = self.options.consumer or default_consumer()
        self.batch = max(1, min(self.options.batch, MAX_BATCH))
        self.on_claimed = on_claimed
        self.stats = WorkerStats()
        self._claim_cursor: dict[int, str] = {}
        self._groups_ready = False
        self._next_sweep = 0.0
        self._next_flush = (
            time.monotonic() + self.options.flush_interval_s
            if self.options.flush_interval_s
            else None
        )
        self._next_gc = 0.0
        self._next_reclaim = 0.0
        self.loss_watch = self._watch_for_loss()

    def _watch_for_loss(self) -> LossWatch | None:
        """The store's data-loss watch (turned on here when the store has none)."""
        interval = self.options.loss_check_interval_s
        if self.store.snapshots is None or interval is None:
            return None
        watch = self.store.loss_watch
        if watch is None:
            watch = self.store.loss_watch = LossWatch(interval)
            if self.store.last_recovery is not None:
                watch.saw(self.store.last_recovery)
        else:
            watch.interval_s = max(LOSS_CHECK_MIN_S, interval)
        return watch

    # --- plumbing ------------------------------------------------------------------------------
    @property
    def client(self) -> Any:
        return self.store.client

    def _call(self, operation: str, fn: Callable[[], Any]) -> Any:
        return retry_sync(operation, fn)

    def _cmd(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """One redis-py command with the bounded retry layer."""
        bound = getattr(self.client, method)
        return retry_sync(method, lambda: bound(*args, **kwargs))

    def partitions(self) -> list[PartitionKeys]:
        return self.store.core.keyspace.all_partitions()

    def ensure_groups(self) -> None:
        """Create the consumer group on every partition's stream (from its first entry)."""
        for part in self.partitions():
            try:
                self._cmd("xgroup_create", part.compact, GROUP, id="0", mkstream=True)
            except MemtierError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
        self._groups_ready = True

    # --- jobs ----------------------------------------------------------------------------------
    def _reclaim(self, part: PartitionKeys) -> list[tuple[str, dict[str, str], int]]:
        """Jobs whose worker went quiet for claim_idle_ms, with their delivery counts."""
        start = self._claim_cursor.get(part.partition, "0-0")
        reply = self._call(
            "xautoclaim",
            lambda: self.client.xautoclaim(
                part.compact,
                GROUP,
                self.consumer,
                min_idle_time=self.options.claim_idle_ms,
                start_id=start,
                count=self.batch,
            ),
        )
        self._claim_cursor[part.partition] = text(reply[0])
        out = []
        for entry_id, fields in reply[1]:
            if fields is None:
                continue  # deleted meanwhile (XAUTOCLAIM already dropped it from the PEL)
            eid = text(entry_id)
            pending = self._cmd("xpending_range", part.compact, GROUP, eid, eid, 1)
            deliveries = int(pending[0]["times_delivered"]) if pending else 1
            out.append((eid, {text(k): text(v) for k, v in fields.items()}, deliveries))
        return out

    def _read_new(
        self, part: PartitionKeys, block_ms: int | None
    ) -> list[tuple[str, dict[str, str], int]]:
        kwargs: dict[str, Any] = {"count": self.batch}
        if block_ms:
            kwargs["block"] = block_ms
        reply = self._call(
            "xreadgroup",
            lambda: self.client.xreadgroup(GROUP, self.consumer, {part.compact: ">"}, **kwargs),
        )
        out = []
        if isinstance(reply, dict):  # RESP3
            reply = list(reply.items())
        for _stream, entries in reply or ():
            for entry_id, fields in entries:
                out.append(
                    (text(entry_id), {text(k): text(v) for k, v in (fields or {}).items()}, 1)
                )
        return out

    def _drop(self, part: PartitionKeys, entry_id: str) -> None:
        self._call("xack", lambda: self.client.xack(part.compact, GROUP, entry_id))
        self._call("xdel", lambda: self.client.xdel(part.compact, entry_id))

    def process(
        self, part: PartitionKeys, entry_id: str, fields: dict[str, str], deliveries: int = 1
    ) -> CompactionOutcome | None:
        """Do one job; returns its outcome (None if it was dropped or failed)."""
        job = JobRef(part.compact, GROUP, entry_id)
        member, sid = fields.get("member", ""), fields.get("sid") or None
        try:
            key = ConversationKey.from_member(member)
        except MemtierError:
            log.error("compaction job %s is malformed; dropped", entry_id)
            self._drop(part, entry_id)
            self.stats.dropped += 1
            return None
        if deliveries > self.options.max_deliveries:
            log.error(
                "compaction job %s failed %d times; dropped (the next append re-queues it)",
                entry_id,
                deliveries - 1,
            )
            # Release the session's job marker and acknowledge the job: one script call.
            self.store.executor.execute(apply_call(self.store.core, key, sid or "-", None, job))
            self.stats.dropped += 1
            metrics.COMPACTIONS.labels("dropped").inc()
            return None
        if self.on_claimed is not None:
            self.on_claimed(job)
        try:
            outcome = self.store.executor.run(
                compaction_plan(
                    self.store.core,
                    key,
                    session_id=sid,
                    job=job,
                    summarizer=self.store.summarizer,
                )
            )
        except Exception as exc:  # left pending: reclaimed and retried, bounded by deliveries
            log.warning("compaction job %s failed (%s); it will be retried", entry_id, exc)
            self.stats.failed += 1
            return None
        self.stats.jobs += 1
        self.stats.outcomes[outcome.status.value] = (
            self.stats.outcomes.get(outcome.status.value, 0) + 1
        )
        metrics.COMPACTIONS.labels(outcome.status.value).inc()
        log.info(
            "compaction job %s on partition %d: %s",
            entry_id,
            part.partition,
            outcome.status.value,
            extra={
                "action": "compact",
                "job": entry_id,
                "partition": part.partition,
                "outcome": outcome.status.value,
                "deliveries": deliveries,
            },
        )
        return outcome

    def compaction_round(self, *, block: bool = True) -> int:
        """Reclaim stale jobs, then read and process new ones on every partition; returns
        the number of jobs handled.

        A Redis that came back empty (a restart without persistence, a failover to an
        empty replica) has no consumer group: NOGROUP recreates the groups and the loop
        goes on (D6) -- the jobs it had are gone with the data they were about.
        """
        try:
            return self._compaction_round(block)
        except (MemtierError, ResponseError) as exc:
            if "NOGROUP" not in str(exc):
                raise
            log.warning("compaction consumer group missing (Redis lost its data?); recreating")
            self._groups_ready = False
            self._claim_cursor.clear()
            self.ensure_groups()
            self.check_data_loss(force=True)  # restore what was lost, before anything else
            return 0

    def _compaction_round(self, block: bool) -> int:
        if not self._groups_ready:
            self.ensure_groups()
        parts = self.partitions()
        handled = 0
        now = time.monotonic()
        if now >= self._next_reclaim:
            # A claim can only go stale after claim_idle_ms: look twice per that period.
            self._next_reclaim = now + max(0.05, self.options.claim_idle_ms / 2000)
            for part in parts:
                for entry_id, fields, deliveries in self._reclaim(part):
                    self.stats.reclaimed += 1
                    self.process(part, entry_id, fields, deliveries)
                    handled += 1
        for part in parts:
            block_ms = (
                self.options.block_ms if (block and len(parts) == 1 and not handled) else None
            )
            for entry_id, fields, deliveries in self._read_new(part, block_ms):
                self.process(part, entry_id, fields, deliveries)
                handled += 1
        return handled

    def pending(self) -> int:
        """Jobs waiting in the streams or claimed and not yet acknowledged (all partitions)."""
        total = 0
        for part in self.partitions():
            total += int(self._cmd("xlen", part.compact))
        return total

    # --- periodic work -------------------------------------------------------------------------
    def check_data_loss(self, *, force: bool = False) -> None:
        """A data-loss check when due (or ``force``); restores what was lost (create-only)."""
        if self.loss_watch is None:
            return
        losses = self.loss_watch.losses
        report = self.store.check_data_loss(force=force)
        self.stats.data_losses += self.loss_watch.losses - losses
        if report is None or not report.after_loss:
            return
        if report.restorer:
            self.stats.restored += report.restored
        # This worker restored: a warning; another one is at it or was done: info.
        (log.warning if report.restorer else log.info)(
            "recovery after a data loss: %s (%s)",
            report.outcome,
            report.message,
            extra={
                "action": "restore",
                "outcome": report.outcome,
                "generation": report.generation,
                "sessions": report.restored,
                "existing": report.existing,
            },
        )

    def maintenance(self, *, force: bool = False) -> None:
        """Data-loss check, sweep, flush and consumer clean-up when they are due."""
        self.check_data_loss(force=force)
        now = time.monotonic()
        if force or now >= self._next_sweep:
            self._next_sweep = now + self.options.sweep_interval_s
            started = time.monotonic()
            try:
                swept = self.store.sweep()
            except MemtierError as exc:
                log.warning("expiry sweep failed: %s", exc)
            else:
                self.stats.swept += swept
                if swept:
                    log.info(
                        "expiry sweep: %d expired sessions removed in %.3f s",
                        swept,
                        time.monotonic() - started,
                        extra={
                            "action": "sweep",
                            "sessions": swept,
                            "seconds": round(time.monotonic() - started, 6),
                        },
                    )
        if (
            self.store.snapshots is not None
            and self._next_flush is not None
            and (force or now >= self._next_flush)
        ):
            assert self.options.flush_interval_s is not None
            self._next_flush = now + self.options.flush_interval_s
            self.flush()
        if now >= self._next_gc:
            self._next_gc = now + max(60.0, self.options.consumer_idle_gc_ms / 1000)
            self._gc_consumers()

    def flush(self, why: str = "interval") -> None:
        if self.store.snapshots is None:
            return
        if self.loss_watch is not None:
            # Redis may have lost its data since the last check: a flush now would write
            # a generation without the lost sessions, newer than the one holding them.
            self.check_data_loss(force=True)
            if self.loss_watch.pending:
                self.stats.flushes_held += 1
                log.warning(
                    "snapshot flush (%s) held back: Redis lost its data and the restore"
                    " has not finished yet (the next check tries again)",
                    why,
                )
                return
        started = time.monotonic()
        try:
            result = self.store.flush()
        except (SnapshotError, MemtierError) as exc:
            self.stats.flush_errors += 1
            log.error("snapshot flush failed (older generations are intact): %s", exc)
            return
        elapsed = time.monotonic() - started
        self.stats.flushes += 1
        log.info(
            "snapshot flush (%s): generation %d, %d sessions, %d bytes in %.3f s",
            why,
            result.generation,
            result.sessions,
            result.bytes,
            elapsed,
            extra={
                "action": "flush",
                "reason": why,
                "generation": result.generation,
                "sessions": result.sessions,
                "bytes": result.bytes,
                "seconds": round(elapsed, 6),
            },
        )
        if result.skipped:  # also published as snapshot_skipped events and a metric
            log.warning("snapshot generation %d left out %s", result.generation, result.skipped)
        if not result.durable:
            log.warning("snapshot generation %d is published but not durable", result.generation)

    def _gc_consumers(self) -> None:
        """Delete consumers of dead workers (idle long, nothing pending); bounded per call."""
        for part in self.partitions():
            try:
                consumers = self._cmd("xinfo_consumers", part.compact, GROUP)
            except (MemtierError, ResponseError):
                continue
            for info in consumers[:MAX_BATCH]:
                name = text(info.get("name", ""))
                if (
                    name
                    and name != self.consumer
                    and int(info.get("pending", 0)) == 0
                    and int(info.get("idle", 0)) >= self.options.consumer_idle_gc_ms
                ):
                    self._cmd("xgroup_delconsumer", part.compact, GROUP, name)

    # --- the loop ------------------------------------------------------------------------------
    def run(
        self,
        stop: threading.Event | None = None,
        *,
        drain: bool = False,
        deadline_s: float | None = None,
    ) -> WorkerStats:
        """Work until ``stop`` is set, ``deadline_s`` seconds have passed, or (with ``drain``)
        no job is queued or claimed.

        No round cap: a service loop ends only on one of those three.  Every one of
        them is a clean exit, and each flushes once more when persistence is enabled
        (``flush_on_stop``), so the last generation holds the last appends.  An
        exception (Redis gone past the retries) is not a clean exit: no final flush.
        """
        stop = stop or threading.Event()
        give_up = time.monotonic() + deadline_s if deadline_s is not None else None
        self.ensure_groups()
        log.info(
            "worker %s started: %d partitions, persistence %s",
            self.consumer,
            len(self.partitions()),
            "on" if self.store.snapshots is not None else "off",
            extra={"action": "start", "partitions": len(self.partitions())},
        )
        why = "stop"
        while True:
            if stop.is_set():
                why = "stop"
                break
            if give_up is not None and time.monotonic() >= give_up:
                why = "deadline"
                break
            handled = self.compaction_round(block=not drain)
            self.maintenance()
            if drain and not handled and self.pending() == 0:
                why = "drained"
                break
            if not handled and (drain or len(self.partitions()) > 1):
                stop.wait(max(0.01, min(self.options.block_ms, self.options.claim_idle_ms) / 1000))
        log.info(
            "worker %s stopping (%s)", self.consumer, why, extra={"action": "stop", "reason": why}
        )
        if self.options.flush_on_stop:
            self.flush(f"final, {why}")
        return self.stats
