"""Helpers for the worker tests (compaction, snapshots, recovery, worker processes)."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from memtier import (
    ActionResult,
    AgentResponse,
    AsyncConversationStore,
    AvatarMessage,
    ConversationKey,
    ConversationStore,
    ToolSummary,
)

T0 = 1_800_000_000_000  # a fixed test epoch, ms


class Clock:
    """A test clock for the store's test-only clock hook (ms)."""

    def __init__(self, start: int = T0) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: float) -> None:
        self.now += int(ms)


def key(n: int, channel: str = "public") -> ConversationKey:
    return ConversationKey(uuid.UUID(int=n), channel)


def sync_store(backend: Any, clock: Clock | None = None, **config: Any) -> ConversationStore:
    extra = {k: config.pop(k) for k in ("summarizer", "inline_compaction") if k in config}
    return ConversationStore(backend.sync_client(), backend.config(**config), clock=clock, **extra)


def async_store(backend: Any, clock: Clock | None = None, **config: Any) -> AsyncConversationStore:
    extra = {k: config.pop(k) for k in ("summarizer", "inline_compaction") if k in config}
    return AsyncConversationStore(
        backend.async_client(), backend.config(**config), clock=clock, **extra
    )


def turn_for(i: int) -> Any:
    """A deterministic mix of every turn kind."""
    if i % 5 == 3:
        return ToolSummary(tool="search", summary=f"found {i} results for query {i}")
    if i % 7 == 6:
        return ActionResult(action="teleport", outcome=f"arrived at region {i}")
    if i % 2:
        return AgentResponse(text=f"agent reply number {i}")
    return AvatarMessage(text=f"avatar says hello {i} ünïcode")


def append_raw(store: Any, k: ConversationKey, turn: Any) -> Any:
    """One append_turn script call, bypassing the store's inline compaction."""
    prepared = store.core.prepare_turn(k, turn)
    return store.core.decode_append(
        prepared, store.executor.execute(store.core.append_call(prepared))
    )


def session_hash(store: Any, k: ConversationKey) -> dict[str, str]:
    part = store.core.partition_for(k)
    raw = store.client.hgetall(part.session(k.member).session)
    return {a.decode(): b.decode() for a, b in raw.items()}


def turn_records(store: Any, k: ConversationKey) -> list[str]:
    part = store.core.partition_for(k)
    return [r.decode() for r in store.client.lrange(part.session(k.member).turns, 0, -1)]


def assert_exact_accounting(store: Any) -> None:
    """Every session's bytes = its records + summary; index and partition totals agree."""
    for part in store.core.keyspace.all_partitions():
        index = {a.decode(): int(b) for a, b in store.client.hgetall(part.index).items()}
        total = int(store.client.hget(part.meta, "bytes") or 0)
        assert total == sum(index.values()), (part.tag, total, index)
        for member, nbytes in index.items():
            h = {
                a.decode(): b.decode()
                for a, b in store.client.hgetall(part.session(member).session).items()
            }
            records = [r.decode() for r in store.client.lrange(part.session(member).turns, 0, -1)]
            rec_bytes = sum(int(r.split("|")[3]) for r in records)
            tools = sum(int(r.split("|")[4][0]) for r in records)  # flags: tool flag first
            summary = h.get("summary", "")
            assert int(h["summary_bytes"]) == len(summary.encode()), member
            assert int(h["bytes"]) == rec_bytes + len(summary.encode()) == nbytes, member
            assert int(h["turns"]) == len(records), member
            assert int(h["tools"]) == tools, member


def summary_doc(store: Any, k: ConversationKey) -> dict[str, Any] | None:
    raw = session_hash(store, k).get("summary")
    return orjson.loads(raw) if raw else None


# --------------------------------------------------------------------------- snapshot files


def persistent_store(
    backend: Any, tmp_path: Any, clock: Clock | None = None, **conversation: Any
) -> ConversationStore:
    """A sync store with persistence on, snapshots under ``tmp_path``."""
    from memtier.memory.persistence import snapshot_dir_for

    conv = {"persistence_enabled": True, "storage_path": str(tmp_path), **conversation}
    extra = {k: conv.pop(k) for k in ("summarizer", "inline_compaction") if k in conv}
    config = backend.config(conversation=conv)
    return ConversationStore(
        backend.sync_client(), config, clock=clock, snapshots=snapshot_dir_for(config), **extra
    )


