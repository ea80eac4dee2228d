"""Perform the requests of :mod:`memtier.engine` on a redis-py client: the only I/O.

:class:`SyncExecutor` and :class:`AsyncExecutor` are the public way to run a plan's
requests (the stores, the threads service, the workers and the bench all use them):
each request goes through the client guard (back-pressure) and the bounded retry, and
each script reply is handed to the ``on_script`` hooks (metrics, progress).  A
:class:`~memtier.engine.Handoff` goes to the ``handoff`` callable the shell gave.

``operation`` names the retry metric's label: a shell binds it per public call
(``executor.bind("append")``) or leaves the script's name.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from memtier.aioleancluster import AsyncClusterLean, lean_cluster_async
from memtier.autopipeline import AutoPipeline, PipelineBounds
from memtier.connection import (
    AsyncClientGuard,
    LeanPool,
    SyncClientGuard,
    lean_async_pool,
    lean_pool,
)
from memtier.engine import (
    AsyncExecute,
    Batch,
    Command,
    Handoff,
    Overlap,
    Plan,
    Request,
    ScriptBatch,
    ScriptCall,
    SyncExecute,
    Transaction,
    drive_async,
    drive_sync,
)
from memtier.leancluster import ClusterLean, lean_cluster
from memtier.retry import RetryPolicy, retry_async, retry_sync
from memtier.scriptbatch import run_script_batch, run_script_batch_pipelined
from memtier.scripts import LuaScript, ScriptRegistry

__all__ = ["AsyncExecutor", "ScriptHook", "SyncExecutor"]

T = TypeVar("T")

# Called with (script name, ARGV, reply) after every script reply (each attempt).
ScriptHook = Callable[[str, Sequence[Any], Any], None]


class _OverlapWork:
    """An :class:`~memtier.engine.Overlap`'s work, run exactly once: on the lean path by
    the first send that wrote its request (between the write and the read, so Redis runs
    the script while the client works: no thread, no GIL handoffs), else after every
    attempt failed unwritten.  An ``Exception`` it raises is kept for
    :meth:`raise_error` (the connection is read in step first); anything else
    (``KeyboardInterrupt``) propagates and the connection is dropped."""

    __slots__ = ("error", "ran", "seconds", "work")

    def __init__(self, work: Callable[[], None]) -> None:
        self.work = work
        self.ran = False
        self.seconds = 0.0  # how long the work took (a script's latency metric leaves it out)
        self.error: Exception | None = None

    def __call__(self) -> None:
        if self.ran:
            return
        self.ran = True
        started = time.perf_counter()
        try:
            self.work()
        except Exception as exc:
            self.error = exc
        finally:
            self.seconds = time.perf_counter() - started

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error


class SyncExecutor:
    """Perform requests on a synchronous redis-py client (standalone or cluster)."""

    def __init__(
        self,
        client: Any,
        scripts: ScriptRegistry,
        guard: SyncClientGuard,
        policy: RetryPolicy,
        *,
        on_script: Sequence[ScriptHook] = (),
        handoff: Callable[[Any], Any] | None = None,
        lean: bool = True,
    ) -> None:
        self.client = client
        self.scripts = scripts
        self.guard = guard
        self.policy = policy
        self.on_script: list[ScriptHook] = list(on_script)
        self.handoff = handoff
        self.lean = lean  # False: every script call through redis-py's client (tests, bench)
        self.lean_calls = 0  # script attempts sent on the lean path (tests read it)
        self._lean_client: Any = None
        self._lean_pool: LeanPool | ClusterLean | None = None

    def _lean_for(self, client: Any) -> LeanPool | ClusterLean | None:
        """The lean path for ``client`` (decided once per client): a standalone client's
        pool, a cluster client's router, or None (the generic path)."""
        if not self.lean:
            return None
        if self._lean_client is not client:
            self._lean_pool = lean_pool(client) or lean_cluster(client)
            self._lean_client = client
        return self._lean_pool

    def run(self, plan: Plan[T], operation: str | None = None) -> T:
        """Drive ``plan`` to completion on this client."""
        return drive_sync(plan, self.bind(operation))

    def bind(self, operation: str | None) -> SyncExecute:
        """``execute`` for :func:`~memtier.engine.drive_sync`, retries labelled ``operation``."""
        return lambda request: self.execute(request, operation)

    def execute(self, request: Request, operation: str | None = None) -> Any:
        """Perform one request (not a Sleep: the driver waits)."""
        if isinstance(request, ScriptCall):
            return retry_sync(operation or request.script, self._script(request), self.policy)
        if isinstance(request, Transaction):
            return retry_sync(
                operation or request.script.script, self._transaction(request), self.policy
            )

        if isinstance(request, ScriptBatch):
            return self._script_batch(request, operation)
        if isinstance(request, Overlap):
            return self._overlap(request, operation)
        if isinstance(request, Command):
            bound = getattr(self.client, request.method)
            return retry_sync(
                operation or request.method,
                lambda: self.guard.call(lambda: bound(*request.args, **request.kwargs)),
                self.policy,
            )
        if isinstance(request, Batch):
            return retry_sync(
                operation or "batch",
                lambda: self.guard.call(lambda: self._batch(request)),
                self.policy,
            )
        if isinstance(request, Handoff):
            if self.handoff is None:
                raise TypeError("this executor takes no hand-off work")
            return self.handoff(request.work)
        raise TypeError(f"not an executable request: {request!r}")

    def _script(self, call: ScriptCall) -> Callable[[], Any]:
        script = self.scripts[call.script]
        return self._lean_script_attempt(call, script, None) or self._generic_script(call, script)

    def _lean_script_attempt(
        self, call: ScriptCall, script: LuaScript, during: _OverlapWork | None
    ) -> Callable[[], Any] | None:
        """``attempt`` on the lean path (standalone or cluster), else None."""
        # A registry entry that is not a LuaScript (a test double wrapping one) is called.
        lean = self._lean_for(self.client) if call.durable is None else None
        if isinstance(lean, LeanPool) and isinstance(script, LuaScript):
            return self._lean_script(call, script, lean, during)
        if (
            isinstance(lean, ClusterLean)
            and isinstance(script, LuaScript)
            and script.num_keys > 0
            and len(call.keys) == script.num_keys  # else the generic path raises ScriptError
        ):
            return self._lean_cluster_script(call, script, lean, during)
        return None

    def _generic_script(self, call: ScriptCall, script: LuaScript) -> Callable[[], Any]:
        client, durable = self.client, call.durable

        def attempt() -> Any:
            if call.attempts is not None:
                call.attempts[0] += 1
            if durable is None:
                reply = self.guard.call(lambda: script(client, call.keys, call.args))
            else:
                reply = self.guard.call(
                    lambda: script.call_replicated(client, call.keys, call.args, durable)
                )
            for hook in self.on_script:
                hook(call.script, call.args, reply)
            return reply

        return attempt

    def _lean_script(
        self, call: ScriptCall, script: LuaScript, lean: LeanPool, during: _OverlapWork | None
    ) -> Callable[[], Any]:
        """``attempt`` for a standalone client: the EVALSHA packed on the first attempt
        and re-sent as the same bytes by every retry (same guard, hooks and metrics)."""
        client, keys, args, wire = self.client, call.keys, call.args, call.wire
        packed: list[Any] = []
        return self._lean_attempt(
            call, lambda: script.call_lean(lean, client, keys, args, packed, wire, during)
        )

    def _lean_cluster_script(
        self, call: ScriptCall, script: LuaScript, lean: ClusterLean, during: _OverlapWork | None
    ) -> Callable[[], Any]:
        """``attempt`` for a cluster client: the slot computed once (from the first key:
        a script's keys share one hash tag), the EVALSHA packed on the first attempt, and
        every attempt routed by the slot map as it is then (a retry after a failover goes
        to the new primary)."""
        client, keys, args, wire = self.client, call.keys, call.args, call.wire
        slot = lean.slot(keys[0])
        packed: list[Any] = []
        return self._lean_attempt(
            call,
            lambda: script.call_lean_cluster(lean, slot, client, keys, args, packed, wire, during),
        )

    def _lean_attempt(self, call: ScriptCall, send: Callable[[], Any]) -> Callable[[], Any]:
        """One lean attempt: counted, ``send`` under the guard, every hook sees the reply."""
        args, hooks, guard = call.args, self.on_script, self.guard

        def attempt() -> Any:
            if call.attempts is not None:
                call.attempts[0] += 1
            self.lean_calls += 1
            reply = guard.call(send)
            for hook in hooks:
                hook(call.script, args, reply)
            return reply

        return attempt

    def _transaction(self, tx: Transaction) -> Callable[[], Any]:
        """``attempt`` for a :class:`Transaction`: on the lean path packed once (every
        retry and the NOSCRIPT re-send reuse the bytes), with the script's reads as plain
        commands where the request has them (:class:`~memtier.engine.PlainHead`), else
        redis-py's transactional pipeline with the script (fakeredis, Cluster on older
        redis-py, wrappers).  Hooks see the script's own reply either way."""
        call = tx.script
        script = self.scripts[call.script]
        client, keys, args, reads = self.client, call.keys, call.args, tx.reads
        hooks, guard = self.on_script, self.guard
        # A registry entry that is not a LuaScript (a test double) takes the generic path.
        # On a cluster: the slot's primary (every key of a transaction shares its tag).
        lean = self._lean_for(client) if isinstance(script, LuaScript) else None
        slot = lean.slot(keys[0]) if isinstance(lean, ClusterLean) and keys else -1
        if isinstance(lean, ClusterLean) and slot < 0:
            lean = None
        packed = tx.packed  # filled by the first lean send, reused by every later one

        def send() -> list[Any]:
            if lean is not None:
                self.lean_calls += 1
                return script.call_transaction_lean(
                    lean, client, keys, args, reads, packed, slot, tx.plain
                )
            return script.call_transaction(client, keys, args, reads)

        def attempt() -> Any:
            if call.attempts is not None:
                call.attempts[0] += 1
            replies = guard.call(send)
            for hook in hooks:
                hook(call.script, args, replies[0])
            return replies

        return attempt

    def _batch(self, batch: Batch) -> Any:
        pipe = self.client.pipeline(transaction=False)
        for command in batch.commands:
            getattr(pipe, command.method)(*command.args, **command.kwargs)
        return pipe.execute()

    def _overlap(self, overlap: Overlap, operation: str | None) -> Any:
        """A script call or script batch on the lean path is written first, the work runs
        here while Redis runs it, then the reply is read (:class:`_OverlapWork`).  A batch
        sent call by call runs the work beside its first call.  Any other request runs
        after the work: in a helper thread it cost more than it saved (GIL handoffs;
        bench.flushoverlap, docs/performance.md, "The flush's page work between a
        script's write and its read").  The work's error wins."""
        request = overlap.request
        work = _OverlapWork(overlap.work)
        attempt: Callable[[], Any] | None = None
        if isinstance(request, ScriptCall):
            name = request.script
            attempt = self._lean_script_attempt(request, self.scripts[name], work)
        elif isinstance(request, ScriptBatch) and request.calls:
            name = request.calls[0].script
            attempt = self._lean_batch_attempt(request, work)
            if attempt is None:
                first, *rest = request.calls
                replies = [self._overlap(Overlap(first, overlap.work), operation)]
                return replies + [self.execute(call, operation) for call in rest]
        if attempt is None:
            overlap.work()
            return self.execute(request, operation)
        try:
            reply = retry_sync(operation or name, attempt, self.policy)
        except Exception:
            work()  # every attempt failed before its write: the work runs now
            work.raise_error()
            raise
        work()  # (ran already, between the write and the read of the reply)
        work.raise_error()
        return reply

    def _script_batch(self, batch: ScriptBatch, operation: str | None) -> list[Any]:
        """One pipeline on a plain client where the lean path applies (standalone: one
        write; Redis Cluster: one write per primary), else the calls one by one; the hooks
        see every call's reply either way."""
        attempt = self._lean_batch_attempt(batch, None)
        if attempt is None:
            return [self.execute(call, operation) for call in batch.calls]
        result: list[Any] = retry_sync(operation or batch.calls[0].script, attempt, self.policy)
        return result

    def _lean_batch_attempt(
        self, batch: ScriptBatch, during: _OverlapWork | None
    ) -> Callable[[], list[Any]] | None:
        """``attempt`` for a batch of two or more calls on a plain client's lean path (one
        pipeline, on a Redis Cluster one per primary; ``during`` between the writes and
        the reads), else None."""
        calls = batch.calls
        client = self.client
        lean = self._lean_for(client)
        if (
            len(calls) < 2
            or lean is None
            or any(c.durable is not None for c in calls)
            or (isinstance(lean, ClusterLean) and not all(c.keys for c in calls))
            or not all(isinstance(self.scripts[c.script], LuaScript) for c in calls)
        ):
            return None
        items = [(self.scripts[c.script], c.keys, c.args) for c in calls]

        def attempt() -> list[Any]:
            for call in calls:
                if call.attempts is not None:
                    call.attempts[0] += 1
            self.lean_calls += 1
            replies = self.guard.call(lambda: run_script_batch(lean, client, items, during))
            for call, reply in zip(calls, replies, strict=True):
                for hook in self.on_script:
                    hook(call.script, call.args, reply)
            return replies

        return attempt


