"""The synchronous conversation service: executes the core's flows with redis-py's sync client.

Everything but I/O lives in :mod:`memtier.threads.core`; this shell runs each
yielded request (script, command, pipelined reads, sleep, runner call) with the
one retry layer (:func:`memtier.retry.retry_sync`), records metrics, and keeps
the lease of a running turn alive from a heartbeat thread.
"""

from __future__ import annotations

import builtins
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from memtier import limits, metrics
from memtier.config import MemtierConfig, ThreadsConfig
from memtier.connection import SyncClientGuard, connect_sync
from memtier.retry import RetryPolicy, retry_sync
from memtier.scripts import load_registry
from memtier.threads.core import (
    BatchOp,
    CommandOp,
    Flow,
    Op,
    RunOp,
    ScriptOp,
    SleepOp,
    ThreadsCore,
    TurnState,
    outcome_of,
)
from memtier.threads.models import (
    AgentIdentity,
    CancelResult,
    CancelStatus,
    ContinueResult,
    ConversationThread,
    DeleteResult,
    ExportResult,
    Ownership,
    ReplayPage,
    ThreadPage,
)
from memtier.threads.runlimits import WALL_MS, RunLimits
from memtier.threads.runner import (
    AgentDenied,
    ConversationRunner,
    EchoRunner,
    RunnerEvent,
    RunnerResult,
    RunnerTurn,
)

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
        self.scripts = load_registry("threads")
        # Turns running in this process: (thread key, request id) -> (state, cancel event).
        self._active: dict[tuple[str, str], tuple[TurnState, threading.Event]] = {}
        self._active_lock = threading.Condition()
        self._continues = 0  # continue calls in flight (close waits for their ledgers)
        # Back-pressure for a client shared by many threads, and the retry horizon.
        self.guard = SyncClientGuard(self.config.redis)
        self.retry_policy = RetryPolicy.from_config(self.config)

    def _retry(self, operation: str, fn: Callable[[], T]) -> T:
        return retry_sync(operation, lambda: self.guard.call(fn), self.retry_policy)

    @property
    def limits(self) -> ThreadsConfig:
        return self.core.config

    # --- plumbing --------------------------------------------------------------------------------

    def _execute(self, operation: str, op: Op) -> Any:
        if isinstance(op, ScriptOp):
            script = self.scripts[op.script]

            def call() -> Any:
                if op.attempts is not None:
                    op.attempts[0] += 1
                return script(self.client, op.keys, op.args)

            return self._retry(operation, call)
        if isinstance(op, CommandOp):
            method = getattr(self.client, op.method)
            return self._retry(operation, lambda: method(*op.args, **dict(op.kwargs)))
        if isinstance(op, BatchOp):

            def batch() -> Any:
                pipe = self.client.pipeline(transaction=False)
                for command in op.commands:
                    getattr(pipe, command.method)(*command.args, **dict(command.kwargs))
                return pipe.execute()

            return self._retry(operation, batch)
        if isinstance(op, SleepOp):
            time.sleep(op.seconds)
            return None
        if isinstance(op, RunOp):
            return self._run_turn(op.turn)
        raise TypeError(f"unknown operation {op!r}")  # pragma: no cover

    def _drive(self, operation: str, flow: Flow[T]) -> T:
        failure: BaseException | None = None
        try:
            op = next(flow)
            while True:
                try:
                    value = self._execute(operation, op)
                except Exception as exc:
                    op = flow.throw(exc)
                    continue
                op = flow.send(value)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        except BaseException as exc:
            failure = exc
            raise
        finally:
            flow.close()
            metrics.THREAD_OPERATIONS.labels(operation, outcome_of(failure)).inc()

    def _cancel_local(self, state: TurnState, cancelled: threading.Event, reason: str) -> None:
        if state.cancel_reason is None:
            state.cancel_reason = reason
        cancelled.set()

    def _run_turn(self, state: TurnState) -> RunnerResult:
        lock = threading.Lock()
        cancelled = threading.Event()

        def emit(event: RunnerEvent) -> None:
            with lock:
                op = self.core.emit_op(state, event)
                if op is None:
                    return
                self.core.check_emit(self._execute("emit", op))

        stop = threading.Event()

        def heartbeat() -> None:
            interval = self.core.lease_ms / 3000
            while not stop.wait(interval):
                try:
                    reply = self._execute("lease_renew", self.core.renew_op(state))
                except Exception:  # a missed beat is retried at the next interval
                    continue
                if not self.core.renew_ok(reply):
                    # cancelled by the caller, or lost / deleted: stop the runner
                    self._cancel_local(state, cancelled, self.core.renew_failure(reply))
                    return

        beat = threading.Thread(target=heartbeat, name="memtier-lease", daemon=True)
        turn = RunnerTurn(
            thread=state.thread,
            history=state.history,
            message=state.message,
            request_id=state.request_id,
            leaf_id=state.leaf_id,
            emit=emit,
            run_options=state.run_options,
            identity=state.identity,
            cancelled=cancelled,
            allowance=None if state.budget is None else state.budget.remaining(),
        )
        wall: threading.Timer | None = None
        if state.budget is not None and WALL_MS in state.budget.allowance:

            def out_of_time() -> None:
                assert state.budget is not None
                state.budget.exceeded = state.budget.exceeded or WALL_MS
                self._cancel_local(state, cancelled, "limit")

            wall = threading.Timer(state.budget.allowance[WALL_MS] / 1000, out_of_time)
            wall.daemon = True
            wall.start()
        key = (state.keys.thread, state.request_id)
        with self._active_lock:
            self._active[key] = (state, cancelled)
        outcome = "error"
        started = time.perf_counter()
        beat.start()
        try:
            result = self.runner(turn)
            outcome = "ok"
            return result
        except AgentDenied:
            outcome = "denied"
            raise
        finally:
            if wall is not None:
                wall.cancel()
            stop.set()
            beat.join()
            with self._active_lock:
                self._active.pop(key, None)
                self._active_lock.notify_all()
            metrics.THREAD_RUNNER_DURATION.labels(outcome).observe(time.perf_counter() - started)

    # --- lifecycle -------------------------------------------------------------------------------

    def load_scripts(self) -> None:
        """``SCRIPT LOAD`` every thread script (on Cluster: on every primary)."""
        self._retry("load_scripts", lambda: self.scripts.load_all(self.client))

    def scripts_loaded(self) -> bool:
        """True when Redis answers and ``SCRIPT EXISTS`` is true for every thread script."""
        found = self.client.script_exists(*self.scripts.shas_for(self.client))
        if isinstance(found, bool):
            return found
        return bool(found) and all(bool(x) for x in found)

    def close(self, *, cancel_wait_s: float = 10.0) -> None:
        """Cancel the turns running in this process (reason ``shutdown``), wait up to
        ``cancel_wait_s`` for them to close their ledgers, then close the client."""
        deadline = time.monotonic() + cancel_wait_s
        with self._active_lock:
            for state, cancelled in list(self._active.values()):
                self._cancel_local(state, cancelled, "shutdown")
            while self._continues and (left := deadline - time.monotonic()) > 0:
                self._active_lock.wait(left)
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
        return self._drive(
            "create",
            self.core.create(
                ownership,
                title=title,
                thread_id=thread_id,
                request_id=request_id,
                metadata=metadata,
            ),
        )

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
        return self._drive(
            "create",
            self.core.create_or_get(
                ownership,
                title=title,
                thread_id=thread_id,
                request_id=request_id,
                metadata=metadata,
            ),
        )

    def get(self, ownership: Ownership, thread_id: str) -> ConversationThread:
        """The thread, or ``not_found`` (also for another owner's thread)."""
        return self._drive("get", self.core.get(ownership, thread_id))

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
        with self._active_lock:
            self._continues += 1
        try:
            return self._continue(
                ownership, thread_id, message, request_id, leaf_id, run_options, identity
            )
        finally:
            with self._active_lock:
                self._continues -= 1
                self._active_lock.notify_all()

    def _continue(
        self,
        ownership: Ownership,
        thread_id: str,
        message: str,
        request_id: str | None,
        leaf_id: str | None,
        run_options: Mapping[str, Any] | None,
        identity: AgentIdentity | None,
    ) -> ContinueResult:
        return self._drive(
            "continue",
            self.core.continue_(
                ownership,
                thread_id,
                message,
                request_id=request_id,
                leaf_id=leaf_id,
                run_options=run_options,
                identity=identity,
            ),
        )

    def branch(
        self,
        ownership: Ownership,
        thread_id: str,
        leaf_id: str,
        *,
        expected_version: int | None = None,
    ) -> ConversationThread:
        """Record ``leaf_id`` (an entry of the thread) as a branch ref: CAS on the version."""
        return self._drive(
            "branch",
            self.core.branch(ownership, thread_id, leaf_id, expected_version=expected_version),
        )

    def archive(
        self, ownership: Ownership, thread_id: str, *, expected_version: int | None = None
    ) -> ConversationThread:
        """Archive the thread (no-op if archived): CAS on the version."""
        return self._drive(
            "archive", self.core.archive(ownership, thread_id, expected_version=expected_version)
        )

    def export(
        self, ownership: Ownership, thread_id: str, *, cursor: str | None = None
    ) -> ExportResult:
        """The thread and its redacted ledger, byte- and page-capped, resumable."""
        return self._drive("export", self.core.export(ownership, thread_id, cursor=cursor))

    def delete(self, ownership: Ownership, thread_id: str) -> DeleteResult:
        """Remove every key of the thread unless a legal hold is set (``held``)."""
        return self._drive("delete", self.core.delete(ownership, thread_id))

    def replay(
        self,
        ownership: Ownership,
        thread_id: str,
        *,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> ReplayPage:
        """A page of durable redacted events; never re-runs anything."""
        return self._drive(
            "replay", self.core.replay(ownership, thread_id, cursor=cursor, limit=limit)
        )

    def cancel_run(self, ownership: Ownership, thread_id: str, request_id: str) -> CancelResult:
        """Cancel the run of ``request_id`` (owner-only, idempotent): a running turn gets its
        cancellation signal, commits nothing and ends its ledger with ``cancelled``; its
        ``continue_`` raises ``run_cancelled``.  A finished run is left as it is."""
        result: CancelResult = self._drive(
            "cancel_run", self.core.cancel_run(ownership, thread_id, request_id)
        )
        if result.status == CancelStatus.CANCELLING:  # running here: signal it at once
            key = (self.core.thread_keys(ownership, thread_id).thread, result.request_id)
            with self._active_lock:
                active = self._active.get(key)
            if active is not None:
                self._cancel_local(active[0], active[1], "caller")
        return result

    def set_legal_hold(self, ownership: Ownership, thread_id: str) -> ConversationThread:
        """Operators: block deletion of the thread until released."""
        return self._drive("set_legal_hold", self.core.set_legal_hold(ownership, thread_id, True))

    def release_legal_hold(self, ownership: Ownership, thread_id: str) -> ConversationThread:
        """Operators: allow deletion again."""
        return self._drive(
            "release_legal_hold", self.core.set_legal_hold(ownership, thread_id, False)
        )

    def list(
        self, ownership: Ownership, *, cursor: str | None = None, limit: int | None = None
    ) -> ThreadPage:
        """The owner's threads, newest created first; ``next_cursor`` while more exist."""
        return self._drive("list", self.core.list_threads(ownership, cursor=cursor, limit=limit))

    def script_names(self) -> builtins.list[str]:
        return self.scripts.names()


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
    service = ConversationService(client, config, runner=runner, embedded=embedded, **options)
    return service
