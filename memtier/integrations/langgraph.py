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
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar, cast

import ormsgpack
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from memtier import limits, metrics
from memtier.config import MemtierConfig
from memtier.errors import CapacityError, ConfigurationError, ScriptError, ValidationError
from memtier.keys import CheckpointKeyspace, CheckpointThreadKeys
from memtier.retry import retry_async, retry_sync
from memtier.scripts import load_registry

__all__ = ["MemtierCheckpointSaver"]

T = TypeVar("T")
_SEP = "\0"  # between the parts of a field name
_LIST_SEP = "\1"  # between the blob fields of a G:v value
_EMPTY = b"empty"  # the type of a channel that has a version but no value
_Op = tuple[str, int, str, bytes | str]
# KEYS indexes (1-based) of checkpoint_write-8.lua
_Z, _CK, _V, _B, _W, _WZ, _RZ = 2, 3, 4, 5, 6, 7, 8


@dataclass
class _Budget:
    """Results a list call may still yield (-1 = no limit)."""

    left: int


def _ident(value: Any, what: str) -> str:
    """A name that goes into a field: a bounded string without NUL or \\x01."""
    if not isinstance(value, str) or len(value) > limits.CHECKPOINT_ID_CHARS:
        raise ValidationError(
            f"{what} must be a string of at most {limits.CHECKPOINT_ID_CHARS} characters",
            field=what,
        )
    if _SEP in value or _LIST_SEP in value:
        raise ValidationError(f"{what} must not contain NUL or \\x01", field=what)
    return value


def _thread_id(config: RunnableConfig | str) -> str:
    tid = config if isinstance(config, str) else config.get("configurable", {}).get("thread_id")
    if tid is None:
        raise ValidationError("config needs configurable.thread_id", field="thread_id")
    tid = str(tid)
    if not tid:
        raise ValidationError("thread_id must not be empty", field="thread_id")
    return _ident(tid, "thread_id")


