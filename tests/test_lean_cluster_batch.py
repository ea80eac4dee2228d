"""A script batch on Redis Cluster: one write per primary, not one round trip per call.

A ``ScriptBatch`` (the restore's batches of ``restore_session`` calls) on a plain sync
``RedisCluster`` goes out as one pipeline per primary that owns one of its calls' slots:
every node written, then every node read (:meth:`memtier.leancluster.ClusterLean.pipeline`);
on an asyncio cluster client one coroutine queues the calls at once in each node's
auto-pipeline (:meth:`memtier.aioleancluster.AsyncClusterLean.submit`,
:func:`memtier.scriptbatch.run_script_batch_pipelined`).  Before, both sent a cluster
batch call by call.  Held here, on the session's Redis Cluster and Valkey 9
cluster:

* a Hypothesis property over batches of pushes and script replies (error replies among
  them) on keys spread over every primary: the cluster batch gives what the same batch
  gives on a standalone server (the reference: one pipeline there), the same replies or
  the same error, and leaves every list as the standalone one; one write per primary
  the batch touches, no call sent alone, no connection left checked out;
* a stale slot map: the calls of the moved slot are each re-sent once through redis-py
  (which patches its map) and run once, the others run lean;
* NOSCRIPT on one primary: its calls are loaded and re-sent, each runs once;
* a connection lost while a node's replies are read: every other written connection is
  dropped, none is left checked out, a slot-map refresh is asked for that node, and the
  next batch runs in step;
* the asyncio executor: the same property against the standalone batch (one write per
  primary, no call on the per-call path, no connection or guard slot left taken), one
  batch per primary with the replies of the calls one by one, a stale slot map (the
  moved slot's calls each redirected once), and a connection lost mid-batch (the node's
  bookkeeping done, nothing left taken, the next batch in step);
* a store's restore on the cluster sends its batches this way (sync and asyncio), and
  restores every session.
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redispy import LEAN_CLUSTER
from servers import RedisClusterServers
from test_lean_call import PROBE_LUA
from test_lean_cluster import SETTINGS, _in_use

from memtier import AvatarMessage, ConversationKey, ConversationStore, MemtierConfig
from memtier.connection import LeanPool, SyncClientGuard, connect_sync
from memtier.engine import ScriptBatch, ScriptCall
from memtier.executor import SyncExecutor
from memtier.leancluster import ClusterLean
from memtier.retry import RetryPolicy
from memtier.scripts import ScriptRegistry, load_registry

pytestmark = [pytest.mark.cluster, pytest.mark.redis_py(LEAN_CLUSTER)]

PUSH_LUA = """#!lua
-- KEYS[1] a list; ARGV[1] a value: pushed; returns the list's length.
return redis.call("RPUSH", KEYS[1], ARGV[1])
"""
TAGS = 12  # list keys {batchN}:list, spread over every primary


def _registry(root: Path) -> ScriptRegistry:
    folder = root / "batchprobe"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "probe-1.lua").write_text(PROBE_LUA, encoding="utf-8")
    (folder / "push-1.lua").write_text(PUSH_LUA, encoding="utf-8")
    return load_registry("batchprobe", root)


def _list_key(tag: int) -> str:
    return f"{{batch{tag}}}:list"


def _executor(client: Any, scripts: ScriptRegistry, **policy: Any) -> SyncExecutor:
    config = MemtierConfig.load(redis=SETTINGS)
    return SyncExecutor(client, scripts, SyncClientGuard(config.redis), RetryPolicy(**policy))


def _fresh_lists(client: Any) -> None:
    for tag in range(TAGS):
        client.delete(_list_key(tag))
        client.rpush(_list_key(tag), "x")


def _lists(client: Any) -> list[list[bytes]]:
    return [client.lrange(_list_key(tag), 0, -1) for tag in range(TAGS)]


def _primaries_of(client: RedisCluster, tags: list[int]) -> set[str]:
    manager = client.nodes_manager
    return {manager.get_node_from_slot(client.keyslot(_list_key(t))).name for t in tags}


def _outcome(executor: SyncExecutor, batch: ScriptBatch) -> tuple[Any, ...]:
    try:
        return ("replies", executor.execute(batch))
    except Exception as exc:  # the same class and message on both servers
        return ("error", type(exc).__name__, str(exc))


class Writes:
    """Counts ``LeanPool.send_pipeline`` writes (one per node per batch) and
    ``LeanPool.execute`` calls (a call sent alone)."""

    def __init__(self) -> None:
        self.pipelines = 0
        self.alone = 0
        self.commands: list[tuple[Any, ...]] = []
        self._send, self._execute = LeanPool.send_pipeline, LeanPool.execute

    def __enter__(self) -> Writes:
        def send(pool: Any, commands: Any) -> Any:
            self.pipelines += 1
            self.commands.extend(commands)
            return self._send(pool, commands)

        def execute(pool: Any, *args: Any) -> Any:
            self.alone += 1
            return self._execute(pool, *args)

        self._patches = [
            mock.patch.object(LeanPool, "send_pipeline", send),
            mock.patch.object(LeanPool, "execute", execute),
        ]
        for patch in self._patches:
            patch.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for patch in self._patches:
            patch.stop()


@pytest.fixture(scope="module", params=["redis_cluster", "valkey_cluster"])
def probe(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, ScriptRegistry, RedisClusterServers]]:
    cluster: RedisClusterServers = request.getfixturevalue(request.param)
    scripts = _registry(tmp_path_factory.mktemp("clusterbatch"))
    client, _ = connect_sync(MemtierConfig.load(redis_url=cluster.url, redis=SETTINGS))
    assert isinstance(client, RedisCluster)
    yield client, scripts, cluster
    for tag in range(TAGS):
        client.delete(_list_key(tag))
    client.close()


@pytest.fixture(scope="module")
def standalone(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The reference: the same batch on a standalone server (one pipeline there)."""
    scripts = _registry(tmp_path_factory.mktemp("batchstandalone"))
    client, _ = connect_sync(MemtierConfig.load(redis_url=redis_server.url, redis=SETTINGS))
    yield client, _executor(client, scripts)
    for tag in range(TAGS):
        client.delete(_list_key(tag))
    client.close()


