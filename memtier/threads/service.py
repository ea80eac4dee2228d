"""The synchronous conversation service: drives the core's plans with redis-py's sync client.

Everything but I/O lives in :mod:`memtier.threads.core`; this shell drives each plan
through a :class:`~memtier.executor.SyncExecutor` (guard, bounded retries), counts each
operation, and runs a claimed turn (the plan's hand-off) with the thread specifics of
the run-turn protocol (:mod:`memtier.threads.runturn`): a heartbeat thread, a timer for
the wall-clock limit and a ``threading.Event`` the runner polls for cancellation.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

from memtier import limits
from memtier.config import MemtierConfig, ThreadsConfig
from memtier.connection import SyncClientGuard, connect_sync
from memtier.engine import Plan
from memtier.executor import SyncExecutor
from memtier.retry import RetryPolicy, retry_sync
from memtier.scripts import ScriptRegistry, load_registry
from memtier.threads.core import ThreadsCore, TurnState
from memtier.threads.models import (
    AgentIdentity,
    CancelResult,
    ContinueResult,
    ConversationThread,
    DeleteResult,
    ExportResult,
    Ownership,
    ReplayPage,
    ThreadPage,
)
from memtier.threads.runlimits import RunLimits
from memtier.threads.runner import (
    ConversationRunner,
    EchoRunner,
    RunnerEvent,
    RunnerResult,
    RunnerTurn,
)
from memtier.threads.runturn import ActiveTurns, TurnControl, counted

__all__ = ["ConversationService", "create_conversation_service"]

T = TypeVar("T")


class ConversationService:
    """Durable, ownership-scoped conversation threads on Redis (sync API).

    Every method takes the host-verified :class:`Ownership` first; a thread of
    another owner is indistinguishable from a missing one (``not_found``).
    Errors are :class:`~memtier.errors.ConversationError` with a stable
    ``code`` (or :class:`~memtier.errors.BackendError` when Redis stays
    unavailable after bounded retries).

    ``runner`` runs one agent turn for :meth:`continue_` (default: the
    deterministic :class:`~memtier.threads.runner.EchoRunner`).  ``clock``
    (epoch ms) and ``cursor_secret`` are for tests and multi-namespace hosts;
    ``busy_wait_s`` bounds how long a continue waits for another request's
    turn on the same thread before ``thread_busy``; ``inflight_wait_s`` how
    long an exact retry waits for its first attempt before
    ``request_in_progress``.
    """

    def __init__(
        self,
        client: Any,
        config: MemtierConfig | None = None,
        *,
        runner: ConversationRunner | None = None,
        threads: ThreadsConfig | None = None,
        clock: Callable[[], int] | None = None,
        cursor_secret: bytes | str | None = None,
        lease_ms: int = limits.THREAD_LEASE_MS,
        busy_wait_s: float = 5.0,
        inflight_wait_s: float = 30.0,
        embedded: bool = False,
        run_options_schema: Any = None,
        run_limits: RunLimits | None = None,
    ) -> None:
        self.config = config or MemtierConfig.load()
        self.client = client
        self.embedded = embedded
        self.runner: ConversationRunner = runner if runner is not None else EchoRunner()
        self.core = ThreadsCore(
            self.config.namespace,
            threads or self.config.threads,
            clock=clock,
            cursor_secret=cursor_secret,
            lease_ms=lease_ms,
            busy_wait_s=busy_wait_s,
            inflight_wait_s=inflight_wait_s,
            run_options_schema=(
                run_options_schema
                if run_options_schema is not None
                else getattr(runner, "run_options_schema", None)
            ),
            run_limits=(
                run_limits if run_limits is not None else getattr(runner, "run_limits", None)
            ),
        )
        # Back-pressure for a client shared by many threads, and the retry horizon.
        self.guard = SyncClientGuard(self.config.redis)
        self.retry_policy = RetryPolicy.from_config(self.config)
        self.executor = SyncExecutor(
            client, load_registry("threads"), self.guard, self.retry_policy, handoff=self._run_turn
        )
        self.turns = ActiveTurns()  # turns running in this process (cancel_run, close)
        self._beats = _Heartbeats()  # starts a turn's heartbeat thread once a beat is due
        self._in_flight = _InFlight()  # continue calls in flight (close waits for their ledgers)

    @property
    def limits(self) -> ThreadsConfig:
        return self.core.config

    @property
    def scripts(self) -> ScriptRegistry:
        return self.executor.scripts

    @scripts.setter
    def scripts(self, registry: ScriptRegistry) -> None:
        self.executor.scripts = registry

    def _run(self, operation: str, plan: Plan[T]) -> T:
        with counted(operation):
            return self.executor.run(plan, operation)

    def _run_turn(self, state: TurnState) -> RunnerResult:
        """The plan's hand-off: run the runner for a claimed turn."""
        control = TurnControl(self.core, state)
        return _run_in_thread(control, self.runner, self.executor, self.turns, self._beats)

    # --- lifecycle -------------------------------------------------------------------------------

    def load_scripts(self) -> None:
        """``SCRIPT LOAD`` every thread script (on Cluster: on every primary)."""
        load = lambda: self.guard.call(lambda: self.scripts.load_all(self.client))  # noqa: E731
        retry_sync("load_scripts", load, self.retry_policy)

    def scripts_loaded(self) -> bool:
        """True when Redis answers and ``SCRIPT EXISTS`` is true for every thread script."""
        found = self.client.script_exists(*self.scripts.shas_for(self.client))
        return found if isinstance(found, bool) else bool(found) and all(bool(x) for x in found)

    def close(self, *, cancel_wait_s: float = 10.0) -> None:
        """Cancel the turns running in this process (reason ``shutdown``), wait up to
        ``cancel_wait_s`` for them to close their ledgers, then close the client."""
        self.turns.cancel_all("shutdown")
        self._in_flight.wait_idle(cancel_wait_s)
        self.client.close()

    def __enter__(self) -> ConversationService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the API ---------------------------------------------------------------------------------

    def create(
        self,
        ownership: Ownership,
        *,
        title: str | None = None,
        thread_id: str | None = None,
        request_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> ConversationThread:
        """Create a thread (``conv_<uuid>`` id unless ``thread_id`` is given).

        Get-or-create when an id is given: an existing thread is returned
        unchanged, whatever title or metadata this call passes; only the loser of
        a true concurrent create+create race (the thread appeared between this
        call's read and its create-only write, with another body) gets
        ``metadata_conflict``.  Without ``thread_id`` but with ``request_id`` the
        id derives from the request id (a UUID v5, docs/threads.md), so retries
        return the same thread.
        """
        plan = self.core.create(
            ownership, title=title, thread_id=thread_id, request_id=request_id, metadata=metadata
        )
        return self._run("create", plan)

    def create_or_get(
        self,
        ownership: Ownership,
        *,
        title: str | None = None,
        thread_id: str | None = None,
        request_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> tuple[ConversationThread, bool]:
        """``(thread, created)``: like :meth:`create`, and says whether this call created it
        (the HTTP API answers 201 for a new thread, 200 for an existing one)."""
        plan = self.core.create_or_get(
            ownership, title=title, thread_id=thread_id, request_id=request_id, metadata=metadata
        )
        return self._run("create", plan)

    def get(self, ownership: Ownership, thread_id: str) -> ConversationThread:
        """The thread, or ``not_found`` (also for another owner's thread)."""
        return self._run("get", self.core.get(ownership, thread_id))

    def continue_(
        self,
        ownership: Ownership,
        thread_id: str,
        message: str,
        *,
        request_id: str | None = None,
        leaf_id: str | None = None,
        run_options: Mapping[str, Any] | None = None,
        identity: AgentIdentity | None = None,
    ) -> ContinueResult:
        """Run one agent turn and record it (see :mod:`memtier.threads` for the protocol).

        ``leaf_id`` must be a branch ref recorded by :meth:`branch` (else
        ``unknown_leaf``); without it the turn continues from the thread's head.
        ``request_id`` makes retries exact: the runner runs once, every retry
        returns the first result (waiting up to ``inflight_wait_s`` while it is
        still running).  Raises ``thread_archived``, ``thread_busy``,
        ``request_in_progress``, ``request_conflict``, ``runner_failed``, ...
        """
        plan = self.core.continue_(
            ownership,
            thread_id,
            message,
            request_id=request_id,
            leaf_id=leaf_id,
            run_options=run_options,
            identity=identity,
        )
        with self._in_flight.tracked():
            return self._run("continue", plan)

    def branch(
        self,
        ownership: Ownership,
        thread_id: str,
        leaf_id: str,
        *,
        expected_version: int | None = None,
    ) -> ConversationThread:
        """Record ``leaf_id`` (an entry of the thread) as a branch ref: CAS on the version."""
        plan = self.core.branch(ownership, thread_id, leaf_id, expected_version=expected_version)
        return self._run("branch", plan)

    def archive(
        self, ownership: Ownership, thread_id: str, *, expected_version: int | None = None
    ) -> ConversationThread:
        """Archive the thread (no-op if archived): CAS on the version."""
        plan = self.core.archive(ownership, thread_id, expected_version=expected_version)
        return self._run("archive", plan)

    def export(
        self, ownership: Ownership, thread_id: str, *, cursor: str | None = None
    ) -> ExportResult:
        """The thread and its redacted ledger, byte- and page-capped, resumable."""
        return self._run("export", self.core.export(ownership, thread_id, cursor=cursor))

    def delete(self, ownership: Ownership, thread_id: str) -> DeleteResult:
        """Remove every key of the thread unless a legal hold is set (``held``)."""
        return self._run("delete", self.core.delete(ownership, thread_id))

    def replay(
        self,
        ownership: Ownership,
        thread_id: str,
        *,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> ReplayPage:
        """A page of durable redacted events; never re-runs anything."""
        plan = self.core.replay(ownership, thread_id, cursor=cursor, limit=limit)
        return self._run("replay", plan)

    def cancel_run(self, ownership: Ownership, thread_id: str, request_id: str) -> CancelResult:
        """Cancel the run of ``request_id`` (owner-only, idempotent): a running turn gets its
        cancellation signal, commits nothing and ends its ledger with ``cancelled``; its
        ``continue_`` raises ``run_cancelled``.  A finished run is left as it is."""
        result = self._run("cancel_run", self.core.cancel_run(ownership, thread_id, request_id))
        return self.turns.cancelled(self.core.thread_keys(ownership, thread_id).thread, result)

    def set_legal_hold(self, ownership: Ownership, thread_id: str) -> ConversationThread:
        """Operators: block deletion of the thread until released."""
        return self._run("set_legal_hold", self.core.set_legal_hold(ownership, thread_id, True))

    def release_legal_hold(self, ownership: Ownership, thread_id: str) -> ConversationThread:
        """Operators: allow deletion again."""
        plan = self.core.set_legal_hold(ownership, thread_id, False)
        return self._run("release_legal_hold", plan)

    def list(
        self, ownership: Ownership, *, cursor: str | None = None, limit: int | None = None
    ) -> ThreadPage:
        """The owner's threads, newest created first; ``next_cursor`` while more exist."""
        return self._run("list", self.core.list_threads(ownership, cursor=cursor, limit=limit))


class _InFlight:
    """Counts the continue calls in flight, so close can wait for their ledgers."""

    def __init__(self) -> None:
        self._count = 0
        self._changed = threading.Condition()

    @contextmanager
    def tracked(self) -> Iterator[None]:
        with self._changed:
            self._count += 1
        try:
            yield
        finally:
            with self._changed:
                self._count -= 1
                self._changed.notify_all()

    def wait_idle(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self._count and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(left)


class _Beat:
    """One turn's heartbeat.  Its thread, and the Event that stops it, are made by the
    waker when the first beat is due: a turn that ends before that makes neither."""

    __slots__ = ("run", "stopped", "thread")

    def __init__(self, run: Callable[[threading.Event], None]) -> None:
        self.run = run
        self.stopped: threading.Event | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        """Make and start the thread (by the waker, under its lock: ``unschedule`` sees
        either a pending beat or one with its thread and Event set)."""
        self.stopped = threading.Event()
        self.thread = threading.Thread(
            target=self.run, args=(self.stopped,), name="memtier-lease", daemon=True
        )
        self.thread.start()  # RuntimeError: no thread to be had (the caller goes on)

    def stop(self) -> None:
        """After ``unschedule`` found it started: stop it and wait for a beat in flight."""
        if self.stopped is not None:
            self.stopped.set()
        if self.thread is not None and self.thread.ident is not None:
            self.thread.join()


class _Heartbeats:
    """Starts each turn's heartbeat thread only when its first beat is due (a third of the
    lease after the turn started), from one waker thread per service that does no I/O:
    a turn shorter than that -- the common case -- starts and joins no thread."""

    _IDLE_S = 60.0  # the waker exits after this long with nothing scheduled

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._pending: dict[int, tuple[float, _Beat]] = {}
        self._waker: threading.Thread | None = None
        self._wake_at = 0.0  # when the waker wakes next (it is woken early only if needed)

    def schedule(self, beat: _Beat, due: float) -> None:
        with self._changed:
            self._pending[id(beat)] = (due, beat)
            if self._waker is None:
                self._wake_at = due
                self._waker = threading.Thread(
                    target=self._wake, name="memtier-lease-waker", daemon=True
                )
                self._waker.start()
            elif due < self._wake_at:  # dues only grow: only after an idle wait
                self._wake_at = due
                self._changed.notify()

    def unschedule(self, beat: _Beat) -> bool:
        """True when ``beat`` had not started (it never will); False: it started, stop it."""
        with self._changed:
            return self._pending.pop(id(beat), None) is not None

    def _wake(self) -> None:
        idle_since: float | None = None
        with self._changed:
            while True:
                now = time.monotonic()
                for key, (due, beat) in list(self._pending.items()):
                    if due <= now:
                        del self._pending[key]
                        try:  # under the lock: unschedule sees started or pending
                            beat.start()
                        except RuntimeError:  # no thread to be had: the turn goes unbeaten
                            continue  # (a long one then loses its lease: lease_lost)
                if self._pending:
                    idle_since = None
                    self._wake_at = min(due for due, _ in self._pending.values())
                else:
                    if idle_since is None:
                        idle_since = now
                    elif now - idle_since >= self._IDLE_S:
                        self._waker = None
                        return
                    self._wake_at = idle_since + self._IDLE_S
                self._changed.wait(max(0.0, self._wake_at - time.monotonic()))


def _run_in_thread(
    control: TurnControl,
    runner: ConversationRunner,
    executor: SyncExecutor,
    active: ActiveTurns,
    beats: _Heartbeats,
) -> RunnerResult:
    """Run the runner in this thread; a heartbeat thread renews the lease (started by
    ``beats`` when the first beat is due), a timer enforces the wall-clock limit, and an
    Event carries the cancellation to the runner."""
    emitting, cancelled = threading.Lock(), threading.Event()
    control.stop = cancelled.set

    def emit(event: RunnerEvent) -> None:
        with emitting:
            call = control.emit_call(event)
            if call is not None:
                control.check_emit(executor.execute(call, "emit"))

    def heartbeat(stopped: threading.Event) -> None:
        # Beats keep to a fixed schedule (a slow renew does not push the next one back).
        interval = control.beat_interval
        due = time.monotonic()
        while not stopped.is_set():
            try:
                reply = executor.execute(control.renew_call(), "lease_renew")
            except Exception:  # a missed beat is retried at the next interval
                control.missed_beat()
                reply = None
            if reply is not None and not control.renewed(reply):
                return  # cancelled by the caller, or lost / deleted: the runner was told
            due = max(due + interval, time.monotonic())
            if stopped.wait(due - time.monotonic()):
                return

    beat = _Beat(heartbeat)
    turn = RunnerTurn(**control.turn_fields(), emit=emit, cancelled=cancelled)
    wall: threading.Timer | None = None
    if (seconds := control.wall_seconds()) is not None:
        wall = threading.Timer(seconds, control.out_of_time)
        wall.daemon = True
        wall.start()
    with control.running(active):
        beats.schedule(beat, time.monotonic() + control.beat_interval)
        try:
            return runner(turn)
        finally:
            if wall is not None:
                wall.cancel()
            if not beats.unschedule(beat):
                beat.stop()


def create_conversation_service(
    config: MemtierConfig | None = None,
    *,
    client: Any = None,
    runner: ConversationRunner | None = None,
    **options: Any,
) -> ConversationService:
    """A :class:`ConversationService` on ``client``, or on the configured Redis.

    Without a client, the URL comes from ``config`` / ``MEMTIER_REDIS_URL``
    (``redis+cluster://`` for Redis Cluster); with none, the embedded
    in-process Redis (a warning says so).  ``options`` go to the constructor.
    """
    config = config or MemtierConfig.load()
    embedded = False
    if client is None:
        client, embedded = connect_sync(config)
    return ConversationService(client, config, runner=runner, embedded=embedded, **options)
