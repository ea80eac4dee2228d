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


def _store(url: str, durability: str) -> ConversationStore:
    config = MemtierConfig.load(
        redis_url=url,
        namespace="d" + uuid.uuid4().hex[:8],
        redis={"durability": durability, "wait_replicas": 1, "wait_timeout_ms": 1000},
    )
    return ConversationStore.from_config(config, recover=False)


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
    config = MemtierConfig.load(
        redis_url=primary.url,
        namespace="d" + uuid.uuid4().hex[:8],
        redis={"durability": "replicated", "wait_replicas": 1, "wait_timeout_ms": 1000},
    )
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