_CALL = st.one_of(
    st.tuples(st.just("push"), st.integers(0, TAGS - 1), st.text("abc", max_size=3)),
    st.tuples(
        st.just("probe"),
        st.integers(0, TAGS - 1),
        st.sampled_from([("int", "7"), ("str", "s"), ("nil",), ("arr", "a", "b")]),
    ),
    st.tuples(
        st.just("probe"),
        st.integers(0, TAGS - 1),
        st.sampled_from([("err", "e"), ("memtier", "m")]),
    ),
)


def _script_call(call: tuple[Any, ...]) -> ScriptCall:
    kind, tag, rest = call
    args = (rest,) if kind == "push" else rest
    return ScriptCall(kind, (_list_key(tag),), args)


@settings(max_examples=40, deadline=None)
@given(calls=st.lists(_CALL, min_size=2, max_size=24))
@example(calls=[("push", t, str(t)) for t in range(TAGS)] * 2)  # every primary, twice
@example(calls=[("push", 0, "a"), ("probe", 5, ("memtier", "m")), ("push", 0, "b")])
@example(calls=[("probe", 3, ("err", "e")), ("push", 3, "a"), ("push", 9, "b")])
def test_a_cluster_batch_is_the_standalone_batch_in_one_write_per_primary(
    probe: Any, standalone: Any, calls: list[tuple[Any, ...]]
) -> None:
    client, scripts, _ = probe
    reference_client, reference = standalone
    executor = _executor(client, scripts)
    batch = ScriptBatch(tuple(_script_call(c) for c in calls))
    _fresh_lists(client)
    _fresh_lists(reference_client)
    with Writes() as writes:
        got = _outcome(executor, batch)
    assert got == _outcome(reference, batch)
    assert _lists(client) == _lists(reference_client)
    touched = _primaries_of(client, [tag for _, tag, _ in calls])
    assert (writes.pipelines, writes.alone) == (len(touched), 0)
    assert executor.lean_calls == 1
    assert _in_use(client) == []