def _b(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bound(value: float | None, bound: limits.Bound, name: str) -> float:
    if value is None:
        return bound.default
    if not bound.minimum <= value <= bound.ceiling:
        raise ConfigurationError(
            f"{name} must be between {bound.minimum:g} and {bound.ceiling:g} {bound.unit}",
            field=name,
        )
    return value


class MemtierCheckpointSaver(BaseCheckpointSaver[str]):
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
        self.ttl_ms = int(_bound(ttl_s, limits.CHECKPOINT_THREAD_TTL_SECONDS, "ttl_s") * 1000)
        self.max_thread_bytes = int(
            _bound(max_thread_bytes, limits.CHECKPOINT_THREAD_BYTES, "max_thread_bytes")
        )
        self.scripts = load_registry("langgraph")

    @classmethod
    def from_config(cls, config: MemtierConfig | None = None, **options: Any) -> Any:
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

    # --- I/O-free steps ------------------------------------------------------------------------
    def _keys(self, thread_id: str) -> CheckpointThreadKeys:
        return self.keyspace.thread(thread_id)

    def _typed(self, value: Any) -> bytes:
        kind, data = self.serde.dumps_typed(value)
        return kind.encode() + b"\0" + data

    def _untyped(self, raw: bytes) -> tuple[bool, Any]:
        kind, _, data = raw.partition(b"\0")
        if kind == _EMPTY or not kind:
            return False, None
        return True, self.serde.loads_typed((kind.decode(), data))

    def _put_plan(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> tuple[str, str, list[_Op], str | None, RunnableConfig]:
        tid = _thread_id(config)
        ns = _ident(config["configurable"].get("checkpoint_ns", ""), "checkpoint_ns")
        cid = _ident(checkpoint["id"], "checkpoint_id")
        parent = config["configurable"].get("checkpoint_id")
        c = checkpoint.copy()
        values: dict[str, Any] = c.pop("channel_values")  # type: ignore[misc]
        md = get_checkpoint_metadata(config, metadata)
        run_id = md.get("run_id")
        run = _ident(str(run_id), "run_id") if run_id else ""
        member = ns + _SEP + cid
        ops: list[_Op] = []
        for channel, version in new_versions.items():
            field = ns + _SEP + _ident(channel, "channel") + _SEP + _ident(str(version), "version")
            blob = self._typed(values[channel]) if channel in values else _EMPTY + b"\0"
            ops.append(("set", _B, field, blob))
        blob_fields = [
            ns + _SEP + _ident(ch, "channel") + _SEP + _ident(str(ver), "version")
            for ch, ver in c["channel_versions"].items()
        ]
        ck_type, ck_bytes = self.serde.dumps_typed(c)
        md_type, md_bytes = self.serde.dumps_typed(md)
        envelope = ormsgpack.packb([ck_type, ck_bytes, md_type, md_bytes, parent])
        ops.append(("set", _CK, member, envelope))
        ops.append(("set", _V, member, _LIST_SEP.join([run, *blob_fields])))
        ops.append(("zadd", _Z, member, b""))
        if run:
            ops.append(("zadd", _RZ, run + _SEP + member, b""))
        next_config: RunnableConfig = {
            "configurable": {"thread_id": tid, "checkpoint_ns": ns, "checkpoint_id": cid}
        }
        return tid, ns, ops, run or None, next_config

    def _writes_ops(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> tuple[str, list[_Op]]:
        tid = _thread_id(config)
        ns = _ident(config["configurable"].get("checkpoint_ns", ""), "checkpoint_ns")
        cid = config["configurable"].get("checkpoint_id")
        if cid is None:
            raise ValidationError(
                "put_writes needs configurable.checkpoint_id", field="checkpoint_id"
            )
        member = ns + _SEP + _ident(cid, "checkpoint_id")
        task = _ident(task_id, "task_id")
        ops: list[_Op] = []
        for idx, (channel, value) in enumerate(writes):
            widx = WRITES_IDX_MAP.get(channel, idx)
            field = f"{member}{_SEP}{task}{_SEP}{widx:+011d}"
            kind, data = self.serde.dumps_typed(value)
            record = ormsgpack.packb([task_id, channel, kind, data, task_path, widx])
            ops.append(("nx" if widx >= 0 else "set", _W, field, record))
            ops.append(("zadd", _WZ, field, b""))
        return tid, ops

    def _write_args(self, tid: str, ops: Sequence[_Op]) -> list[Any]:
        args: list[Any] = [tid, self.ttl_ms, self.max_thread_bytes]
        for op, k, field, value in ops:
            args += [op, k, field, value]
        return args

    def _written(self, operation: str, reply: Sequence[Any]) -> int:
        status = int(reply[0])
        if status == -1:
            metrics.CHECKPOINT_OPERATIONS.labels(operation, "capacity_exceeded").inc()
            raise CapacityError(
                f"the thread would hold {int(reply[1])} bytes, over its ceiling of"
                f" {int(reply[2])}; nothing was stored",
                needed=int(reply[1]),
                limit_bytes=int(reply[2]),
            )
        if status != 0:
            raise ScriptError(f"checkpoint_write returned unknown status {status}")
        delta = int(reply[2])
        if delta > 0:
            metrics.CHECKPOINT_BYTES.inc(delta)
        metrics.CHECKPOINT_OPERATIONS.labels(operation, "ok").inc()
        return int(reply[1])

    def _decode_records(self, tid: str, reply: Sequence[Any]) -> list[CheckpointTuple]:
        out: list[CheckpointTuple] = []
        n = int(reply[0])
        pos = 1
        for _ in range(n):
            member = _s(reply[pos])
            envelope, n_blobs = reply[pos + 1], int(reply[pos + 3])
            pos += 4
            blobs = [(reply[pos + 2 * j], reply[pos + 2 * j + 1]) for j in range(n_blobs)]
            pos += 2 * n_blobs
            n_writes = int(reply[pos])
            raw_writes = reply[pos + 1 : pos + 1 + n_writes]
            pos += 1 + n_writes
            ns, _, cid = member.partition(_SEP)
            ck_type, ck_bytes, md_type, md_bytes, parent = ormsgpack.unpackb(envelope)
            checkpoint = self.serde.loads_typed((ck_type, ck_bytes))
            values: dict[str, Any] = {}
            for field, raw in blobs:
                present, value = self._untyped(_b(raw)) if raw else (False, None)
                if present:
                    values[_s(field).split(_SEP)[1]] = value
            records = [ormsgpack.unpackb(w) for w in raw_writes if w]
            records.sort(key=lambda r: writes_sort_key(r[4], r[0], r[5]))
            config: RunnableConfig = {
                "configurable": {"thread_id": tid, "checkpoint_ns": ns, "checkpoint_id": cid}
            }
            out.append(
                CheckpointTuple(
                    config=config,
                    checkpoint=cast(Checkpoint, {**checkpoint, "channel_values": values}),
                    metadata=self.serde.loads_typed((md_type, md_bytes)),
                    parent_config=(
                        {
                            "configurable": {
                                "thread_id": tid,
                                "checkpoint_ns": ns,
                                "checkpoint_id": parent,
                            }
                        }
                        if parent
                        else None
                    ),
                    pending_writes=[
                        (r[0], r[1], self.serde.loads_typed((r[2], r[3]))) for r in records
                    ],
                )
            )
        return out

    def _get_request(self, config: RunnableConfig) -> tuple[str, list[str]]:
        tid = _thread_id(config)
        ns = _ident(config["configurable"].get("checkpoint_ns", ""), "checkpoint_ns")
        cid = get_checkpoint_id(config)
        if cid:
            return tid, ["ids", ns + _SEP + _ident(cid, "checkpoint_id")]
        return tid, ["latest", ns]

    @staticmethod
    def _range(
        config: RunnableConfig, before: RunnableConfig | None
    ) -> tuple[str | None, str | None, str, str]:
        """(ns filter, checkpoint id filter, lex max, lex min) of one thread's listing."""
        ns = config["configurable"].get("checkpoint_ns")
        if ns is not None:
            ns = _ident(ns, "checkpoint_ns")
        cid = get_checkpoint_id(config)
        before_id = get_checkpoint_id(before) if before else None
        if ns is None:
            return None, cid, "+", "-"
        high = "(" + ns + _SEP + before_id if before_id else "(" + ns + _LIST_SEP
        return ns, cid, high, "(" + ns + _SEP

    @staticmethod
    def _keep(
        tup: CheckpointTuple, cid: str | None, before_id: str | None, flt: dict[str, Any] | None
    ) -> bool:
        this = tup.checkpoint["id"]
        if cid and this != cid:
            return False
        if before_id and this >= before_id:
            return False
        return not flt or all(tup.metadata.get(k) == v for k, v in flt.items())

    def _dump_ops(self, dump: Sequence[Any]) -> tuple[list[_Op], set[str]]:
        ck, v, b, w, wz, rz = dump
        ops: list[_Op] = []
        for key_index, flat in ((_CK, ck), (_V, v), (_B, b), (_W, w)):
            for i in range(0, len(flat), 2):
                ops.append(("set", key_index, _s(flat[i]), flat[i + 1]))
        ops += [("zadd", _Z, _s(ck[i]), b"") for i in range(0, len(ck), 2)]
        ops += [("zadd", _WZ, _s(m), b"") for m in wz]
        ops += [("zadd", _RZ, _s(m), b"") for m in rz]
        runs = {_s(m).split(_SEP)[0] for m in rz}
        return ops, runs

    # --- sync ----------------------------------------------------------------------------------
    def _sync(self) -> Any:
        if self.client is None:
            raise ConfigurationError("this checkpointer has no sync client (pass client=)")
        return self.client

    def _script(self, name: str, operation: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        client = self._sync()
        return retry_sync(operation, lambda: self.scripts[name](client, keys, args))

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
        reply = self._script(
            "checkpoint_write", "put", self._keys(tid).all(), self._write_args(tid, ops)
        )
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
        reply = self._script(
            "checkpoint_write", "put_writes", self._keys(tid).all(), self._write_args(tid, ops)
        )
        self._written("put_writes", reply)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        tid, args = self._get_request(config)
        reply = self._script("checkpoint_read", "get_tuple", self._keys(tid).reads(), args)
        found = self._decode_records(tid, reply)
        metrics.CHECKPOINT_OPERATIONS.labels("get_tuple", "ok").inc()
        return found[0] if found else None

    def _list_thread(
        self,
        tid: str,
        config: RunnableConfig,
        flt: dict[str, Any] | None,
        before: RunnableConfig | None,
        budget: _Budget,
    ) -> Iterator[CheckpointTuple]:
        _ns, cid, high, low = self._range(config, before)
        before_id = get_checkpoint_id(before) if before else None
        keys = self._keys(tid)
        client = self._sync()
        offset = 0
        while budget.left != 0:
            page = retry_sync("list", partial(client.zrange, **_page(keys, high, low, offset)))
            if not page:
                return
            offset += len(page)
            reply = self._script("checkpoint_read", "list", keys.reads(), ["ids", *page])
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
        return [_s(t) for t in raw]

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        budget = _Budget(-1 if limit is None else max(0, int(limit)))
        if config is not None:
            yield from self._list_thread(_thread_id(config), config, filter, before, budget)
        else:
            for tid in self._thread_ids():
                everything: RunnableConfig = {"configurable": {"thread_id": tid}}
                yield from self._list_thread(tid, everything, filter, before, budget)
        metrics.CHECKPOINT_OPERATIONS.labels("list", "ok").inc()

    def _drop(self, tid: str, operation: str, args: Sequence[Any]) -> int:
        reply = self._script("checkpoint_drop", operation, self._keys(tid).all(), args)
        if int(reply[2]) == 0:
            retry_sync("checkpoint_index", lambda: self._sync().zrem(self.keyspace.threads, tid))
        metrics.CHECKPOINT_OPERATIONS.labels(operation, "ok").inc()
        return int(reply[0])

    def delete_thread(self, thread_id: str) -> None:
        self._drop(_thread_id(thread_id), "delete_thread", ["thread"])

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        runs = [_ident(str(r), "run_id") for r in run_ids]
        client = self._sync()
        for run in runs:
            key = self.keyspace.run(run)
            tids = sorted(
                _s(t) for t in retry_sync("delete_for_runs", partial(client.smembers, key))
            )
            for tid in tids[: limits.CHECKPOINT_RUN_THREADS]:
                self._drop(tid, "delete_for_runs", ["runs", run])
            retry_sync("delete_for_runs", partial(client.delete, key))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        src, dst = _thread_id(source_thread_id), _thread_id(target_thread_id)
        dump = self._script("thread_dump", "copy_thread", self._keys(src).all(), [])
        ops, runs = self._dump_ops(dump)
        if not ops:
            return
        self._index(dst, runs)
        reply = self._script(
            "checkpoint_write", "copy_thread", self._keys(dst).all(), self._write_args(dst, ops)
        )
        self._written("copy_thread", reply)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        mode = _prune_mode(strategy)
        for tid in thread_ids:
            self._drop(_thread_id(tid), "prune", [mode])

    # --- asyncio -------------------------------------------------------------------------------
    async def _ascript(
        self, name: str, operation: str, keys: Sequence[str], args: Sequence[Any]
    ) -> Any:
        if self.aclient is None:
            return await asyncio.to_thread(self._script, name, operation, keys, args)
        aclient = self.aclient
        return await retry_async(
            operation, lambda: self.scripts[name].call_async(aclient, keys, args)
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
        reply = await self._ascript(
            "checkpoint_write", "put", self._keys(tid).all(), self._write_args(tid, ops)
        )
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
        reply = await self._ascript(
            "checkpoint_write", "put_writes", self._keys(tid).all(), self._write_args(tid, ops)
        )
        self._written("put_writes", reply)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        tid, args = self._get_request(config)
        reply = await self._ascript("checkpoint_read", "get_tuple", self._keys(tid).reads(), args)
        found = self._decode_records(tid, reply)
        metrics.CHECKPOINT_OPERATIONS.labels("get_tuple", "ok").inc()
        return found[0] if found else None

    async def _alist_thread(
        self,
        tid: str,
        config: RunnableConfig,
        flt: dict[str, Any] | None,
        before: RunnableConfig | None,
        budget: _Budget,
    ) -> AsyncIterator[CheckpointTuple]:
        _ns, cid, high, low = self._range(config, before)
        before_id = get_checkpoint_id(before) if before else None
        keys = self._keys(tid)
        offset = 0
        while budget.left != 0:
            page = await self._acommand("list", "zrange", **_page(keys, high, low, offset))
            if not page:
                return
            offset += len(page)
            reply = await self._ascript("checkpoint_read", "list", keys.reads(), ["ids", *page])
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
        budget = _Budget(-1 if limit is None else max(0, int(limit)))
        if config is not None:
            async for tup in self._alist_thread(_thread_id(config), config, filter, before, budget):
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
            for tid in (_s(t) for t in raw):
                everything: RunnableConfig = {"configurable": {"thread_id": tid}}
                async for tup in self._alist_thread(tid, everything, filter, before, budget):
                    yield tup
        metrics.CHECKPOINT_OPERATIONS.labels("list", "ok").inc()

    async def _adrop(self, tid: str, operation: str, args: Sequence[Any]) -> int:
        reply = await self._ascript("checkpoint_drop", operation, self._keys(tid).all(), args)
        if int(reply[2]) == 0:
            await self._acommand("checkpoint_index", "zrem", self.keyspace.threads, tid)
        metrics.CHECKPOINT_OPERATIONS.labels(operation, "ok").inc()
        return int(reply[0])

    async def adelete_thread(self, thread_id: str) -> None:
        await self._adrop(_thread_id(thread_id), "delete_thread", ["thread"])

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        runs = [_ident(str(r), "run_id") for r in run_ids]
        for run in runs:
            key = self.keyspace.run(run)
            raw = await self._acommand("delete_for_runs", "smembers", key)
            for tid in sorted(_s(t) for t in raw)[: limits.CHECKPOINT_RUN_THREADS]:
                await self._adrop(tid, "delete_for_runs", ["runs", run])
            await self._acommand("delete_for_runs", "delete", key)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        src, dst = _thread_id(source_thread_id), _thread_id(target_thread_id)
        dump = await self._ascript("thread_dump", "copy_thread", self._keys(src).all(), [])
        ops, runs = self._dump_ops(dump)
        if not ops:
            return
        await self._aindex(dst, runs)
        reply = await self._ascript(
            "checkpoint_write", "copy_thread", self._keys(dst).all(), self._write_args(dst, ops)
        )
        self._written("copy_thread", reply)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        mode = _prune_mode(strategy)
        for tid in thread_ids:
            await self._adrop(_thread_id(tid), "prune", [mode])

    # --- accounting (operators, tests) ---------------------------------------------------------
    def thread_bytes(self, thread_id: str) -> int:
        """The bytes one thread stores, as its script accounts them (0 if none)."""
        raw = retry_sync(
            "thread_bytes",
            lambda: self._sync().hget(self._keys(_thread_id(thread_id)).state, "bytes"),
        )
        return int(raw or 0)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    async def aclose(self) -> None:
        if self.aclient is not None:
            await self.aclient.aclose()
        self.close()


def _page(keys: CheckpointThreadKeys, high: str, low: str, offset: int) -> dict[str, Any]:
    """ZRANGE arguments of one list page: newest first, by lex."""
    return {
        "name": keys.index,
        "start": high,
        "end": low,
        "desc": True,
        "bylex": True,
        "offset": offset,
        "num": limits.CHECKPOINT_LIST_PAGE,
    }


def _prune_mode(strategy: str) -> str:
    if strategy == "keep_latest":
        return "keep_latest"
    if strategy == "delete":
        return "thread"
    raise ValidationError(
        f"unknown prune strategy {strategy[:32]!r}: 'keep_latest' or 'delete'", field="strategy"
    )
