"""The lean cluster call path (``memtier.leancluster``) under topology faults, by ledger.

A private 3-primary cluster for this module (no replicas; every node with
``appendfsync always``, so a killed primary restarts with every write it acknowledged,
and the judge can be strict: nothing acknowledged may be lost).  Writer threads in this
process append through one :class:`~memtier.ConversationStore` -- so the test can see
that its calls went the lean way and were redirected -- with memtier's real retry waits,
each writer on keys of its own, recording every attempt as :mod:`ledger` does.  The
judge (:func:`ledger.judge`): every acknowledged append is present exactly once at its
receipt's seq, sequences are gapless, byte totals agree, every unknown outcome retried
with its turn id is present once; and, per key, the acknowledged appends are stored in
the order they were acknowledged.

* the partition's slot migrates to another primary under the writers, a few keys at a
  time (``SETSLOT IMPORTING/MIGRATING``, ``MIGRATE``, ``SETSLOT NODE``): the lean path
  meets ASK, TRYAGAIN and then MOVED on a stale slot map;
* the slot's primary is killed (SIGKILL) under the writers and restarted: calls in
  flight lose their connection, the slot map is re-read, retries go to the restarted
  node.

Both rows run twice: with sync writer threads on a ``ConversationStore`` (the lean path
of :mod:`memtier.leancluster`), and with asyncio writer coroutines on one
``AsyncConversationStore`` in a loop of their own (:mod:`memtier.aioleancluster`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from ledger import Attempt, classify, judge, ledger_key, settle_unknowns, turn_text
from redis.cluster import RedisCluster
from redispy import LEAN_CLUSTER
from servers import HOST, POLL_S, require_real_redis
from test_cluster_faults import FaultCluster, _node_id, _slot

import memtier.retry
from memtier import AsyncConversationStore, AvatarMessage, ConversationStore, MemtierConfig, metrics
from memtier.aioleancluster import AsyncClusterLean
from memtier.leancluster import ClusterLean

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.redis_py(LEAN_CLUSTER)]

WRITERS = 3
KEYS_PER_WRITER = 4
TURNS_PER_WRITER = 300  # ~75 per key: below every session bound (no compaction)
WRITE_S = 120.0  # every writer stops by then, whatever happens
SETTLE_S = 90.0


class DurableCluster(FaultCluster):
    """3 primaries, no replicas, short node timeout, ``appendfsync always`` on each node."""

    REPLICAS_PER_PRIMARY = 0

    def start(self) -> DurableCluster:
        super().start()
        for node in self._nodes:
            node.extra_config.update({"appendonly": "yes", "appendfsync": "always"})
            with node.client() as conn:
                assert conn.info("server")["process_id"] == node.pid  # our own server
                conn.config_set("appendfsync", "always")
                conn.config_set("appendonly", "yes")
        deadline = time.monotonic() + SETTLE_S
        for node in self._nodes:  # the first AOF rewrite done: the AOF is complete
            with node.client() as conn:
                while True:
                    persistence = conn.info("persistence")
                    if persistence.get("aof_enabled") == 1 and not (
                        persistence.get("aof_rewrite_in_progress")
                        or persistence.get("aof_rewrite_scheduled")
                    ):
                        break
                    assert time.monotonic() < deadline, f"AOF never enabled: {persistence}"
                    time.sleep(POLL_S)
        return self


@pytest.fixture(scope="module")
def cluster() -> Iterator[DurableCluster]:
    require_real_redis("redis-server", "redis-cli")
    with DurableCluster() as made:
        yield made


@pytest.fixture
def real_retry_waits() -> Iterator[None]:
    """memtier's production retry (waits, 20 s horizon): the writers ride out the fault."""
    memtier.retry.set_testing(False)
    yield
    memtier.retry.set_testing(True)