def snaps(store: Any) -> Any:
    """The store's SnapshotDir (persistence must be on)."""
    assert store.snapshots is not None
    return store.snapshots


def resign(
    path: Any,
    *,
    header: Any = None,
    line: Any = None,
) -> None:
    """Rewrite a generation in place with valid checksums after mutating it (test forgery).

    ``header(dict) -> None`` mutates the header; ``line(index, dict) -> dict | None`` each
    session (None drops it).
    """
    import hashlib
    from pathlib import Path

    from memtier.memory import snapshot

    raw = Path(path).read_bytes()
    block, payload = raw[: snapshot.HEADER_BLOCK], raw[snapshot.HEADER_BLOCK :]
    head = orjson.loads(block[len(snapshot.MAGIC) : -1].rstrip(b" "))
    out = b""
    count = 0
    for i, text in enumerate(payload.splitlines()):
        obj = orjson.loads(text)
        if line is not None:
            obj = line(i, obj)
        if obj is not None:
            out += orjson.dumps(obj) + b"\n"
            count += 1
    head.update(
        sessions=count, payload_bytes=len(out), payload_sha256=hashlib.sha256(out).hexdigest()
    )
    if header is not None:
        header(head)
    head.pop("header_sha256", None)
    new_block = snapshot.fileformat.encode_header(head)
    Path(path).write_bytes(new_block + out)


def populate(store: Any, n: int, *, turns: int = 3, start: int = 0) -> dict[Any, Any]:
    """``n`` sessions on both channels with a mix of turns; returns key -> context."""
    keys = []
    for i in range(start, start + n):
        k = key(i + 1, "im" if i % 2 else "public")
        keys.append(k)
        for j in range(turns):
            store.append(k, turn_for(i + j).model_copy(update={"turn_id": f"k{i}-t{j}"}))
    return {k: store.context(k) for k in keys}


def wipe_store(backend: Any, store: ConversationStore) -> None:
    """Everything ``store`` wrote: the fake server's data, or the backend's namespace."""
    if backend.is_fake:
        store.client.flushall()
    else:
        backend.delete_namespace()


def scraped(sample: str) -> float:
    """One sample of the default registry as Prometheus reads it, e.g.
    ``memtier_script_duration_seconds_count{script=snapshot_page}``; 0 if absent."""
    for family in text_string_to_metric_families(generate_latest(REGISTRY).decode()):
        for found in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(found.labels.items()))
            if f"{found.name}{{{labels}}}" == sample:
                return float(found.value)
    return 0.0


class InFlight:
    """Spies for ``LeanPool.execute`` / ``LeanPool.pipeline`` that call them as they are,
    with ``on`` True while their ``during`` work runs (after the request's write, before
    its read); ``sends`` counts the writes, ``with_work`` those given work."""

    def __init__(self) -> None:
        from memtier.connection import LeanPool

        self.on = False
        self.sends = 0
        self.with_work = 0
        self._execute = LeanPool.execute
        self._pipeline = LeanPool.pipeline

    def _flagged(self, during: Any) -> Any:
        if during is None:
            return None
        self.with_work += 1

        def flagged() -> None:
            self.on = True
            try:
                during()
            finally:
                self.on = False

        return flagged

    def execute(self) -> Any:
        """A replacement for ``LeanPool.execute`` (``mock.patch.object``)."""

        def execute(pool: Any, args: Any, packed: Any, during: Any = None) -> Any:
            self.sends += 1
            return self._execute(pool, args, packed, self._flagged(during))

        return execute

    def pipeline(self) -> Any:
        """A replacement for ``LeanPool.pipeline``."""

        def pipeline(pool: Any, commands: Any, during: Any = None) -> Any:
            self.sends += 1
            return self._pipeline(pool, commands, self._flagged(during))

        return pipeline
