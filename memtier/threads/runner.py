"""The host-supplied runner protocol: one agent turn on a thread.

A runner is a callable.  The service calls it once per turn with a
:class:`RunnerTurn` (sync service) or :class:`AsyncRunnerTurn` (asyncio
service) carrying

* ``thread`` -- the thread as stored when the turn was claimed;
* ``history`` -- the durable entries along the chosen branch, root first,
  rebuilt from Redis (so the agent sees prior turns, whichever process ran them);
* ``message`` -- the user's message, already redacted and bounded;
* ``run_options`` -- the caller's per-call options (model settings, tool choice,
  temperature...), validated against the schema the host declared, or ``None``;
* ``identity`` -- the verified :class:`AgentIdentity` of the calling agent, or ``None``;
* ``emit`` -- records one :class:`RunnerEvent` on the thread's ledger at once
  (so a client replaying mid-turn sees progress).  Event data is a *summary*:
  the service redacts secrets, replaces local paths with ``[PATH]``, omits raw
  payload fields (``raw``, ``payload``, ``arguments``, ``input``, ``output``,
  ``stdout``, ``stderr``, ``body``...), and cuts it to 16 KiB; at most 256
  events per turn are kept (the rest are counted in ``agent_finished``).

It returns a :class:`RunnerReply` (or a plain ``str``): the assistant's reply,
recorded as one entry.  Raising :class:`AgentDenied` records a denied turn
(``agent_denied``, no entries); any other exception records an ``error`` row
and the caller gets ``runner_failed`` (the request id may then be retried).

:class:`EchoRunner` is the deterministic built-in runner of ``memtier serve``.
:func:`adapt_sync_runner` lets the asyncio service run a sync runner in a
worker thread.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias

from memtier.threads.models import AgentIdentity, ConversationEntry, ConversationThread

__all__ = [
    "AgentDenied",
    "AsyncConversationRunner",
    "AsyncRunnerTurn",
    "ConversationRunner",
    "EchoRunner",
    "RunnerEvent",
    "RunnerReply",
    "RunnerResult",
    "RunnerTurn",
    "adapt_sync_runner",
    "as_async_runner",
]


@dataclass(frozen=True, slots=True)
class RunnerEvent:
    """One event a runner emits: a type (``[a-z][a-z0-9_.]{0,63}``, not reserved) and data."""

    type: str
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RunnerReply:
    """What a turn produced: the assistant reply (redacted and bounded before storage)."""

    content: str
    usage: Mapping[str, int] | None = None  # consumption of shared run limits (RunLimits)


RunnerResult: TypeAlias = RunnerReply | str
SYNC_CANCEL_WAIT_S = 30.0  # how long a cancelled sync runner (in a worker thread) is awaited


class AgentDenied(Exception):
    """Raised by a runner that refuses the turn (policy, permissions); recorded, not an error."""

    def __init__(self, reason: str = "denied") -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class RunnerTurn:
    """One turn handed to a sync runner; ``cancelled`` is set when the turn is cancelled
    (the caller's cancel, the service shutting down, the lease lost): stop soon -- what
    the runner returns afterwards is not committed."""

    thread: ConversationThread
    history: tuple[ConversationEntry, ...]
    message: str
    request_id: str
    leaf_id: str | None
    emit: Callable[[RunnerEvent], None]
    run_options: Mapping[str, Any] | None = None
    identity: AgentIdentity | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    allowance: Mapping[str, int] | None = None  # what the turn may consume (RunLimits)


@dataclass(frozen=True, slots=True)
class AsyncRunnerTurn:
    """One turn handed to an asyncio runner (``await turn.emit(event)``).

    A cancelled turn is cancelled the asyncio way: the runner's task gets
    ``CancelledError`` (clean up and re-raise; a reply returned anyway is not committed).
    """

    thread: ConversationThread
    history: tuple[ConversationEntry, ...]
    message: str
    request_id: str
    leaf_id: str | None
    emit: Callable[[RunnerEvent], Awaitable[None]]
    run_options: Mapping[str, Any] | None = None
    identity: AgentIdentity | None = None
    allowance: Mapping[str, int] | None = None  # what the turn may consume (RunLimits)


class ConversationRunner(Protocol):
    """A sync runner: ``runner(turn) -> RunnerReply | str``."""

    def __call__(self, turn: RunnerTurn, /) -> RunnerResult: ...


class AsyncConversationRunner(Protocol):
    """An asyncio runner: ``await runner(turn) -> RunnerReply | str``."""

    def __call__(self, turn: AsyncRunnerTurn, /) -> Awaitable[RunnerResult]: ...


def _echo_text(turn: RunnerTurn | AsyncRunnerTurn) -> str:
    return f"echo ({len(turn.history)} earlier entries): {turn.message}"


class EchoRunner:
    """Deterministic built-in runner: replies ``echo (<n> earlier entries): <message>``.

    It emits one ``echo.reply`` event with the reply's length; usable by both
    services (``__call__`` for sync, :meth:`run_async` for asyncio).
    """

    def __call__(self, turn: RunnerTurn) -> RunnerReply:
        text = _echo_text(turn)
        turn.emit(RunnerEvent("echo.reply", {"chars": len(text)}))
        return RunnerReply(text)

    async def run_async(self, turn: AsyncRunnerTurn) -> RunnerReply:
        text = _echo_text(turn)
        await turn.emit(RunnerEvent("echo.reply", {"chars": len(text)}))
        return RunnerReply(text)


def adapt_sync_runner(runner: ConversationRunner) -> AsyncConversationRunner:
    """Run a sync runner in a worker thread; its ``emit`` blocks on the event loop's write."""

    async def run(turn: AsyncRunnerTurn) -> RunnerResult:
        loop = asyncio.get_running_loop()

        def emit(event: RunnerEvent) -> None:
            asyncio.run_coroutine_threadsafe(_await(turn.emit(event)), loop).result()

        cancelled = threading.Event()
        sync_turn = RunnerTurn(
            thread=turn.thread,
            history=turn.history,
            message=turn.message,
            request_id=turn.request_id,
            leaf_id=turn.leaf_id,
            emit=emit,
            run_options=turn.run_options,
            identity=turn.identity,
            cancelled=cancelled,
            allowance=turn.allowance,
        )
        worker = asyncio.ensure_future(asyncio.to_thread(runner, sync_turn))
        try:
            return await asyncio.shield(worker)
        except asyncio.CancelledError:
            # asyncio cancellation -> the sync runner's threading.Event; wait (bounded) for
            # the worker thread to stop, so that nothing it does outlives the turn.  What
            # the runner ends with is not committed, an exception included: taken from the
            # worker whenever it ends, so asyncio does not log it as "never retrieved".
            cancelled.set()
            worker.add_done_callback(_discard_outcome)
            await asyncio.wait({worker}, timeout=SYNC_CANCEL_WAIT_S)
            raise

    return run


def _discard_outcome(worker: asyncio.Future[Any]) -> None:
    """A cancelled turn's worker: its result or exception, taken and dropped."""
    if not worker.cancelled():
        worker.exception()


async def _await(awaitable: Awaitable[None]) -> None:
    await awaitable


def as_async_runner(runner: Any) -> AsyncConversationRunner:
    """An asyncio runner from what a host supplied (async or sync callable, EchoRunner)."""
    if isinstance(runner, EchoRunner):
        return runner.run_async
    target = runner.__call__ if not inspect.isfunction(runner) else runner
    if inspect.iscoroutinefunction(runner) or inspect.iscoroutinefunction(target):
        return runner  # type: ignore[no-any-return]
    if callable(runner):
        return adapt_sync_runner(runner)
    raise TypeError(f"not a runner: {runner!r}")
