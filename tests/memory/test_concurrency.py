"""Atomicity under real contention: processes and threads against real Redis and Cluster."""

from __future__ import annotations

import multiprocessing as mp
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from memhelpers import key

from memtier import AvatarMessage, ConversationKey, ConversationStore, MemtierConfig

PROCESSES = 8
TURNS_PER_PROCESS = 40


def _append_worker(config_json: str, avatar: str, worker: int, turns: int) -> list[int]:
    config = MemtierConfig.model_validate_json(config_json)
    store = ConversationStore.from_config(config)
    k = ConversationKey(avatar, "public")
    seqs = []
    for i in range(turns):
        # payload bytes differ per worker and turn, so the byte total checks every append
        text = f"w{worker}-t{i}-" + "x" * (worker + i % 7)
        seqs.append(store.append(k, AvatarMessage(text=text)).seq)
    store.close()
    return seqs


@pytest.mark.slow
def test_eight_processes_on_one_key_get_one_gapless_sequence(backend_no_fake: Any) -> None:
    config = backend_no_fake.config(conversation={"max_turns_per_session": 2000})
    avatar = str(uuid.uuid4())
    ctx = mp.get_context("spawn")
    with ctx.Pool(PROCESSES) as pool:
        results = pool.starmap(
            _append_worker,
            [(config.model_dump_json(), avatar, w, TURNS_PER_PROCESS) for w in range(PROCESSES)],
        )
    all_seqs = sorted(s for seqs in results for s in seqs)
    total = PROCESSES * TURNS_PER_PROCESS
    assert all_seqs == list(range(1, total + 1))  # gapless, no duplicates
    for seqs in results:
        assert seqs == sorted(seqs)  # each worker sees its own turns in order
    store = ConversationStore(backend_no_fake.sync_client(), config)
    ctx_ = store.context(ConversationKey(avatar, "public"))
    assert [t.seq for t in ctx_.turns] == list(range(1, total + 1))
    expected_bytes = sum(
        len(f"w{w}-t{i}-".encode()) + w + i % 7
        for w in range(PROCESSES)
        for i in range(TURNS_PER_PROCESS)
    )
    assert sum(len(t.fields["text"].encode()) for t in ctx_.turns) == expected_bytes
    assert store.stats() == {"sessions": 1, "bytes": expected_bytes}
    meta = store.list_metadata().sessions
    assert [(m.turn_count, m.bytes) for m in meta] == [(total, expected_bytes)]


def test_ceilings_hold_exactly_under_concurrent_appends(backend_no_fake: Any) -> None:
    """16 threads hammer 200 keys; sessions and bytes never pass their ceilings."""
    conv = {
        "max_active_sessions": 50,
        "max_aggregate_bytes": 20_000,
        "max_session_bytes": 4_000,
        "max_turn_bytes": 500,
        "max_tool_result_bytes": 500,
        "max_summary_bytes": 1_000,
    }
    config = backend_no_fake.config(conversation=conv)

    def work(n: int) -> None:
        store = ConversationStore(backend_no_fake.sync_client(), config)
        for i in range(25):
            store.append(key((n * 7 + i) % 200), AvatarMessage(text="y" * (50 + (n + i) % 200)))
            stats = store.stats()
            assert stats["sessions"] <= 50
            assert stats["bytes"] <= 20_000

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(work, range(16)))
    store = ConversationStore(backend_no_fake.sync_client(), config)
    stats = store.stats()
    metas = list(store.iter_metadata())
    # exact accounting: the partition total equals the sum over live sessions
    assert stats["sessions"] == len(metas) <= 50
    assert stats["bytes"] == sum(m.bytes for m in metas) <= 20_000
    for m in metas:
        ctx = store.context(ConversationKey(m.avatar, m.channel))
        assert sum(len(t.fields["text"].encode()) for t in ctx.turns) == m.bytes


async def test_asyncio_tasks_on_one_key_get_one_gapless_sequence(backend: Any) -> None:
    import asyncio

    from memtier import AsyncConversationStore

    config = backend.config(conversation={"max_turns_per_session": 2000})
    stores = [AsyncConversationStore(backend.async_client(), config) for _ in range(4)]
    k = key(77, "im")

    async def burst(store: AsyncConversationStore, n: int) -> list[int]:
        return [(await store.append(k, AvatarMessage(text=f"{n}-{i}"))).seq for i in range(25)]

    results = await asyncio.gather(*(burst(stores[n % 4], n) for n in range(8)))
    assert sorted(s for r in results for s in r) == list(range(1, 201))
    ctx = await stores[0].context(k)
    assert [t.seq for t in ctx.turns] == list(range(1, 201))
