"""A LangGraph checkpointer on plain Redis and Redis Cluster (no RediSearch, no RedisJSON).

``pip install 'memtier[langgraph]'``; then
``graph = builder.compile(checkpointer=MemtierCheckpointSaver.from_config(config))``.

Every key of one thread carries the thread's hash tag (:class:`memtier.keys.
CheckpointKeyspace`), so each write is one Lua script on one slot: ``put`` stores the
checkpoint, its metadata and the new channel blobs atomically, under the thread's byte
ceiling, with exact accounting and the thread's TTL refreshed (``lua/langgraph/``).
Sync and asyncio forms: the sync methods use ``client``, the ``a*`` methods ``aclient``
(or the sync client in a worker thread when there is none).  Base capabilities (put,
put_writes, get_tuple, list, delete_thread) and the extended ones (copy_thread,
delete_for_runs, prune) pass the published ``langgraph-checkpoint-conformance`` suite
on a real Redis and a real cluster (tests/integrations/test_langgraph_conformance.py).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from functools import partial
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from memtier import limits, metrics
from memtier.config import MemtierConfig
from memtier.engine import ScriptCall
from memtier.errors import ConfigurationError
from memtier.integrations._checkpoint_core import (
    Budget,
    CheckpointSteps,
    as_str,
    bounded,
    ident,
    page_args,
    prune_mode,
    thread_id_of,
)
from memtier.keys import CheckpointKeyspace
from memtier.retry import retry_async, retry_sync
from memtier.scripts import load_registry

__all__ = ["MemtierCheckpointSaver"]


class MemtierCheckpointSaver(CheckpointSteps, BaseCheckpointSaver[str]):
    """LangGraph ``BaseCheckpointSaver`` over Redis or Redis Cluster, in memtier's conventions.

    ``client`` / ``aclient``: redis-py clients (standalone or cluster; bytes replies, i.e.
    ``decode_responses=False``).  ``namespace``: memtier's key namespace (the config's by
    default).  ``ttl_s``: a thread's keys expire this long after its last write (default
    7 days, ceiling 30).  ``max_thread_bytes``: the most one thread may store (default
    16 MiB, ceiling 256 MiB); a write past it raises :class:`~memtier.CapacityError` and
    stores nothing.
    """

    def __init__(
        self,
        client: Any = None,
        *,
        aclient: Any = None,
        namespace: str | None = None,
        ttl_s: float | None = None,
        max_thread_bytes: int | None = None,
        serde: SerializerProtocol | None = None,
        config: MemtierConfig | None = None,
    ) -> None:
        super().__init__(serde=serde)
        if client is None and aclient is None:
            raise ConfigurationError("MemtierCheckpointSaver needs a client or an aclient")
        self.client = client
        self.aclient = aclient
        ns = namespace if namespace is not None else (config or MemtierConfig.load()).namespace
        self.keyspace = CheckpointKeyspace(ns)
        self.ttl_ms = int(bounded(ttl_s, limits.CHECKPOINT_THREAD_TTL_SECONDS, "ttl_s") * 1000)
        self.max_thread_bytes = int(
            bounded(max_thread_bytes, limits.CHECKPOINT_THREAD_BYTES, "max_thread_bytes")
        )
        self.scripts = load_registry("langgraph")

    @classmethod
    def from_config(
        cls, config: MemtierConfig | None = None, **options: Any
    ) -> MemtierCheckpointSaver:
        """Both clients connected as configured (``redis_url``; cluster URLs included)."""
        from memtier.connection import connect_async, connect_sync

        config = config or MemtierConfig.load()
        if config.redis_url is None:
            raise ConfigurationError("the LangGraph checkpointer needs redis_url (no embedded)")
        client, _ = connect_sync(config)
        aclient, _ = connect_async(config)
        return cls(client, aclient=aclient, config=config, **options)

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Monotonic, lexicographically ordered versions (as LangGraph's own savers)."""
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(str(current).split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"

    # --- sync ----------------------------------------------------------------------------------
    def _sync(self) -> Any:
        if self.client is None:
            raise ConfigurationError("this checkpointer has no sync client (pass client=)")
        return self.client

    def _script(self, operation: str, call: ScriptCall) -> Any:
        client, script = self._sync(), self.scripts[call.script]
        return retry_sync(operation, lambda: script(client, call.keys, call.args))

    def _fill_index(self, tid: str, runs: set[str] | None, pipe: Any) -> None:
        now = int(time.time() * 1000)
        pipe.zadd(self.keyspace.threads, {tid: now})
        # Threads whose keys have expired by their TTL leave the index: it stays bounded.
        pipe.zremrangebyscore(self.keyspace.threads, "-inf", f"({now - self.ttl_ms}")
        for run in runs or ():
            pipe.sadd(self.keyspace.run(run), tid)
            pipe.pexpire(self.keyspace.run(run), self.ttl_ms)

    def _index(self, tid: str, runs: set[str] | None) -> None:
        def run() -> Any:
            pipe = self._sync().pipeline(transaction=False)
            self._fill_index(tid, runs, pipe)
            return pipe.execute()

        retry_sync("checkpoint_index", run)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        tid, _ns, ops, run, next_config = self._put_plan(config, checkpoint, metadata, new_versions)
        self._index(tid, {run} if run else None)
        reply = self._script("put", self._write_call(tid, ops))
        self._written("put", reply)
        return next_config

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        tid, ops = self._writes_ops(config, writes, task_id, task_path)
        if not ops:
            return
        reply = self._script("put_writes", self._write_call(tid, ops))
        self._written("put_writes", reply)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        tid, call = self._get_request(config)
        reply = self._script("get_tuple", call)
        found = self._decode_records(tid, reply)
        metrics.CHECKPOINT_OPERATIONS.labels("get_tuple", "ok").inc()
        return found[0] if found else None

    def _list_thread(
        self,
        tid: str,
        config: RunnableConfig,
        flt: dict[str, Any] | None,
        before: RunnableConfig | None,
        budget: Budget,
    ) -> Iterator[CheckpointTuple]:
        _ns, cid, high, low = self._range(config, before)
        before_id = get_checkpoint_id(before) if before else None
        keys = self._keys(tid)
        client = self._sync()
        offset = 0
        while budget.left != 0:
            page = retry_sync("list", partial(client.zrange, **page_args(keys, high, low, offset)))
            if not page:
                return
            offset += len(page)
            reply = self._script("list", self._read_call(tid, "ids", page))
            for tup in self._decode_records(tid, reply):
                if self._keep(tup, cid, before_id, flt) and budget.left != 0:
                    budget.left -= 1
                    yield tup
            if len(page) < limits.CHECKPOINT_LIST_PAGE:
                return

    def _thread_ids(self) -> list[str]:
        raw = retry_sync(
            "list",
            lambda: self._sync().zrange(
                self.keyspace.threads, 0, limits.CHECKPOINT_LIST_THREADS - 1, desc=True
            ),
        )
        return [as_str(t) for t in raw]

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        budget = Budget(-1 if limit is None else max(0, int(limit)))
        if config is not None:
            yield from self._list_thread(thread_id_of(config), config, filter, before, budget)
        else:
            for tid in self._thread_ids():
                everything: RunnableConfig = {"configurable": {"thread_id": tid}}
                yield from self._list_thread(tid, everything, filter, before, budget)
        metrics.CHECKPOINT_OPERATIONS.labels("list", "ok").inc()

    def _drop(self, tid: str, operation: str, args: Sequence[Any]) -> int:
        reply = self._script(operation, self._drop_call(tid, args[0], args[1:]))
        if int(reply[2]) == 0:
            retry_sync("checkpoint_index", lambda: self._sync().zrem(self.keyspace.threads, tid))
        metrics.CHECKPOINT_OPERATIONS.labels(operation, "ok").inc()
        return int(reply[0])

    def delete_thread(self, thread_id: str) -> None:
        self._drop(thread_id_of(thread_id), "delete_thread", ["thread"])

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        runs = [ident(str(r), "run_id") for r in run_ids]
        client = self._sync()
        for run in runs:
            key = self.keyspace.run(run)
            tids = sorted(
                as_str(t) for t in retry_sync("delete_for_runs", partial(client.smembers, key))
            )
            for tid in tids[: limits.CHECKPOINT_RUN_THREADS]:
                self._drop(tid, "delete_for_runs", ["runs", run])
            retry_sync("delete_for_runs", partial(client.delete, key))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        src, dst = thread_id_of(source_thread_id), thread_id_of(target_thread_id)
        dump = self._script("copy_thread", self._dump_call(src))
        ops, runs = self._dump_ops(dump)
        if not ops:
            return
        self._index(dst, runs)
        reply = self._script("copy_thread", self._write_call(dst, ops))
        self._written("copy_thread", reply)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        mode = prune_mode(strategy)
        for tid in thread_ids:
            self._drop(thread_id_of(tid), "prune", [mode])

    # --- asyncio -------------------------------------------------------------------------------
    async def _ascript(self, operation: str, call: ScriptCall) -> Any:
        if self.aclient is None:
            return await asyncio.to_thread(self._script, operation, call)
        aclient, script = self.aclient, self.scripts[call.script]
        return await retry_async(
            operation, lambda: script.call_async(aclient, call.keys, call.args)
        )

    async def _acommand(self, operation: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """One redis-py command on the async client (or the sync one, in a worker thread)."""
        if self.aclient is None:
            fn = getattr(self._sync(), method)
            return await asyncio.to_thread(retry_sync, operation, partial(fn, *args, **kwargs))
        afn = getattr(self.aclient, method)
        return await retry_async(operation, partial(afn, *args, **kwargs))

    async def _apipeline(self, operation: str, fill: Callable[[Any], None]) -> Any:
        if self.aclient is None:

            def run() -> Any:
                pipe = self._sync().pipeline(transaction=False)
                fill(pipe)
                return pipe.execute()

            return await asyncio.to_thread(retry_sync, operation, run)
        aclient = self.aclient

        async def arun() -> Any:
            pipe = aclient.pipeline(transaction=False)
            fill(pipe)
            return await pipe.execute()

        return await retry_async(operation, arun)

    async def _aindex(self, tid: str, runs: set[str] | None) -> None:
        await self._apipeline("checkpoint_index", partial(self._fill_index, tid, runs))

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        tid, _ns, ops, run, next_config = self._put_plan(config, checkpoint, metadata, new_versions)
        await self._aindex(tid, {run} if run else None)
        reply = await self._ascript("put", self._write_call(tid, ops))
        self._written("put", reply)
        return next_config

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        tid, ops = self._writes_ops(config, writes, task_id, task_path)
        if not ops:
            return
        reply = await self._ascript("put_writes", self._write_call(tid, ops))
        self._written("put_writes", reply)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        tid, call = self._get_request(config)
        reply = await self._ascript("get_tuple", call)
        found = self._decode_records(tid, reply)
        metrics.CHECKPOINT_OPERATIONS.labels("get_tuple", "ok").inc()
        return found[0] if found else None

    async def _alist_thread(
        self,
        tid: str,
        config: RunnableConfig,
        flt: dict[str, Any] | None,
        before: RunnableConfig | None,
        budget: Budget,
    ) -> AsyncIterator[CheckpointTuple]:
        _ns, cid, high, low = self._range(config, before)
        before_id = get_checkpoint_id(before) if before else None
        keys = self._keys(tid)
        offset = 0
        while budget.left != 0:
            page = await self._acommand("list", "zrange", **page_args(keys, high, low, offset))
            if not page:
                return
            offset += len(page)
            reply = await self._ascript("list", self._read_call(tid, "ids", page))
            for tup in self._decode_records(tid, reply):
                if self._keep(tup, cid, before_id, flt) and budget.left != 0:
                    budget.left -= 1
                    yield tup
            if len(page) < limits.CHECKPOINT_LIST_PAGE:
                return

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        budget = Budget(-1 if limit is None else max(0, int(limit)))
        if config is not None:
            tid = thread_id_of(config)
            async for tup in self._alist_thread(tid, config, filter, before, budget):
                yield tup
        else:
            raw = await self._acommand(
                "list",
                "zrange",
                self.keyspace.threads,
                0,
                limits.CHECKPOINT_LIST_THREADS - 1,
                desc=True,
            )
            for tid in (as_str(t) for t in raw):
                everything: RunnableConfig = {"configurable": {"thread_id": tid}}
                async for tup in self._alist_thread(tid, everything, filter, before, budget):
                    yield tup
        metrics.CHECKPOINT_OPERATIONS.labels("list", "ok").inc()

    async def _adrop(self, tid: str, operation: str, args: Sequence[Any]) -> int:
        reply = await self._ascript(operation, self._drop_call(tid, args[0], args[1:]))
        if int(reply[2]) == 0:
            await self._acommand("checkpoint_index", "zrem", self.keyspace.threads, tid)
        metrics.CHECKPOINT_OPERATIONS.labels(operation, "ok").inc()
        return int(reply[0])

    async def adelete_thread(self, thread_id: str) -> None:
        await self._adrop(thread_id_of(thread_id), "delete_thread", ["thread"])

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        runs = [ident(str(r), "run_id") for r in run_ids]
        for run in runs:
            key = self.keyspace.run(run)
            raw = await self._acommand("delete_for_runs", "smembers", key)
            for tid in sorted(as_str(t) for t in raw)[: limits.CHECKPOINT_RUN_THREADS]:
                await self._adrop(tid, "delete_for_runs", ["runs", run])
            await self._acommand("delete_for_runs", "delete", key)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        src, dst = thread_id_of(source_thread_id), thread_id_of(target_thread_id)
        dump = await self._ascript("copy_thread", self._dump_call(src))
        ops, runs = self._dump_ops(dump)
        if not ops:
            return
        await self._aindex(dst, runs)
        reply = await self._ascript("copy_thread", self._write_call(dst, ops))
        self._written("copy_thread", reply)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        mode = prune_mode(strategy)
        for tid in thread_ids:
            await self._adrop(thread_id_of(tid), "prune", [mode])

    # --- accounting (operators, tests) ---------------------------------------------------------
    def thread_bytes(self, thread_id: str) -> int:
        """The bytes one thread stores, as its script accounts them (0 if none)."""
        raw = retry_sync(
            "thread_bytes",
            lambda: self._sync().hget(self._keys(thread_id_of(thread_id)).state, "bytes"),
        )
        return int(raw or 0)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    async def aclose(self) -> None:
        if self.aclient is not None:
            await self.aclient.aclose()
        self.close()
