"""The run-turn protocol, written once for both shells (no I/O, no threads, no tasks).

When the continue flow hands a claimed turn to its shell (a
:class:`~memtier.engine.Handoff` of a :class:`~memtier.threads.turns.TurnState`), the
shell runs the runner and, while it runs, must:

* record each event the runner emits (one ``events_append`` per event, in order);
* keep the thread's lease alive (``lease_renew`` every third of the lease) and stop the
  runner when a beat finds the run cancelled (``caller``) or the lease lost;
* stop the runner when its wall-clock allowance (a shared run limit) runs out;
* let :meth:`cancel_run` and shutdown stop it (the active-turn registry);
* measure the runner (``memtier_thread_runner_seconds`` by outcome).

:class:`TurnControl` holds all of that for one turn; the shells add only how they wait
and stop (a heartbeat thread, a timer and a ``threading.Event`` in
:mod:`memtier.threads.service`; a task, ``call_later`` and task cancellation in
:mod:`memtier.threads.aio`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from memtier import limits, metrics
from memtier.engine import ScriptCall
from memtier.errors import ConversationError, ErrorCode, MemtierError
from memtier.threads.ledger import check_event_type, event_data
from memtier.threads.models import MARKER, CancelResult, CancelStatus
from memtier.threads.runlimits import USAGE_EVENT, WALL_MS
from memtier.threads.runner import AgentDenied, RunnerEvent
from memtier.threads.specs import LEASE_RENEW, thread_call
from memtier.threads.status import ThreadStatus
from memtier.threads.turns import TurnState, append_call, check_append

if TYPE_CHECKING:
    from memtier.threads.core import ThreadsCore

__all__ = ["ActiveTurns", "TurnControl", "counted", "outcome_of"]

TurnKey = tuple[str, str]  # (thread key, request id)


def outcome_of(exc: BaseException | None) -> str:
    """Metric label of an operation's outcome: ``ok`` or the stable error code."""
    if exc is None:
        return "ok"
    if isinstance(exc, MemtierError):
        return exc.code
    return "error"


@contextmanager
def counted(operation: str) -> Iterator[None]:
    """Count one public operation in ``memtier_thread_operations_total`` by outcome."""
    failure: BaseException | None = None
    try:
        yield
    except BaseException as exc:
        failure = exc
        raise
    finally:
        metrics.THREAD_OPERATIONS.labels(operation, outcome_of(failure)).inc()


