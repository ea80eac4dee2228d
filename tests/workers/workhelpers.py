"""Helpers for the worker tests (compaction, snapshots, recovery, worker processes)."""

from __future__ import annotations

import uuid
from typing import Any

import orjson

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
    return store.core.decode_append(prepared, store._run(store.core.append_call(prepared)))


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
            tools = sum(int(r.split("|")[4]) for r in records)
            summary = h.get("summary", "")
            assert int(h["summary_bytes"]) == len(summary.encode()), member
            assert int(h["bytes"]) == rec_bytes + len(summary.encode()) == nbytes, member
            assert int(h["turns"]) == len(records), member
            assert int(h["tools"]) == tools, member


def summary_doc(store: Any, k: ConversationKey) -> dict[str, Any] | None:
    raw = session_hash(store, k).get("summary")
    return orjson.loads(raw) if raw else None