class LedgerWriters:
    """Writer threads appending through one store, every attempt in :attr:`attempts`."""

    def __init__(self, store: ConversationStore) -> None:
        self.store = store
        self.attempts: dict[str, Attempt] = {}
        self.acked_order: dict[str, list[str]] = {}  # member -> turn ids, as acknowledged
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._write, args=(w,), daemon=True) for w in range(WRITERS)
        ]

    def acked(self) -> int:
        with self._lock:
            return sum(1 for a in self.attempts.values() if a.outcome == "ack")

    def _turns(self, writer: int) -> Iterator[tuple[Any, Attempt]]:
        """The writer's appends in order (key, its attempt, recorded), until told to stop."""
        deadline = time.monotonic() + WRITE_S
        for n in range(TURNS_PER_WRITER):
            if self.stop.is_set() or time.monotonic() >= deadline:
                return
            key = ledger_key(writer * KEYS_PER_WRITER + n % KEYS_PER_WRITER)
            attempt = Attempt(f"w{writer}-{n}", f"{key.avatar}:{key.channel}")
            with self._lock:
                self.attempts[attempt.turn_id] = attempt
            yield key, attempt

    def _record(self, attempt: Attempt, receipt: Any, exc: Exception | None) -> None:
        """Every outcome is recorded; the judge decides."""
        with self._lock:
            if exc is not None:
                attempt.outcome, attempt.code = classify(exc)
                return
            attempt.outcome = "ack"
            attempt.session_id, attempt.seq = receipt.session_id, receipt.seq
            self.acked_order.setdefault(attempt.member, []).append(attempt.turn_id)

    def _write(self, writer: int) -> None:
        for key, attempt in self._turns(writer):
            turn = AvatarMessage(text=turn_text(attempt.turn_id), turn_id=attempt.turn_id)
            try:
                receipt = self.store.append(key, turn)
            except Exception as exc:
                self._record(attempt, None, exc)
                continue
            self._record(attempt, receipt, None)
            time.sleep(0.001)

    def __enter__(self) -> LedgerWriters:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout=WRITE_S + SETTLE_S)
        assert not any(t.is_alive() for t in self._threads), "a writer never finished"

    def wait_acks(self, count: int, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.acked() < count:
            assert time.monotonic() < deadline, f"only {self.acked()} of {count} acks"
            assert any(t.is_alive() for t in self._threads), "every writer stopped"
            time.sleep(POLL_S)


class AsyncLedgerWriters(LedgerWriters):
    """:class:`LedgerWriters` as asyncio coroutines: one loop in a thread of its own runs
    WRITERS writers on one :class:`~memtier.AsyncConversationStore` (the lean asyncio
    cluster path), recording every attempt the same way; :attr:`router` is its lean
    path, read after the run."""

    def __init__(self, config: MemtierConfig) -> None:
        self.config = config
        self.attempts = {}
        self.acked_order = {}
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self.router: AsyncClusterLean | None = None
        self._threads = [threading.Thread(target=self._run_loop, daemon=True)]

    def _run_loop(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        async with AsyncConversationStore.from_config(self.config, recover=False) as store:
            await asyncio.gather(*(self._write_async(store, w) for w in range(WRITERS)))
            self.router = store.executor.lean_cluster_for(store.client)

    async def _write_async(self, store: AsyncConversationStore, writer: int) -> None:
        for key, attempt in self._turns(writer):
            turn = AvatarMessage(text=turn_text(attempt.turn_id), turn_id=attempt.turn_id)
            try:
                receipt = await store.append(key, turn)
            except Exception as exc:
                self._record(attempt, None, exc)
                continue
            self._record(attempt, receipt, None)
            await asyncio.sleep(0.001)


def _retries() -> float:
    return sum(
        sample.value
        for family in metrics.RETRIES.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
    )


def _run_and_judge(
    cluster: DurableCluster,
    namespace: str,
    fault: Callable[[LedgerWriters], None],
    api: str = "sync",
) -> tuple[ClusterLean | AsyncClusterLean, Any]:
    config = MemtierConfig.load(redis_url=cluster.url, namespace=namespace)
    with ConversationStore.from_config(config, recover=False) as store:
        writers = LedgerWriters(store) if api == "sync" else AsyncLedgerWriters(config)
        with writers:
            writers.wait_acks(60)
            fault(writers)
            after = writers.acked()
            writers.wait_acks(after + 60)  # the writers go on after the fault
        router: ClusterLean | AsyncClusterLean | None
        if isinstance(writers, AsyncLedgerWriters):
            router = writers.router
            assert isinstance(router, AsyncClusterLean)
            assert router.calls >= writers.acked()  # every acknowledged append went lean
        else:
            router = store.executor._lean_for(store.executor.client)
            assert isinstance(router, ClusterLean)
            assert store.executor.lean_calls >= writers.acked()
        cluster.wait_healthy()
        settle_unknowns(store, writers.attempts)
    client = RedisCluster(host=HOST, port=cluster.ports[0], socket_timeout=10)
    try:
        verdict = judge(client, namespace, writers.attempts)
    finally:
        client.close()
    print(f"ledger verdict: {verdict}, redirects {router.redirects}")
    verdict.check()
    assert verdict.lost_unreplicated == 0
    for member, turn_ids in writers.acked_order.items():  # one writer per key
        seqs = [writers.attempts[tid].seq for tid in turn_ids]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), member
    return router, verdict


@pytest.mark.parametrize("api", ["sync", "asyncio"])
def test_appends_while_the_partition_slot_migrates(
    cluster: DurableCluster, real_retry_waits: None, api: str
) -> None:
    namespace = "l" + uuid.uuid4().hex[:8]
    slot = _slot(namespace)
    source, _ = cluster.owner_of(slot)
    target = next(p for p in cluster.primaries() if p != source)
    source_id, target_id = _node_id(cluster, source), _node_id(cluster, target)

    def migrate(writers: LedgerWriters) -> None:
        with cluster.node_client(source) as src, cluster.node_client(target) as dst:
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
            for _ in range(1000):  # bounded: a namespace has a few dozen keys
                keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 3)
                if not keys:
                    break
                src.execute_command("MIGRATE", HOST, target, "", 0, 5000, "KEYS", *keys)
                time.sleep(0.05)  # writers run against the half-migrated slot
            else:
                raise AssertionError("the slot never emptied")
            for port in cluster.primaries():
                with cluster.node_client(port) as conn:
                    conn.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)

    router, verdict = _run_and_judge(cluster, namespace, migrate, api)
    assert cluster.owner_of(slot)[0] == target
    assert router.redirects >= 1  # ASK / MOVED met and followed through redis-py
    assert verdict.failed == 0  # TRYAGAIN while half migrated: retried, never given up