def _map_slot_elsewhere(client: Any, slot: int) -> Any:
    """Make ``client`` (sync or asyncio cluster) believe another primary owns ``slot``, as
    a stale slot map does; returns the true owner."""
    manager = client.nodes_manager
    owner = manager.get_node_from_slot(slot)
    other = next(n for n in client.get_primaries() if n.name != owner.name)
    manager.slots_cache[slot] = [other]
    return owner


def test_the_calls_of_a_moved_slot_are_redirected_once_each(probe: Any) -> None:
    client, scripts, _ = probe
    executor = _executor(client, scripts)
    router = executor._lean_for(client)
    assert isinstance(router, ClusterLean)
    _fresh_lists(client)
    moved_tag = 0
    slot = router.slot(_list_key(moved_tag))
    manager = client.nodes_manager
    owner = _map_slot_elsewhere(client, slot)
    redirects = router.redirects
    calls = [("push", moved_tag, "a"), ("push", 1, "b"), ("push", moved_tag, "c")]
    replies = executor.execute(ScriptBatch(tuple(_script_call(c) for c in calls)))
    assert replies == [2, 2, 3]  # each ran once, in the batch's order on its key
    assert router.redirects == redirects + 2
    assert manager.get_node_from_slot(slot).name == owner.name  # redis-py patched its map
    assert client.lrange(_list_key(moved_tag), 0, -1) == [b"x", b"a", b"c"]
    with Writes() as writes:  # lean again, to the right node
        assert executor.execute(ScriptBatch(tuple(_script_call(c) for c in calls))) == [4, 3, 5]
    assert router.redirects == redirects + 2 and writes.alone == 0
    assert _in_use(client) == []


def test_noscript_on_one_primary_loads_and_resends_its_calls_once(probe: Any) -> None:
    client, scripts, _ = probe
    executor = _executor(client, scripts)
    _fresh_lists(client)
    calls = [("push", t, "v") for t in range(TAGS)]
    executor.execute(ScriptBatch(tuple(_script_call(c) for c in calls)))  # loaded everywhere
    flushed = client.nodes_manager.get_node_from_slot(client.keyslot(_list_key(0)))
    client.get_redis_connection(flushed).script_flush()
    replies = executor.execute(ScriptBatch(tuple(_script_call(c) for c in calls)))
    assert replies == [3] * TAGS  # every call ran once more, the flushed node's included
    assert _lists(client) == [[b"x", b"v", b"v"]] * TAGS
    assert _in_use(client) == []


