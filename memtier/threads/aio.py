"""The asyncio conversation service: the same flows as the sync one, on redis-py's asyncio client.

Method names, arguments, results and errors mirror
:class:`memtier.threads.service.ConversationService` exactly; the runner is
an async callable (a sync runner is run in a worker thread, see
:func:`memtier.threads.runner.as_async_runner`).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from memtier import limits, metrics
from memtier.config import MemtierConfig, ThreadsConfig
from memtier.connection import AsyncClientGuard, connect_async
from memtier.retry import RetryPolicy, retry_async
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
    TurnCancelled,
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
    AsyncConversationRunner,
    AsyncRunnerTurn,
    EchoRunner,
    RunnerEvent,
    RunnerResult,
    as_async_runner,
)

__all__ = ["AsyncConversationService", "create_async_conversation_service"]

T = TypeVar("T")


class AsyncConversationService:
    """Asyncio twin of :class:`~memtier.threads.service.ConversationService`."""

    def __init__(
        self,
        client: Any,
        config: MemtierConfig | None = None,
        *,
        runner: Any = None,
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
        self.runner: AsyncConversationRunner = as_async_runner(
            runner if runner is not None else EchoRunner()
        )
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
        # Turns running in this process: (thread key, request id) -> (state, runner task).
        self._active: dict[tuple[str, str], tuple[TurnState, asyncio.Task[Any]]] = {}
        self._continues: set[asyncio.Future[Any]] = set()  # continue calls in flight
        # Opens the client once (cluster: before the first command), bounds calls in flight.
        self.guard = AsyncClientGuard(client, self.config.redis)
        self.retry_policy = RetryPolicy.from_config(self.config)

    async def _retry(self, operation: str, fn: Callable[[], Awaitable[T]]) -> T:
        return await retry_async(operation, lambda: self.guard.call(fn), self.retry_policy)

    @property
    def limits(self) -> ThreadsConfig:
        return self.core.config

    # --- plumbing --------------------------------------------------------------------------------

    async def _execute(self, operation: str, op: Op) -> Any:
        if isinstance(op, ScriptOp):
            script = self.scripts[op.script]

            async def call() -> Any:
                if op.attempts is not None:
                    op.attempts[0] += 1
                return await script.call_async(self.client, op.keys, op.args)

            return await self._retry(operation, call)
        if isinstance(op, CommandOp):
            method = getattr(self.client, op.method)

            async def command() -> Any:
                return await method(*op.args, **dict(op.kwargs))

            return await self._retry(operation, command)
        if isinstance(op, BatchOp):

            async def batch() -> Any:
                pipe = self.client.pipeline(transaction=False)
                for cmd in op.commands:
                    getattr(pipe, cmd.method)(*cmd.args, **dict(cmd.kwargs))
                return await pipe.execute()

            return await self._retry(operation, batch)
        if isinstance(op, SleepOp):
            await asyncio.sleep(op.seconds)
            return None
        if isinstance(op, RunOp):
            return await self._run_turn(op.turn)
        raise TypeError(f"unknown operation {op!r}")  # pragma: no cover

    async def _drive(self, operation: str, flow: Flow[T]) -> T:
        failure: BaseException | None = None
        try:
            op = next(flow)
            while True:
                try:
                    value = await self._execute(operation, op)
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

    async def _run_turn(self, state: TurnState) -> RunnerResult:
        lock = asyncio.Lock()

        async def emit(event: RunnerEvent) -> None:
            async with lock:
                op = self.core.emit_op(state, event)
                if op is None:
                    return
                self.core.check_emit(await self._execute("emit", op))

        async def heartbeat() -> None:
            interval = self.core.lease_ms / 3000
            while True:
                await asyncio.sleep(interval)
                try:
                    reply = await self._execute("lease_renew", self.core.renew_op(state))
                except Exception:  # a missed beat is retried at the next interval
                    continue
                if not self.core.renew_ok(reply):
                    # cancelled by the caller, or lost / deleted: cancel the runner's task
                    self._cancel_local(state, self.core.renew_failure(reply))
                    return

        turn = AsyncRunnerTurn(
            thread=state.thread,
            history=state.history,
            message=state.message,
            request_id=state.request_id,
            leaf_id=state.leaf_id,
            emit=emit,
            run_options=state.run_options,
            identity=state.identity,
            allowance=None if state.budget is None else state.budget.remaining(),
        )
        outcome = "error"
        started = time.perf_counter()
        task: asyncio.Task[RunnerResult] = asyncio.ensure_future(self.runner(turn))
        key = (state.keys.thread, state.request_id)
        self._active[key] = (state, task)
        wall: asyncio.TimerHandle | None = None
        if state.budget is not None and WALL_MS in state.budget.allowance:

            def out_of_time() -> None:
                assert state.budget is not None
                state.budget.exceeded = state.budget.exceeded or WALL_MS
                self._cancel_local(state, "limit")

            wall = asyncio.get_running_loop().call_later(
                state.budget.allowance[WALL_MS] / 1000, out_of_time
            )
        beat = asyncio.create_task(heartbeat(), name="memtier-lease")
        try:
            try:
                result = await task
            except asyncio.CancelledError:
                if state.cancel_reason is None or not task.done():
                    raise  # this request itself was cancelled, not the turn
                raise TurnCancelled(state.cancel_reason) from None
            outcome = "ok"
            return result
        except AgentDenied:
            outcome = "denied"
            raise
        finally:
            if wall is not None:
                wall.cancel()
            self._active.pop(key, None)
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
            metrics.THREAD_RUNNER_DURATION.labels(outcome).observe(time.perf_counter() - started)

    # --- lifecycle -------------------------------------------------------------------------------

    async def load_scripts(self) -> None:
        """``SCRIPT LOAD`` every thread script (on Cluster: on every primary)."""
        await self._retry("load_scripts", lambda: self.scripts.load_all_async(self.client))

    async def scripts_loaded(self) -> bool:
        """True when Redis answers and ``SCRIPT EXISTS`` is true for every thread script."""
        shas = self.scripts.shas_for(self.client)
        found = await self.guard.call(lambda: self.client.script_exists(*shas))
        if isinstance(found, bool):
            return found
        return bool(found) and all(bool(x) for x in found)

    async def open(self) -> AsyncConversationService:
        """Initialise the client now (once; a cluster client reads its slot map).

        Optional: the first call opens it lazily, once, however many calls start together.
        """
        await retry_async("open", self.guard.open, self.retry_policy)
        return self

    def _cancel_local(self, state: TurnState, reason: str) -> None:
        active = self._active.get((state.keys.thread, state.request_id))
        if state.cancel_reason is None:
            state.cancel_reason = reason
        if active is not None:
            active[1].cancel()

    async def aclose(self, *, cancel_wait_s: float = 10.0) -> None:
        """Cancel the turns running in this process (reason ``shutdown``), wait up to
        ``cancel_wait_s`` for them to close their ledgers, then close the client."""
        for state, _ in list(self._active.values()):
            self._cancel_local(state, "shutdown")
        if self._continues:
            await asyncio.wait(set(self._continues), timeout=cancel_wait_s)
        await self.guard.aclose()

    async def __aenter__(self) -> AsyncConversationService:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- the API (see ConversationService for the documentation) --------------------------------

    async def create(
        self,
        ownership: Ownership,
        *,
        title: str | None = None,
        thread_id: str | None = None,
        request_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> ConversationThread:
        return await self._drive(
            "create",
            self.core.create(
                ownership,
                title=title,
                thread_id=thread_id,
                request_id=request_id,
                metadata=metadata,
            ),
        )

    async def create_or_get(
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
        return await self._drive(
            "create",
            self.core.create_or_get(
                ownership,
                title=title,
                thread_id=thread_id,
                request_id=request_id,
                metadata=metadata,
            ),
        )

    async def get(self, ownership: Ownership, thread_id: str) -> ConversationThread:
        return await self._drive("get", self.core.get(ownership, thread_id))

    async def continue_(
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
        call = asyncio.ensure_future(
            self._continue(
                ownership, thread_id, message, request_id, leaf_id, run_options, identity
            )
        )
        self._continues.add(call)
        try:
            return await asyncio.shield(call)
        except asyncio.CancelledError:
            call.cancel()
            raise
        finally:
            if call.done():
                self._continues.discard(call)
            else:
                call.add_done_callback(self._continues.discard)

    async def _continue(
        self,
        ownership: Ownership,
        thread_id: str,
        message: str,
        request_id: str | None,
        leaf_id: str | None,
        run_options: Mapping[str, Any] | None,
        identity: AgentIdentity | None,
    ) -> ContinueResult:
        return await self._drive(
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

    async def branch(
        self,
        ownership: Ownership,
        thread_id: str,
        leaf_id: str,
        *,
        expected_version: int | None = None,
    ) -> ConversationThread:
        return await self._drive(
            "branch",
            self.core.branch(ownership, thread_id, leaf_id, expected_version=expected_version),
        )

    async def archive(
        self, ownership: Ownership, thread_id: str, *, expected_version: int | None = None
    ) -> ConversationThread:
        return await self._drive(
            "archive", self.core.archive(ownership, thread_id, expected_version=expected_version)
        )

    async def export(
        self, ownership: Ownership, thread_id: str, *, cursor: str | None = None
    ) -> ExportResult:
        return await self._drive("export", self.core.export(ownership, thread_id, cursor=cursor))

    async def delete(self, ownership: Ownership, thread_id: str) -> DeleteResult:
        return await self._drive("delete", self.core.delete(ownership, thread_id))

    async def replay(
        self,
        ownership: Ownership,
        thread_id: str,
        *,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> ReplayPage:
        return await self._drive(
            "replay", self.core.replay(ownership, thread_id, cursor=cursor, limit=limit)
        )

    async def cancel_run(
        self, ownership: Ownership, thread_id: str, request_id: str
    ) -> CancelResult:
        result: CancelResult = await self._drive(
            "cancel_run", self.core.cancel_run(ownership, thread_id, request_id)
        )
        if result.status == CancelStatus.CANCELLING:  # running here: cancel it at once
            key = (self.core.thread_keys(ownership, thread_id).thread, result.request_id)
            active = self._active.get(key)
            if active is not None:
                self._cancel_local(active[0], "caller")
        return result

    async def set_legal_hold(self, ownership: Ownership, thread_id: str) -> ConversationThread:
        return await self._drive(
            "set_legal_hold", self.core.set_legal_hold(ownership, thread_id, True)
        )

    async def release_legal_hold(self, ownership: Ownership, thread_id: str) -> ConversationThread:
        return await self._drive(
            "release_legal_hold", self.core.set_legal_hold(ownership, thread_id, False)
        )

    async def list(
        self, ownership: Ownership, *, cursor: str | None = None, limit: int | None = None
    ) -> ThreadPage:
        return await self._drive(
            "list", self.core.list_threads(ownership, cursor=cursor, limit=limit)
        )

    def script_names(self) -> builtins.list[str]:
        return self.scripts.names()


def create_async_conversation_service(
    config: MemtierConfig | None = None,
    *,
    client: Any = None,
    runner: Any = None,
    **options: Any,
) -> AsyncConversationService:
    """An :class:`AsyncConversationService` on ``client``, or on the configured Redis."""
    config = config or MemtierConfig.load()
    embedded = False
    if client is None:
        client, embedded = connect_async(config)
    return AsyncConversationService(client, config, runner=runner, embedded=embedded, **options)