class AsyncExecutor:
    """Perform requests on an asyncio redis-py client (standalone or cluster)."""

    def __init__(
        self,
        client: Any,
        scripts: ScriptRegistry,
        guard: AsyncClientGuard,
        policy: RetryPolicy,
        *,
        on_script: Sequence[ScriptHook] = (),
        handoff: Callable[[Any], Awaitable[Any]] | None = None,
        pipeline: PipelineBounds | None = PipelineBounds(),
        lean: bool = True,
    ) -> None:
        self.client = client
        self.scripts = scripts
        self.guard = guard
        self.policy = policy
        self.on_script: list[ScriptHook] = list(on_script)
        self.handoff = handoff
        # None: every script call through redis-py's client (config auto_pipelining=false).
        self.pipeline_bounds = pipeline
        self._pipeline_client: Any = None
        self._pipeline: AutoPipeline | None = None
        # lean=False: every script call on a cluster through redis-py's client (tests, bench).
        self.lean = lean
        self._lean_client: Any = None
        self._lean_cluster: AsyncClusterLean | None = None

    def lean_cluster_for(self, client: Any) -> AsyncClusterLean | None:
        """The lean path of an asyncio cluster ``client`` (decided once per client), or
        None: the generic path (a standalone client, fakeredis, a wrapper, lean off)."""
        if not self.lean:
            return None
        if self._lean_client is not client:
            self._lean_cluster = lean_cluster_async(client, self.pipeline_bounds, self.guard)
            self._lean_client = client
        return self._lean_cluster

    def pipeline_for(self, client: Any) -> AutoPipeline | None:
        """The auto-pipeline of ``client`` (decided once per client), or None: the
        generic path (pipelining off, fakeredis, an asyncio cluster client, a wrapper)."""
        if self.pipeline_bounds is None:
            return None
        if self._pipeline_client is not client:
            pool = lean_async_pool(client)
            self._pipeline = (
                None if pool is None else AutoPipeline(pool, self.pipeline_bounds, self.guard)
            )
            self._pipeline_client = client
        return self._pipeline

    async def run(self, plan: Plan[T], operation: str | None = None, *, offload: bool = False) -> T:
        """Drive ``plan`` to completion (``offload``: its steps block, run them in a thread)."""
        return await drive_async(plan, self.bind(operation), offload=offload)

    def bind(self, operation: str | None) -> AsyncExecute:
        """``execute`` for :func:`~memtier.engine.drive_async`, retries labelled ``operation``."""
        return lambda request: self.execute(request, operation)

    async def execute(self, request: Request, operation: str | None = None) -> Any:
        """Perform one request (not a Sleep: the driver waits)."""
        if isinstance(request, ScriptCall):
            return await retry_async(
                operation or request.script, self._script(request), self.policy
            )
        if isinstance(request, Transaction):
            return await retry_async(
                operation or request.script.script, self._transaction(request), self.policy
            )

        if isinstance(request, ScriptBatch):
            return await self._script_batch(request, operation)
        if isinstance(request, Overlap):
            return await self._overlap(request, operation)
        if isinstance(request, Command):
            bound = getattr(self.client, request.method)
            return await retry_async(
                operation or request.method,
                lambda: self.guard.call(lambda: bound(*request.args, **request.kwargs)),
                self.policy,
            )
        if isinstance(request, Batch):
            return await retry_async(
                operation or "batch",
                lambda: self.guard.call(lambda: self._batch(request)),
                self.policy,
            )
        if isinstance(request, Handoff):
            if self.handoff is None:
                raise TypeError("this executor takes no hand-off work")
            return await self.handoff(request.work)
        raise TypeError(f"not an executable request: {request!r}")

    def _script(self, call: ScriptCall) -> Callable[[], Awaitable[Any]]:
        script = self.scripts[call.script]
        client, durable = self.client, call.durable
        pipeline = self.pipeline_for(client) if durable is None else None
        if pipeline is not None and isinstance(script, LuaScript):
            return self._pipelined_script(call, script, pipeline)
        lean = self.lean_cluster_for(client) if durable is None else None
        if (
            lean is not None
            and isinstance(script, LuaScript)
            and script.num_keys > 0
            and len(call.keys) == script.num_keys  # else the generic path raises ScriptError
        ):
            return self._lean_cluster_script(call, script, lean)

        async def attempt() -> Any:
            if call.attempts is not None:
                call.attempts[0] += 1
            if durable is None:
                reply = await self.guard.call(
                    lambda: script.call_async(client, call.keys, call.args)
                )
            else:
                reply = await self.guard.call(
                    lambda: script.call_replicated_async(client, call.keys, call.args, durable)
                )
            for hook in self.on_script:
                hook(call.script, call.args, reply)
            return reply

        return attempt

    def _transaction(self, tx: Transaction) -> Callable[[], Awaitable[Any]]:
        call = tx.script
        script = self.scripts[call.script]
        client, keys, args, reads = self.client, call.keys, call.args, tx.reads
        # Standalone: the transaction rides the loop tick's auto-pipelined batch; on a
        # cluster it goes lean to the slot's primary (every key shares its tag).
        pipeline = self.pipeline_for(client) if isinstance(script, LuaScript) else None
        lean = None
        if pipeline is None and isinstance(script, LuaScript) and keys:
            lean = self.lean_cluster_for(client)
        slot = lean.slot(keys[0]) if lean is not None else -1
        packed = tx.packed  # filled by the first send, reused by every later one

        def send() -> Awaitable[list[Any]]:
            if pipeline is not None:
                return script.call_transaction_pipelined(
                    pipeline, client, keys, args, reads, packed, tx.plain
                )
            if lean is not None:
                return script.call_transaction_lean_cluster_async(
                    lean, slot, client, keys, args, reads, packed, tx.plain
                )
            return script.call_transaction_async(client, keys, args, reads)

        # A batch (standalone, or a cluster node's) takes the guard's slot for its callers.
        batched = pipeline is not None or (lean is not None and lean.pipelined)
        guarded = self.guard.call_pipelined if batched else self.guard.call

        async def attempt() -> Any:
            if call.attempts is not None:
                call.attempts[0] += 1
            replies = await guarded(send)
            for hook in self.on_script:
                hook(call.script, args, replies[0])
            return replies

        return attempt

    def _pipelined_script(
        self, call: ScriptCall, script: LuaScript, pipeline: AutoPipeline
    ) -> Callable[[], Awaitable[Any]]:
        """``attempt`` for a standalone asyncio client: the EVALSHA packed on the first
        attempt, queued in the loop tick's batch, and re-queued as the same bytes by every
        retry (same hooks and metrics as the generic path; its batch holds the guard's slot).
        """
        client, keys, args = self.client, call.keys, call.args
        hooks, guard = self.on_script, self.guard
        packed: list[bytes] = []

        def send() -> Awaitable[Any]:
            return script.call_pipelined(pipeline, client, keys, args, packed, call.wire)

        async def attempt() -> Any:
            if call.attempts is not None:
                call.attempts[0] += 1
            reply = await guard.call_pipelined(send)  # the batch takes the slot
            for hook in hooks:
                hook(call.script, args, reply)
            return reply

        return attempt

    def _lean_cluster_script(
        self, call: ScriptCall, script: LuaScript, lean: AsyncClusterLean
    ) -> Callable[[], Awaitable[Any]]:
        """``attempt`` for an asyncio cluster client: the slot computed once (from the
        first key: a script's keys share one hash tag), the EVALSHA packed on the first
        attempt, and every attempt routed by the slot map as it is then (a retry after a
        failover goes to the new primary, once the guard re-read the map)."""
        client, keys, args = self.client, call.keys, call.args
        hooks, guard = self.on_script, self.guard
        # With node pipelines the batch takes the guard's slot, not each caller.
        guarded = guard.call_pipelined if lean.pipelined else guard.call
        slot = lean.slot(keys[0])
        packed: list[bytes] = []

        def send() -> Awaitable[Any]:
            return script.call_lean_cluster_async(lean, slot, client, keys, args, packed, call.wire)

        async def attempt() -> Any:
            if call.attempts is not None:
                call.attempts[0] += 1
            reply = await guarded(send)
            for hook in hooks:
                hook(call.script, args, reply)
            return reply

        return attempt

    async def _script_batch(self, batch: ScriptBatch, operation: str | None) -> list[Any]:
        """On an auto-pipelined client the whole batch queued at once by this coroutine,
        in the standalone pipeline or each call's primary's, and retried as one
        (:meth:`_pipelined_batch`); else the calls one by one."""
        calls = batch.calls
        client = self.client
        # (a durable call waits for replicas on its own connection: not pipelined)
        if len(calls) < 2 or any(c.durable is not None for c in calls):
            return [await self.execute(call, operation) for call in calls]
        router: AutoPipeline | AsyncClusterLean | None = self.pipeline_for(client)
        if router is None:
            cluster = self.lean_cluster_for(client)
            if cluster is not None and cluster.pipelined and all(c.keys for c in calls):
                router = cluster
        if router is None or not all(isinstance(self.scripts[c.script], LuaScript) for c in calls):
            return [await self.execute(call, operation) for call in calls]
        attempt = self._pipelined_batch(calls, router)
        result: list[Any] = await retry_async(operation or calls[0].script, attempt, self.policy)
        return result

    def _pipelined_batch(
        self, calls: tuple[ScriptCall, ...], router: AutoPipeline | AsyncClusterLean
    ) -> Callable[[], Awaitable[list[Any]]]:
        """``attempt`` for a script batch on an auto-pipelined asyncio client: every call
        packed on the first attempt and queued at once in its pipeline's batch
        (:func:`~memtier.scriptbatch.run_script_batch_pipelined`); a retry re-queues the
        whole batch's bytes, as the sync lean batch re-sends its pipeline (the calls are
        safe to re-send: :class:`~memtier.engine.ScriptBatch`).  Same hooks and attempt
        counts per call as the calls one by one."""
        client, hooks = self.client, self.on_script
        items = [(self.scripts[c.script], c.keys, c.args) for c in calls]
        packed: list[list[bytes]] = []

        async def attempt() -> list[Any]:
            for call in calls:
                if call.attempts is not None:
                    call.attempts[0] += 1
            replies = await self.guard.call_pipelined(  # each batch takes a slot
                lambda: run_script_batch_pipelined(router, client, items, packed)
            )
            for call, reply in zip(calls, replies, strict=True):
                for hook in hooks:
                    hook(call.script, call.args, reply)
            return replies

        return attempt

    async def _overlap(self, overlap: Overlap, operation: str | None) -> Any:
        """The request as a task on this loop while the work runs in a worker thread
        (the plans that overlap are the offloaded ones: their work blocks)."""
        task = asyncio.ensure_future(self.execute(overlap.request, operation))
        try:
            await asyncio.to_thread(overlap.work)
        except BaseException:
            await asyncio.wait([task])  # nothing stays in flight
            if not task.cancelled():
                task.exception()  # retrieved: the work's error is the one raised
            raise
        return await task

    async def _batch(self, batch: Batch) -> Any:
        pipe = self.client.pipeline(transaction=False)
        for command in batch.commands:
            getattr(pipe, command.method)(*command.args, **command.kwargs)
        return await pipe.execute()