def test_a_connection_lost_while_reading_drops_every_written_connection(
    probe: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, scripts, _ = probe
    executor = _executor(client, scripts, max_attempts=1)
    router = executor._lean_for(client)
    assert isinstance(router, ClusterLean)
    _fresh_lists(client)
    calls = [("push", t, "v") for t in range(TAGS)]
    assert len(_primaries_of(client, list(range(TAGS)))) >= 3  # the property needs nodes
    read, reads, dropped = LeanPool.read_pipeline, [0], []
    drop = LeanPool.drop

    def lost_on_second(pool: Any, conn: Any, count: int) -> list[Any]:
        reads[0] += 1
        if reads[0] == 2:  # as a lost socket does: the reader drops it, then raises
            drop(pool, conn)
            raise RedisConnectionError("lost while reading")
        return read(pool, conn, count)

    def counted_drop(pool: Any, conn: Any) -> None:
        dropped.append(conn)
        drop(pool, conn)

    failed: list[str] = []
    monkeypatch.setattr(LeanPool, "read_pipeline", lost_on_second)
    monkeypatch.setattr(LeanPool, "drop", counted_drop)
    monkeypatch.setattr(ClusterLean, "_node_failed", lambda _, name: failed.append(name))
    with pytest.raises(Exception) as caught:
        executor.execute(ScriptBatch(tuple(_script_call(c) for c in calls)))
    assert "lost while reading" in str(caught.value) or isinstance(
        caught.value.__cause__, RedisConnectionError
    )
    assert reads[0] == 2  # the first node read, the second lost: the third never read ...
    assert len(dropped) == 1  # ... but dropped, its replies unread
    assert len(failed) == 1  # a refresh asked for the node that failed, once
    assert _in_use(client) == []
    monkeypatch.setattr(LeanPool, "read_pipeline", read)
    lengths = executor.execute(ScriptBatch(tuple(_script_call(c) for c in calls)))
    assert lengths == [len(client.lrange(_list_key(t), 0, -1)) for t in range(TAGS)]
    assert all(n == 3 for n in lengths)  # the first batch ran on every node (its replies lost)


def _async_executor(aclient: Any, scripts: ScriptRegistry, **policy: Any) -> Any:
    from memtier.connection import AsyncClientGuard
    from memtier.executor import AsyncExecutor

    config = MemtierConfig.load(redis=SETTINGS)
    return AsyncExecutor(
        aclient, scripts, AsyncClientGuard(aclient, config.redis), RetryPolicy(**policy)
    )


def _async_taken(executor: Any) -> list[str]:
    """What an asyncio cluster executor left taken: node connections, guard slots."""
    taken = [
        node.name
        for node in executor.client.get_nodes()
        if len(node._connections) != len(node._free)
    ]
    guard = executor.guard
    return taken + (["guard"] if guard._slots._value != guard.limit else [])


async def _async_cluster_run(
    url: str, scripts: ScriptRegistry, batch: ScriptBatch
) -> tuple[tuple[Any, ...], int, list[str], list[str]]:
    """(outcome, node writes, calls on the per-call path, what was left taken)."""
    from memtier.connection import connect_async
    from memtier.executor import AsyncExecutor

    aclient, _ = connect_async(MemtierConfig.load(redis_url=url, redis=SETTINGS))
    executor = _async_executor(aclient, scripts)
    per_call: list[str] = []
    original = AsyncExecutor._script

    def counted(self: Any, call: ScriptCall) -> Any:
        per_call.append(call.script)
        return original(self, call)

    try:
        await aclient.initialize()
        lean = executor.lean_cluster_for(aclient)
        assert lean is not None and lean.pipelined
        with mock.patch.object(AsyncExecutor, "_script", counted):
            try:
                outcome: tuple[Any, ...] = ("replies", await executor.execute(batch))
            except Exception as exc:
                outcome = ("error", type(exc).__name__, str(exc))
        writes = sum(p.batches for p in lean._pipelines.values())
        return outcome, writes, per_call, _async_taken(executor)
    finally:
        await aclient.aclose()


@settings(max_examples=30, deadline=None)
@given(calls=st.lists(_CALL, min_size=2, max_size=24))
@example(calls=[("push", t, str(t)) for t in range(TAGS)] * 2)
@example(calls=[("push", 0, "a"), ("probe", 5, ("memtier", "m")), ("push", 0, "b")])
@example(calls=[("probe", 3, ("err", "e")), ("push", 3, "a"), ("probe", 9, ("memtier", "m"))])
def test_an_async_cluster_batch_is_the_standalone_batch_in_one_write_per_primary(
    probe: Any, standalone: Any, calls: list[tuple[Any, ...]]
) -> None:
    client, scripts, cluster = probe
    reference_client, reference = standalone
    for node in client.get_primaries():  # loaded: no NOSCRIPT re-sends in the counts
        for script in scripts:
            client.get_redis_connection(node).script_load(script.source)
    batch = ScriptBatch(tuple(_script_call(c) for c in calls))
    _fresh_lists(client)
    _fresh_lists(reference_client)
    got, writes, per_call, taken = asyncio.run(_async_cluster_run(cluster.url, scripts, batch))
    assert got == _outcome(reference, batch)
    assert _lists(client) == _lists(reference_client)
    assert writes == len(_primaries_of(client, [tag for _, tag, _ in calls]))
    assert (per_call, taken) == ([], [])


async def test_an_async_batchs_calls_of_a_moved_slot_are_redirected_once_each(probe: Any) -> None:
    from memtier.connection import connect_async

    client, scripts, cluster = probe
    _fresh_lists(client)
    aclient, _ = connect_async(MemtierConfig.load(redis_url=cluster.url, redis=SETTINGS))
    executor = _async_executor(aclient, scripts)
    try:
        await aclient.initialize()
        lean = executor.lean_cluster_for(aclient)
        assert lean is not None
        moved_tag = 0
        slot = lean.slot(_list_key(moved_tag))
        manager = aclient.nodes_manager
        owner = _map_slot_elsewhere(aclient, slot)
        calls = [("push", moved_tag, "a"), ("push", 1, "b"), ("push", moved_tag, "c")]
        replies = await executor.execute(ScriptBatch(tuple(_script_call(c) for c in calls)))
        assert replies == [2, 2, 3]  # each ran once, in the batch's order on its key
        assert lean.redirects == 2
        assert manager.get_node_from_slot(slot).name == owner.name  # redis-py patched its map
        assert client.lrange(_list_key(moved_tag), 0, -1) == [b"x", b"a", b"c"]
        again = await executor.execute(ScriptBatch(tuple(_script_call(c) for c in calls)))
        assert again == [4, 3, 5] and lean.redirects == 2  # lean again, to the right node
        assert _async_taken(executor) == []
    finally:
        await aclient.aclose()


def test_an_async_batchs_lost_connection_marks_the_node_and_leaves_nothing_taken(
    probe: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memtier import autopipeline
    from memtier.aioleancluster import AsyncClusterLean
    from memtier.connection import connect_async

    client, scripts, cluster = probe
    _fresh_lists(client)
    calls = [("push", t, "v") for t in range(TAGS)]
    read_call, reads, failed = autopipeline._read_call, [0], []

    async def lost_on_fifth(read: Any, replies: int) -> Any:
        reads[0] += 1
        if reads[0] == 5:
            raise RedisConnectionError("lost while reading")
        return await read_call(read, replies)

    monkeypatch.setattr(autopipeline, "_read_call", lost_on_fifth)
    monkeypatch.setattr(AsyncClusterLean, "_failed", lambda _, node, exc: failed.append(node.name))

    async def run() -> list[Any]:
        aclient, _ = connect_async(MemtierConfig.load(redis_url=cluster.url, redis=SETTINGS))
        executor = _async_executor(aclient, scripts, max_attempts=1)
        try:
            with pytest.raises(Exception) as caught:
                await executor.execute(ScriptBatch(tuple(_script_call(c) for c in calls)))
            assert "lost while reading" in str(caught.value) or isinstance(
                caught.value.__cause__, RedisConnectionError
            )
            assert len(set(failed)) == 1  # the node whose connection was lost, marked
            assert _async_taken(executor) == []
            monkeypatch.setattr(autopipeline, "_read_call", read_call)
            lengths: list[Any] = await executor.execute(
                ScriptBatch(tuple(_script_call(c) for c in calls))
            )
            return lengths
        finally:
            await aclient.aclose()

    lengths = asyncio.run(run())
    assert lengths == [len(client.lrange(_list_key(t), 0, -1)) for t in range(TAGS)]
    assert all(n == 3 for n in lengths)  # the lost batch ran on every node (all written)


async def test_an_async_cluster_batch_is_one_batch_per_primary(probe: Any) -> None:
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    from memtier.connection import connect_async
    from memtier.executor import AsyncExecutor

    client, scripts, cluster = probe
    config = MemtierConfig.load(redis_url=cluster.url, redis=SETTINGS)
    aclient, _ = connect_async(config)
    assert isinstance(aclient, AsyncRedisCluster)
    from memtier.connection import AsyncClientGuard

    executor = AsyncExecutor(
        aclient, scripts, AsyncClientGuard(aclient, config.redis), RetryPolicy()
    )
    try:
        _fresh_lists(client)
        calls = [("push", t % TAGS, str(t)) for t in range(2 * TAGS)]
        one_by_one = [await executor.execute(_script_call(c)) for c in calls]
        lean = executor.lean_cluster_for(aclient)
        assert lean is not None and lean.pipelined
        batches = sum(p.batches for p in lean._pipelines.values())
        replies = await executor.execute(ScriptBatch(tuple(_script_call(c) for c in calls)))
        assert replies == [n + 2 for n in one_by_one]  # each ran once, in order on its key
        written = sum(p.batches for p in lean._pipelines.values()) - batches
        assert written == len(_primaries_of(client, list(range(TAGS))))
        # NOSCRIPT for every call at once: the loads stay within max_connections per node
        cluster.script_flush()
        replies = await executor.execute(ScriptBatch(tuple(_script_call(c) for c in calls)))
        assert replies == [n + 4 for n in one_by_one]
        pairs = [[str(t).encode() for t in (i, i + TAGS)] for i in range(TAGS)]
        assert _lists(client) == [[b"x", *pair * 3] for pair in pairs]
    finally:
        await aclient.aclose()


@pytest.mark.parametrize("kind", ["sync", "asyncio"])
def test_a_restore_on_the_cluster_sends_its_batches_per_primary(probe: Any, kind: str) -> None:
    from memtier.memory.persistence.shared import snapshot_dir_for

    client, _, cluster = probe
    with tempfile.TemporaryDirectory() as storage:
        config = MemtierConfig.load(
            redis_url=cluster.url,
            namespace="cb" + uuid.uuid4().hex[:8],
            redis=SETTINGS,
            conversation={"persistence_enabled": True, "storage_path": storage},
        )
        own, _ = connect_sync(config)  # the store closes it
        store = ConversationStore(own, config, snapshots=snapshot_dir_for(config))
        keys = [ConversationKey(uuid.UUID(int=i + 1), "im") for i in range(40)]
        for k in keys:
            store.append(k, AvatarMessage(text=f"restore me {k.avatar}"))
        contexts = {k: store.context(k).messages for k in keys}
        store.flush()
        _wipe(client, config.namespace)
        restore_session = store.scripts["restore_session"]
        sha = client.script_load(restore_session.source)  # no NOSCRIPT re-sends counted
        assert sha == restore_session.sha
        with Writes() as writes:
            if kind == "sync":
                report = store.recover(force=True)
                # every restore_session call went out in a node's pipeline
                assert sum(1 for c in writes.commands if c[1] == sha) == len(keys)
            else:
                report, written = asyncio.run(_async_restore(config))
                assert written < len(keys) // 2  # calls shared writes (call by call: >= 40)
        assert report.outcome == "restored" and report.restored == len(keys)
        for k in keys:
            assert store.context(k).messages == contexts[k]
        _wipe(client, config.namespace)
        store.close()


async def _async_restore(config: MemtierConfig) -> tuple[Any, int]:
    """An asyncio store's restore, and the node batches it wrote."""
    from memtier import AsyncConversationStore

    store = AsyncConversationStore.from_config(config)
    try:
        lean = store.executor.lean_cluster_for(store.client)
        assert lean is not None and lean.pipelined
        before = sum(p.batches for p in lean._pipelines.values())
        report = await store.recover(force=True)
        return report, sum(p.batches for p in lean._pipelines.values()) - before
    finally:
        await store.aclose()


def _wipe(client: RedisCluster, namespace: str) -> None:
    for node in client.get_primaries():
        redis_node = client.get_redis_connection(node)
        keys = list(redis_node.scan_iter(match=f"*{namespace}*", count=1000))
        for key in keys:
            redis_node.delete(key)
