"""``redis.durability="replicated"``: an append is acknowledged only once a replica has it.

A private primary and replica of ours.  With the replica stopped (SIGSTOP), a
replicated append cannot be confirmed: it reports ``outcome_unknown`` (the turn
is on the primary), and the retry with the same turn id, once the replica is
back, is confirmed and stores nothing twice.  The default durability
acknowledges from the primary alone (Redis's asynchronous replication).  The
cluster row (a primary killed right after an acknowledged append) is in
``test_cluster_faults.py``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from faultservers import FaultRedis, fault_redis
from servers import HOST, require_real_redis

from memtier import AvatarMessage, ConversationKey, ConversationStore, MemtierConfig
from memtier.errors import OutcomeUnknownError

pytestmark = pytest.mark.real


@pytest.fixture
def primary_and_replica() -> Iterator[tuple[FaultRedis, FaultRedis]]:
    require_real_redis("redis-server")
    with fault_redis() as primary, fault_redis() as replica:
        with replica.admin() as conn:
            conn.execute_command("REPLICAOF", HOST, primary.port)
        deadline = time.monotonic() + 60
        while True:
            with replica.client() as conn:
                if conn.info("replication").get("master_link_status") == "up":
                    break
            assert time.monotonic() < deadline, "the replica never linked"
            time.sleep(0.05)
        yield primary, replica


def _config(url: str, durability: str) -> MemtierConfig:
    return MemtierConfig.load(
        redis_url=url,
        namespace="d" + uuid.uuid4().hex[:8],
        redis={"durability": durability, "wait_replicas": 1, "wait_timeout_ms": 1000},
    )


def _store(url: str, durability: str) -> ConversationStore:
    return ConversationStore.from_config(_config(url, durability), recover=False)


def test_a_replicated_append_is_acknowledged_only_once_a_replica_has_it(
    primary_and_replica: tuple[FaultRedis, FaultRedis],
) -> None:
    primary, replica = primary_and_replica
    key = ConversationKey(uuid.uuid4(), "im")
    with _store(primary.url, "replicated") as store:
        first = store.append(key, AvatarMessage(text="confirmed", turn_id="t1"))
        assert first.seq == 1 and not first.duplicate
        replica.sigstop()
        try:
            with pytest.raises(OutcomeUnknownError) as unknown:
                store.append(key, AvatarMessage(text="not yet confirmed", turn_id="t2"))
            assert unknown.value.code == "outcome_unknown" and unknown.value.retryable
            # It is on the primary, just not confirmed by a replica.
            assert [t.seq for t in store.context(key).turns] == [1, 2]
        finally:
            replica.sigcont()
        retried = store.append(key, AvatarMessage(text="not yet confirmed", turn_id="t2"))
        assert retried.duplicate and retried.seq == 2  # confirmed now, stored once
        assert [t.seq for t in store.context(key).turns] == [1, 2]


def test_the_default_durability_acknowledges_from_the_primary_alone(
    primary_and_replica: tuple[FaultRedis, FaultRedis],
) -> None:
    primary, replica = primary_and_replica
    key = ConversationKey(uuid.uuid4(), "im")
    with _store(primary.url, "default") as store:
        replica.sigstop()
        try:
            receipt = store.append(key, AvatarMessage(text="primary only", turn_id="t1"))
            assert receipt.seq == 1
        finally:
            replica.sigcont()


async def test_the_asyncio_store_waits_for_the_replica_too(
    primary_and_replica: tuple[FaultRedis, FaultRedis],
) -> None:
    from memtier import AsyncConversationStore

    primary, replica = primary_and_replica
    key = ConversationKey(uuid.uuid4(), "im")
    config = _config(primary.url, "replicated")
    async with AsyncConversationStore.from_config(config, recover=False) as store:
        assert (await store.append(key, AvatarMessage(text="a", turn_id="t1"))).seq == 1
        replica.sigstop()
        try:
            with pytest.raises(OutcomeUnknownError):
                await store.append(key, AvatarMessage(text="b", turn_id="t2"))
        finally:
            replica.sigcont()
        retried = await store.append(key, AvatarMessage(text="b", turn_id="t2"))
        assert retried.duplicate and retried.seq == 2


@pytest.mark.parametrize("api", ["sync", "async"])
async def test_a_replicated_append_many_waits_for_the_replica_per_call(
    primary_and_replica: tuple[FaultRedis, FaultRedis], api: str
) -> None:
    """``append_many`` with ``durability="replicated"`` waits for the replica after each
    ``append_turn`` call (one call takes the batch's turns): with the replica stopped the
    call is an unknown outcome (its turns on the primary, none confirmed: ``stored`` 0),
    and the same call sent again once the replica is back confirms each as a retry,
    storing nothing twice; a next batch is stored and confirmed."""
    from memtier import AsyncConversationStore

    primary, replica = primary_and_replica
    key = ConversationKey(uuid.uuid4(), "im")
    config = _config(primary.url, "replicated")
    turns = [AvatarMessage(text=f"m{i}", turn_id=f"t{i}") for i in range(3)]
    sync = ConversationStore.from_config(config, recover=False)
    astore = AsyncConversationStore.from_config(config, recover=False)

    async def append_many() -> list[Any]:
        if api == "sync":
            return sync.append_many(key, turns)
        return await astore.append_many(key, turns)

    try:
        replica.sigstop()
        try:
            with pytest.raises(OutcomeUnknownError) as unknown:
                await append_many()
            assert unknown.value.details["stored"] == 0
            assert [t.turn_id for t in sync.context(key).turns] == ["t0", "t1", "t2"]
        finally:
            replica.sigcont()
        receipts = await append_many()
        assert [(r.seq, r.duplicate) for r in receipts] == [(1, True), (2, True), (3, True)]
        turns[1:] = [AvatarMessage(text=f"n{i}", turn_id=f"n{i}") for i in range(2)]
        receipts = await append_many()
        assert [(r.seq, r.duplicate) for r in receipts] == [(1, True), (4, False), (5, False)]
        assert [t.turn_id for t in sync.context(key).turns] == ["t0", "t1", "t2", "n0", "n1"]
    finally:
        sync.close()
        await astore.close()
