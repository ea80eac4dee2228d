"""The I/O-free steps of the LangGraph checkpointer (memtier.integrations.langgraph).

Field names, the ops of ``checkpoint_write-8.lua``, reply decoding and validation: no
socket is touched here, so the sync and asyncio methods of the saver share every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar, cast

import ormsgpack
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
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
from memtier.engine import ScriptCall
from memtier.errors import CapacityError, ConfigurationError, ScriptError, ValidationError
from memtier.keys import CheckpointKeyspace, CheckpointThreadKeys
from memtier.scriptspec import ScriptSpec

__all__ = [
    "SPECS",
    "Budget",
    "CheckpointSteps",
    "as_bytes",
    "as_str",
    "bounded",
    "ident",
    "page_args",
    "prune_mode",
    "thread_id_of",
]

T = TypeVar("T")
_SEP = "\0"  # between the parts of a field name
_LIST_SEP = "\1"  # between the blob fields of a G:v value
_EMPTY = b"empty"  # the type of a channel that has a version but no value
_Op = tuple[str, int, str, bytes | str]
# KEYS indexes (1-based) of checkpoint_write-8.lua, named in its ops
_Z, _CK, _V, _B, _W, _WZ, _RZ = 2, 3, 4, 5, 6, 7, 8

# Declared inputs of the lua/langgraph scripts (KEYS roles = CheckpointThreadKeys fields);
# tests/integrations/test_langgraph_script_specs.py checks them against the headers.
# An ARGV ending in a counted tail (ops, member ids, run ids) declares its fixed part.
_THREAD_KEYS: Final = (
    "state",
    "index",
    "checkpoints",
    "versions",
    "blobs",
    "writes",
    "write_index",
    "runs",
)
WRITE: Final = ScriptSpec(
    "checkpoint_write", keys=_THREAD_KEYS, argv=("thread_id", "ttl_ms", "max_bytes")
)
READ: Final = ScriptSpec("checkpoint_read", keys=_THREAD_KEYS[1:7], argv=("mode",))
DROP: Final = ScriptSpec("checkpoint_drop", keys=_THREAD_KEYS, argv=("mode",))
DUMP: Final = ScriptSpec("thread_dump", keys=_THREAD_KEYS, argv=())
SPECS: Final = (DROP, READ, WRITE, DUMP)


def checkpoint_call(
    spec: ScriptSpec,
    keys: CheckpointThreadKeys,
    /,
    *,
    tail: Sequence[str | int | bytes] = (),
    **argv: str | int | bytes,
) -> ScriptCall:
    """A call of ``spec`` on one thread: KEYS by role, ARGV by name, then the ``tail``."""
    return spec.call_with_tail({role: getattr(keys, role) for role in spec.keys}, tail, **argv)


@dataclass
class Budget:
    """Results a list call may still yield (-1 = no limit)."""

    left: int


def ident(value: Any, what: str) -> str:
    """A name that goes into a field: a bounded string without NUL or \\x01."""
    if not isinstance(value, str) or len(value) > limits.CHECKPOINT_ID_CHARS:
        raise ValidationError(
            f"{what} must be a string of at most {limits.CHECKPOINT_ID_CHARS} characters",
            field=what,
        )
    if _SEP in value or _LIST_SEP in value:
        raise ValidationError(f"{what} must not contain NUL or \\x01", field=what)
    return value


def thread_id_of(config: RunnableConfig | str) -> str:
    tid = config if isinstance(config, str) else config.get("configurable", {}).get("thread_id")
    if tid is None:
        raise ValidationError("config needs configurable.thread_id", field="thread_id")
    tid = str(tid)
    if not tid:
        raise ValidationError("thread_id must not be empty", field="thread_id")
    return ident(tid, "thread_id")


def as_bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def as_str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def bounded(value: float | None, bound: limits.Bound, name: str) -> float:
    if value is None:
        return bound.default
    if not bound.minimum <= value <= bound.ceiling:
        raise ConfigurationError(
            f"{name} must be between {bound.minimum:g} and {bound.ceiling:g} {bound.unit}",
            field=name,
        )
    return value


class CheckpointSteps:
    """What the saver does that is not I/O (mixed into MemtierCheckpointSaver)."""

    serde: SerializerProtocol
    keyspace: CheckpointKeyspace
    ttl_ms: int
    max_thread_bytes: int

    def _keys(self, thread_id: str) -> CheckpointThreadKeys:
        return self.keyspace.thread(thread_id)

    def _dumps(self, value: Any, what: str) -> tuple[str, bytes]:
        """The serializer's typed bytes; a value it cannot encode is a ValidationError."""
        try:
            return self.serde.dumps_typed(value)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValidationError(
                f"LangGraph's serializer cannot encode this {what}: {str(exc)[:200]}",
                field=what,
            ) from None

    def _typed(self, value: Any) -> bytes:
        kind, data = self._dumps(value, "channel value")
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
        tid = thread_id_of(config)
        ns = ident(config["configurable"].get("checkpoint_ns", ""), "checkpoint_ns")
        cid = ident(checkpoint["id"], "checkpoint_id")
        parent = config["configurable"].get("checkpoint_id")
        c = checkpoint.copy()
        values: dict[str, Any] = c.pop("channel_values")  # type: ignore[misc]
        md = get_checkpoint_metadata(config, metadata)
        run_id = md.get("run_id")
        run = ident(str(run_id), "run_id") if run_id else ""
        member = ns + _SEP + cid
        ops: list[_Op] = []
        for channel, version in new_versions.items():
            field = ns + _SEP + ident(channel, "channel") + _SEP + ident(str(version), "version")
            blob = self._typed(values[channel]) if channel in values else _EMPTY + b"\0"
            ops.append(("set", _B, field, blob))
        blob_fields = [
            ns + _SEP + ident(ch, "channel") + _SEP + ident(str(ver), "version")
            for ch, ver in c["channel_versions"].items()
        ]
        ck_type, ck_bytes = self._dumps(c, "checkpoint")
        md_type, md_bytes = self._dumps(md, "metadata")
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
        tid = thread_id_of(config)
        ns = ident(config["configurable"].get("checkpoint_ns", ""), "checkpoint_ns")
        cid = config["configurable"].get("checkpoint_id")
        if cid is None:
            raise ValidationError(
                "put_writes needs configurable.checkpoint_id", field="checkpoint_id"
            )
        member = ns + _SEP + ident(cid, "checkpoint_id")
        task = ident(task_id, "task_id")
        ops: list[_Op] = []
        for idx, (channel, value) in enumerate(writes):
            widx = WRITES_IDX_MAP.get(channel, idx)
            field = f"{member}{_SEP}{task}{_SEP}{widx:+011d}"
            kind, data = self._dumps(value, "write")
            record = ormsgpack.packb([task_id, channel, kind, data, task_path, widx])
            ops.append(("nx" if widx >= 0 else "set", _W, field, record))
            ops.append(("zadd", _WZ, field, b""))
        return tid, ops

    def _write_call(self, tid: str, ops: Sequence[_Op]) -> ScriptCall:
        tail: list[str | int | bytes] = []
        for op, k, field, value in ops:
            tail += [op, k, field, value]
        return checkpoint_call(
            WRITE,
            self._keys(tid),
            tail=tail,
            thread_id=tid,
            ttl_ms=self.ttl_ms,
            max_bytes=self.max_thread_bytes,
        )

    def _read_call(self, tid: str, mode: str, rest: Sequence[str | bytes]) -> ScriptCall:
        return checkpoint_call(READ, self._keys(tid), tail=rest, mode=mode)

    def _drop_call(self, tid: str, mode: str, rest: Sequence[str] = ()) -> ScriptCall:
        return checkpoint_call(DROP, self._keys(tid), tail=rest, mode=mode)

    def _dump_call(self, tid: str) -> ScriptCall:
        return checkpoint_call(DUMP, self._keys(tid))

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
            member = as_str(reply[pos])
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
                present, value = self._untyped(as_bytes(raw)) if raw else (False, None)
                if present:
                    values[as_str(field).split(_SEP)[1]] = value
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

    def _get_request(self, config: RunnableConfig) -> tuple[str, ScriptCall]:
        tid = thread_id_of(config)
        ns = ident(config["configurable"].get("checkpoint_ns", ""), "checkpoint_ns")
        cid = get_checkpoint_id(config)
        if cid:
            return tid, self._read_call(tid, "ids", [ns + _SEP + ident(cid, "checkpoint_id")])
        return tid, self._read_call(tid, "latest", [ns])

    @staticmethod
    def _range(
        config: RunnableConfig, before: RunnableConfig | None
    ) -> tuple[str | None, str | None, str, str]:
        """(ns filter, checkpoint id filter, lex max, lex min) of one thread's listing."""
        ns = config["configurable"].get("checkpoint_ns")
        if ns is not None:
            ns = ident(ns, "checkpoint_ns")
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
                ops.append(("set", key_index, as_str(flat[i]), flat[i + 1]))
        ops += [("zadd", _Z, as_str(ck[i]), b"") for i in range(0, len(ck), 2)]
        ops += [("zadd", _WZ, as_str(m), b"") for m in wz]
        ops += [("zadd", _RZ, as_str(m), b"") for m in rz]
        runs = {as_str(m).split(_SEP)[0] for m in rz}
        return ops, runs


def page_args(keys: CheckpointThreadKeys, high: str, low: str, offset: int) -> dict[str, Any]:
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


def prune_mode(strategy: str) -> str:
    if strategy == "keep_latest":
        return "keep_latest"
    if strategy == "delete":
        return "thread"
    raise ValidationError(
        f"unknown prune strategy {strategy[:32]!r}: 'keep_latest' or 'delete'", field="strategy"
    )