@pytest.mark.parametrize("api", ["sync", "asyncio"])
def test_appends_while_the_slots_primary_is_killed_and_restarted(
    cluster: DurableCluster, real_retry_waits: None, api: str
) -> None:
    namespace = "l" + uuid.uuid4().hex[:8]
    slot = _slot(namespace)
    primary, _ = cluster.owner_of(slot)
    retries_before = _retries()

    def kill_and_restart(writers: LedgerWriters) -> None:
        node = cluster.node(primary)
        pid = node.pid
        assert pid is not None
        with node.client() as conn:
            assert conn.info("server")["process_id"] == pid  # our own server
        os.kill(pid, signal.SIGKILL)  # mid-call: the writers are appending to this node
        assert node.proc is not None
        node.proc.wait(timeout=SETTLE_S)
        time.sleep(0.5)  # calls meet a refused connection, not only a lost one
        cluster.restart_node(primary)

    _run_and_judge(cluster, namespace, kill_and_restart, api)
    assert cluster.owner_of(slot)[0] == primary
    assert _retries() > retries_before  # the kill was felt by calls in flight


def test_the_restarted_node_answers_the_lean_path_with_its_own_replies(
    cluster: DurableCluster,
) -> None:
    """After the kill row: every pooled connection of every node answers its own call."""
    config = MemtierConfig.load(redis_url=cluster.url, namespace="l" + uuid.uuid4().hex[:8])
    with ConversationStore.from_config(config, recover=False) as store:
        for n in range(24):
            key = ledger_key(100 + n)
            receipt = store.append(key, AvatarMessage(text=f"after {n}"))
            context = store.context(key, limit=3)
            assert receipt.seq == 1
            assert f"after {n}" in context.model_dump_json()
        assert store.executor.lean_calls >= 48
        client = store.executor.client
        for node in client.get_nodes():
            pool = client.get_redis_connection(node).connection_pool
            assert not pool._in_use_connections
