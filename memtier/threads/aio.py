"""The asyncio conversation service: the same plans as the sync one, on redis-py's asyncio client.

Method names, arguments, results and errors mirror
:class:`memtier.threads.service.ConversationService` exactly; the runner is
an async callable (a sync runner is run in a worker thread, see
:func:`memtier.threads.runner.as_async_runner`).  A claimed turn runs as a task: the
heartbeat is a second task, the wall-clock limit a ``call_later``, and cancellation
cancels the runner's task (:mod:`memtier.threads.runturn` holds the rest).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from memtier import limits
from memtier.autopipeline import PipelineBounds
from memtier.config import MemtierConfig, ThreadsConfig
from memtier.connection import AsyncClientGuard, connect_async
from memtier.engine import Plan
from memtier.executor import AsyncExecutor
from memtier.retry import RetryPolicy, retry_async
from memtier.scripts import ScriptRegistry, load_registry
from memtier.threads.core import ThreadsCore, TurnCancelled, TurnState
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
    AsyncConversationRunner,
    AsyncRunnerTurn,
    EchoRunner,
    RunnerEvent,
    RunnerResult,
    as_async_runner,
)
from memtier.threads.runturn import ActiveTurns, TurnControl, counted

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
        # Opens the client once (cluster: before the first command), bounds calls in flight.
        self.guard = AsyncClientGuard(client, self.config.redis)
        self.retry_policy = RetryPolicy.from_config(self.config)
        self.executor = AsyncExecutor(
            client,
            load_registry("threads"),
            self.guard,
            self.retry_policy,
            handoff=self._run_turn,
            pipeline=PipelineBounds.from_settings(self.config.redis),
        )
        self.turns = ActiveTurns()  # turns running in this process (cancel_run, aclose)
        self._continues: set[asyncio.Future[Any]] = set()  # continue calls in flight

    @property
    def limits(self) -> ThreadsConfig:
        return self.core.config

    @property
    def scripts(self) -> ScriptRegistry:
        return self.executor.scripts

    @scripts.setter
    def scripts(self, registry: ScriptRegistry) -> None:
        self.executor.scripts = registry

    async def _run(self, operation: str, plan: Plan[T]) -> T:
        with counted(operation):
            return await self.executor.run(plan, operation)

    async def _run_turn(self, state: TurnState) -> RunnerResult:
        """The plan's hand-off: run the runner for a claimed turn."""
        control = TurnControl(self.core, state)
        return await _run_in_task(control, self.runner, self.executor, self.turns)

    # --- lifecycle -------------------------------------------------------------------------------

    async def load_scripts(self) -> None:
        """``SCRIPT LOAD`` every thread script (on Cluster: on every primary)."""
        load = lambda: self.guard.call(lambda: self.scripts.load_all_async(self.client))  # noqa: E731
        await retry_async("load_scripts", load, self.retry_policy)

    async def scripts_loaded(self) -> bool:
        """True when Redis answers and ``SCRIPT EXISTS`` is true for every thread script."""
        shas = self.scripts.shas_for(self.client)
        found = await self.guard.call(lambda: self.client.script_exists(*shas))
        return found if isinstance(found, bool) else bool(found) and all(bool(x) for x in found)

    async def open(self) -> AsyncConversationService:
        """Initialise the client now (once; a cluster client reads its slot map).

        Optional: the first call opens it lazily, once, however many calls start together.
        """
        await retry_async("open", self.guard.open, self.retry_policy)
        return self

    async def aclose(self, *, cancel_wait_s: float = 10.0) -> None:
        """Cancel the turns running in this process (reason ``shutdown``), wait up to
        ``cancel_wait_s`` for them to close their ledgers, then close the client."""
        self.turns.cancel_all("shutdown")
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
        plan = self.core.create(
            ownership, title=title, thread_id=thread_id, request_id=request_id, metadata=metadata
        )
        return await self._run("create", plan)

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
        plan = self.core.create_or_get(
            ownership, title=title, thread_id=thread_id, request_id=request_id, metadata=metadata
        )
        return await self._run("create", plan)

    async def get(self, ownership: Ownership, thread_id: str) -> ConversationThread:
        return await self._run("get", self.core.get(ownership, thread_id))

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
        plan = self.core.continue_(
            ownership,
            thread_id,
            message,
            request_id=request_id,
            leaf_id=leaf_id,
            run_options=run_options,
            identity=identity,
        )
        return await _tracked(self._continues, self._run("continue", plan))

    async def branch(
        self,
        ownership: Ownership,
        thread_id: str,
        leaf_id: str,
        *,
        expected_version: int | None = None,
    ) -> ConversationThread:
        plan = self.core.branch(ownership, thread_id, leaf_id, expected_version=expected_version)
        return await self._run("branch", plan)

    async def archive(
        self, ownership: Ownership, thread_id: str, *, expected_version: int | None = None
    ) -> ConversationThread:
        plan = self.core.archive(ownership, thread_id, expected_version=expected_version)
        return await self._run("archive", plan)

    async def export(
        self, ownership: Ownership, thread_id: str, *, cursor: str | None = None
    ) -> ExportResult:
        return await self._run("export", self.core.export(ownership, thread_id, cursor=cursor))

    async def delete(self, ownership: Ownership, thread_id: str) -> DeleteResult:
        return await self._run("delete", self.core.delete(ownership, thread_id))

    async def replay(
        self,
        ownership: Ownership,
        thread_id: str,
        *,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> ReplayPage:
        plan = self.core.replay(ownership, thread_id, cursor=cursor, limit=limit)
        return await self._run("replay", plan)

    async def cancel_run(
        self, ownership: Ownership, thread_id: str, request_id: str
    ) -> CancelResult:
        plan = self.core.cancel_run(ownership, thread_id, request_id)
        result = await self._run("cancel_run", plan)
        return self.turns.cancelled(self.core.thread_keys(ownership, thread_id).thread, result)

    async def set_legal_hold(self, ownership: Ownership, thread_id: str) -> ConversationThread:
        plan = self.core.set_legal_hold(ownership, thread_id, True)
        return await self._run("set_legal_hold", plan)

    async def release_legal_hold(self, ownership: Ownership, thread_id: str) -> ConversationThread:
        plan = self.core.set_legal_hold(ownership, thread_id, False)
        return await self._run("release_legal_hold", plan)

    async def list(
        self, ownership: Ownership, *, cursor: str | None = None, limit: int | None = None
    ) -> ThreadPage:
        plan = self.core.list_threads(ownership, cursor=cursor, limit=limit)
        return await self._run("list", plan)


async def _tracked(continues: set[asyncio.Future[Any]], call: Awaitable[T]) -> T:
    """Run one continue as its own task, tracked in ``continues`` until it ends: aclose
    waits for it; a cancelled caller cancels it (shielded, so it closes its ledger)."""
    task = asyncio.ensure_future(call)
    continues.add(task)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        if task.done():
            continues.discard(task)
        else:
            task.add_done_callback(continues.discard)


async def _run_in_task(
    control: TurnControl,
    runner: AsyncConversationRunner,
    executor: AsyncExecutor,
    active: ActiveTurns,
) -> RunnerResult:
    """Run the runner as a task; a heartbeat task renews the lease, ``call_later`` enforces
    the wall-clock limit, and cancellation cancels the runner's task."""
    emitting = asyncio.Lock()

    async def emit(event: RunnerEvent) -> None:
        async with emitting:
            call = control.emit_call(event)
            if call is not None:
                control.check_emit(await executor.execute(call, "emit"))

    async def heartbeat() -> None:
        # Beats keep to a fixed schedule, and each renew is bounded by the next one's due
        # time: a renew stuck on a dead connection or in retry back-off does not hold up
        # the beats behind it (the lease would expire while it waits).
        loop, interval = asyncio.get_running_loop(), control.beat_interval
        due = loop.time()
        while True:
            due = max(due + interval, loop.time())  # a stalled loop resumes from now
            await asyncio.sleep(due - loop.time())
            try:
                async with asyncio.timeout_at(due + interval):
                    reply = await executor.execute(control.renew_call(), "lease_renew")
            except Exception:  # a missed or superseded beat: the next one is due already
                control.missed_beat()
                continue
            if not control.renewed(reply):
                return  # cancelled by the caller, or lost / deleted: the runner's task was

    turn = AsyncRunnerTurn(**control.turn_fields(), emit=emit)
    with control.running(active):
        task: asyncio.Task[RunnerResult] = asyncio.ensure_future(runner(turn))
        control.stop = task.cancel
        wall: asyncio.TimerHandle | None = None
        if (seconds := control.wall_seconds()) is not None:
            wall = asyncio.get_running_loop().call_later(seconds, control.out_of_time)
        beat = asyncio.create_task(heartbeat(), name="memtier-lease")
        try:
            try:
                return await task
            except asyncio.CancelledError:
                reason = control.state.cancel_reason
                if reason is None or not task.done():
                    raise  # this request itself was cancelled, not the turn
                raise TurnCancelled(reason) from None
        finally:
            if wall is not None:
                wall.cancel()
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat


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