class TurnControl:
    """One running turn: what its emit, heartbeat, wall clock and cancellation do.

    ``stop`` is how the shell stops its runner (set an Event, cancel a task); the shell
    sets it before anything may call :meth:`cancel`.
    """

    def __init__(self, core: ThreadsCore, state: TurnState) -> None:
        self.core = core
        self.state = state
        self.stop: Callable[[], object] = lambda: None
        self.key: TurnKey = (state.keys.thread, state.request_id)

    # --- the runner's view ---------------------------------------------------------------

    def turn_fields(self) -> dict[str, Any]:
        """The fields of the RunnerTurn / AsyncRunnerTurn (the shell adds emit, cancelled)."""
        state = self.state
        return {
            "thread": state.thread,
            "history": state.history,
            "message": state.message,
            "request_id": state.request_id,
            "leaf_id": state.leaf_id,
            "run_options": state.run_options,
            "identity": state.identity,
            "allowance": None if state.budget is None else state.budget.remaining(),
        }

    def emit_call(self, event: RunnerEvent) -> ScriptCall | None:
        """The script call recording one runner event, or None if it is dropped (the
        shell serializes emits).

        Raises ConversationError(invalid_request) for a malformed or reserved type
        (a runner bug, reported to the runner).
        """
        state = self.state
        if not isinstance(event, RunnerEvent):
            raise ConversationError(ErrorCode.INVALID_REQUEST, "emit() takes a RunnerEvent")
        check_event_type(event.type)
        if state.closed:
            return None  # emitted after the turn ended: nothing is recorded
        if event.type == USAGE_EVENT and state.budget is not None:
            state.budget.consume(event.data)  # limit_exceeded (to the runner) past its allowance
        if state.kept >= limits.THREAD_EVENTS_PER_TURN:
            state.dropped += 1
            return None
        data = event_data(event.data)
        state.kept += 1
        state.seq += 1
        return append_call(self.core, state, [(event.type, data)], seq=state.seq)

    @staticmethod
    def check_emit(reply: Sequence[Any]) -> None:
        check_append(reply)

    # --- the heartbeat ---------------------------------------------------------------------

    @property
    def beat_interval(self) -> float:
        """Seconds between heartbeats: a third of the lease."""
        return self.core.lease_ms / 3000

    def renew_call(self) -> ScriptCall:
        state = self.state
        return thread_call(
            LEASE_RENEW, state.keys, marker=MARKER, token=state.token, lease_ms=self.core.lease_ms
        )

    def renewed(self, reply: Sequence[Any]) -> bool:
        """Whether to keep beating.  A failed renew stops the runner: ``caller`` (run_cancel
        marked the run) or ``lease_lost`` (expired, taken, or the thread deleted)."""
        status = int(reply[0])
        if status == ThreadStatus.OK:
            metrics.THREAD_LEASE_BEATS.labels("renewed").inc()
            return True
        cancelled = status == ThreadStatus.CANCELLED
        metrics.THREAD_LEASE_BEATS.labels("cancelled" if cancelled else "lost").inc()
        self.cancel("caller" if cancelled else "lease_lost")
        return False

    @staticmethod
    def missed_beat() -> None:
        """A renew that failed or was not answered before the next beat was due (the
        next beat tries again)."""
        metrics.THREAD_LEASE_BEATS.labels("missed").inc()

    # --- the wall clock and cancellation ----------------------------------------------------

    def wall_seconds(self) -> float | None:
        """The runner's wall-clock allowance in seconds (None: no such limit)."""
        budget = self.state.budget
        if budget is None or WALL_MS not in budget.allowance:
            return None
        return budget.allowance[WALL_MS] / 1000

    def out_of_time(self) -> None:
        budget = self.state.budget
        assert budget is not None
        budget.exceeded = budget.exceeded or WALL_MS
        self.cancel("limit")

    def cancel(self, reason: str) -> None:
        """Stop the runner; the first reason is the one the ledger records."""
        if self.state.cancel_reason is None:
            self.state.cancel_reason = reason
        self.stop()

    @contextmanager
    def running(self, active: ActiveTurns) -> Iterator[None]:
        """While the runner runs: registered as active, and timed by outcome."""
        active.add(self)
        outcome = "error"
        started = time.perf_counter()
        try:
            yield
            outcome = "ok"
        except AgentDenied:
            outcome = "denied"
            raise
        finally:
            active.remove(self)
            _runner_duration(outcome).observe(time.perf_counter() - started)


# THREAD_RUNNER_DURATION's children by outcome ("ok", "denied", "error"): looked up once
# per process, not on every turn (a labels() call takes the metric's lock).
_RUNNER_DURATIONS: dict[str, Any] = {}


def _runner_duration(outcome: str) -> Any:
    child = _RUNNER_DURATIONS.get(outcome)
    if child is None:
        child = _RUNNER_DURATIONS[outcome] = metrics.THREAD_RUNNER_DURATION.labels(outcome)
    return child


class ActiveTurns:
    """The turns running in this process, by (thread key, request id)."""

    def __init__(self) -> None:
        self._turns: dict[TurnKey, TurnControl] = {}
        self._lock = threading.Lock()

    def add(self, control: TurnControl) -> None:
        with self._lock:
            self._turns[control.key] = control

    def remove(self, control: TurnControl) -> None:
        with self._lock:
            if self._turns.get(control.key) is control:
                del self._turns[control.key]

    def cancel_all(self, reason: str) -> None:
        with self._lock:
            running = list(self._turns.values())
        for control in running:
            control.cancel(reason)

    def cancelled(self, thread_key: str, result: CancelResult) -> CancelResult:
        """After ``run_cancel`` marked a run: a turn of it running here stops at once."""
        if result.status == CancelStatus.CANCELLING:
            with self._lock:
                control = self._turns.get((thread_key, result.request_id))
            if control is not None:
                control.cancel("caller")
        return result
