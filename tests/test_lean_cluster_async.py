"""The lean call path on an asyncio Redis Cluster client (issue 12; sync: test_lean_cluster).

An :class:`~memtier.executor.AsyncExecutor` on a plain asyncio ``RedisCluster`` computes
each call's slot once (from its first key), reads the slot's primary from the client's
slot map and writes the packed ``EVALSHA`` -- or the whole read transaction -- on one
connection of that node (:mod:`memtier.aioleancluster`).  These tests hold it to
redis-py's generic asyncio cluster path, on the session's Redis Cluster (3 primaries + 3
replicas) and Valkey 9 cluster (3 primaries):

* it is taken on a plain asyncio cluster client (counted), never on a subclass or a
  client whose ``execute_command`` was replaced, nor with ``lean=False``;
* a Hypothesis property over script replies and error replies, keys spread over every
  primary, and NOSCRIPT after ``SCRIPT FLUSH`` on every node: the same reply or the same
  memtier error and attempt count on both paths -- except ``TRYAGAIN``, which the lean
  path leaves to memtier's retry layer (the generic cluster path re-sends it inside
  redis-py first): there the outcome equals the standalone asyncio one;
* a stale slot map (the client believes another primary owns the slot): MOVED, the call
  re-sent once through redis-py (which patches its map), the script ran exactly once,
  the next call lean to the right node; the same for the context read transaction;
* a store's append and context take the lean path on both clusters;
* with auto-pipelining on (the default) each primary has a pipeline of its own: calls
  of one loop tick for one node share a write, each caller gets its own reply, and
  ``max_connections`` bounds the connections (a node's batch takes one slot for all its
  callers: 64 concurrent calls at ``max_connections`` = 1 all answer).

A primary killed and a slot migrated under asyncio writers, judged by a ledger, are in
``tests/faults/test_lean_cluster_faults.py``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio
from clusterrefresh import ask_refresh_and_wait_due
from hypothesis import example, given, settings
from hypothesis import strategies as st
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from redispy import LEAN_CLUSTER
from test_lean_cluster import _CALLS, _registry

from memtier import (
    AsyncConversationStore,
    AvatarMessage,
    ConversationKey,
    MemtierConfig,
    MemtierError,
)
from memtier.aioleancluster import AsyncClusterLean, lean_cluster_async
from memtier.connection import AsyncClientGuard, connect_async
from memtier.engine import ScriptCall
from memtier.executor import AsyncExecutor
from memtier.retry import RetryPolicy
from memtier.scripts import ScriptRegistry

pytestmark = [pytest.mark.cluster, pytest.mark.redis_py(LEAN_CLUSTER)]

SETTINGS = {
    "max_connections": 4,
    "socket_timeout_seconds": 5.0,
    "connect_timeout_seconds": 2.0,
    "pool_timeout_seconds": 5.0,
}
TAGS = 12  # list keys {aleanN}:list, spread over every primary


def _list_key(tag: int) -> str:
    return f"{{alean{tag}}}:list"


def _config(url: str, **options: Any) -> MemtierConfig:
    return MemtierConfig.load(redis_url=url, redis=SETTINGS, **options)


def _executor(client: Any, scripts: ScriptRegistry, *, lean: bool = True) -> AsyncExecutor:
    config = MemtierConfig.load(redis=SETTINGS)
    return AsyncExecutor(
        client, scripts, AsyncClientGuard(client, config.redis), RetryPolicy(), lean=lean
    )


def _call(tag: int, kind: str, *payload: str | int) -> ScriptCall:
    return ScriptCall("probe", (_list_key(tag),), (kind, *payload), attempts=[0])


async def _outcome(executor: AsyncExecutor, call: ScriptCall) -> tuple[Any, ...]:
    try:
        reply = await executor.execute(call)
    except MemtierError as exc:
        return ("error", type(exc), str(exc), exc.code, call.attempts)
    return ("reply", reply, call.attempts)


def _in_use(client: Any) -> int:
    """Connections checked out of any node of an asyncio cluster client."""
    return sum(len(n._connections) - len(n._free) for n in client.get_nodes())


async def _fill(client: Any) -> None:
    for tag in range(TAGS):
        await client.delete(_list_key(tag))
        await client.rpush(_list_key(tag), "x")


@pytest.fixture(scope="module", params=["redis_cluster", "valkey_cluster"])
def cluster(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> ScriptRegistry:
    return _registry(tmp_path_factory.mktemp("aleancluster"))


async def test_the_lean_path_is_taken_on_a_plain_asyncio_cluster_client(
    cluster: Any, scripts: ScriptRegistry
) -> None:
    client, _ = connect_async(_config(cluster.url))
    try:
        lean, generic = _executor(client, scripts), _executor(client, scripts, lean=False)
        await lean.guard.open()
        await _fill(client)
        for tag in range(TAGS):
            assert await lean.execute(_call(tag, "str", f"a{tag}")) == f"a{tag}".encode()
            assert await generic.execute(_call(tag, "str", f"a{tag}")) == f"a{tag}".encode()
        router = lean.lean_cluster_for(client)
        assert isinstance(router, AsyncClusterLean)
        assert TAGS <= router.calls <= 2 * TAGS  # every call, plus a re-send after NOSCRIPT
        assert generic.lean_cluster_for(client) is None
        for tag in range(TAGS):
            assert router.slot(_list_key(tag)) == key_slot(f"alean{tag}".encode())
        manager = client.nodes_manager
        owners = {manager.get_node_from_slot(router.slot(_list_key(t))).name for t in range(TAGS)}
        assert len(owners) == len(client.get_primaries())  # the keys reach every primary

        class Traced(RedisCluster):  # a subclass may hook execute_command: keep redis-py's
            pass

        assert lean_cluster_async(Traced.__new__(Traced)) is None
        client.execute_command = client.execute_command  # type: ignore[method-assign]
        try:
            assert lean_cluster_async(client) is None
        finally:
            del client.execute_command
        assert lean_cluster_async(client) is not None
        assert lean_cluster_async(redis.asyncio.Redis()) is None  # standalone: the pipeline
        assert _in_use(client) == 0
    finally:
        await client.aclose()


@pytest.fixture(scope="module")
def standalone_url(redis_server: Any) -> Iterator[str]:
    """A standalone server: what TRYAGAIN must give on the lean cluster path."""
    yield redis_server.url


async def _compare(
    cluster: Any,
    standalone_url: str,
    scripts: ScriptRegistry,
    call: tuple[str, ...],
    tag: int,
    flush_first: bool,
) -> None:
    client, _ = connect_async(_config(cluster.url))
    try:
        outcomes = []
        for lean in (True, False):
            executor = _executor(client, scripts, lean=lean)
            await executor.guard.open()
            await _fill(client)
            if flush_first:  # NOSCRIPT on the first send, on whichever node owns the slot
                cluster.script_flush()  # every node (the fixture's own servers)
            before = 0 if not lean else executor.lean_cluster_for(client).calls  # type: ignore[union-attr]
            outcomes.append(await _outcome(executor, _call(tag, *call)))
            if lean:
                router = executor.lean_cluster_for(client)
                attempts = outcomes[-1][-1][0]  # each sent lean, a NOSCRIPT re-sent once
                assert router is not None and attempts <= router.calls - before <= 2 * attempts
        if call[0] == "transient":  # the generic cluster path retries TRYAGAIN inside redis-py
            plain, _ = connect_async(_config(standalone_url))
            try:
                await _fill(plain)
                alone = _executor(plain, scripts)
                assert outcomes[0] == await _outcome(alone, _call(tag, *call))
            finally:
                await plain.aclose()
            assert outcomes[0][0] == "error" and outcomes[0][-1] == [5]  # TESTING_MAX_ATTEMPTS
        else:
            assert outcomes[0] == outcomes[1]
        assert _in_use(client) == 0
    finally:
        await client.aclose()


@settings(max_examples=40, deadline=None)
@given(call=_CALLS, tag=st.integers(0, TAGS - 1), flush_first=st.booleans())
@example(call=("transient", "x"), tag=0, flush_first=False)
@example(call=("memtier", "x"), tag=1, flush_first=True)
@example(call=("nil",), tag=2, flush_first=True)
@example(call=("wrongtype",), tag=3, flush_first=True)
@example(call=("arr", "a", "b"), tag=4, flush_first=False)
def test_lean_and_generic_asyncio_cluster_paths_give_the_same_replies_and_errors(
    cluster: Any,
    standalone_url: str,
    scripts: ScriptRegistry,
    call: tuple[str, ...],
    tag: int,
    flush_first: bool,
) -> None:
    asyncio.run(_compare(cluster, standalone_url, scripts, call, tag, flush_first))


async def test_a_stale_slot_map_is_redirected_once_and_runs_the_script_once(
    cluster: Any, scripts: ScriptRegistry
) -> None:
    client, _ = connect_async(_config(cluster.url))
    counter = "{aleanmoved}:" + uuid.uuid4().hex
    try:
        executor = _executor(client, scripts)
        assert await executor.execute(ScriptCall("counter", (counter,), ())) == 1
        router = executor.lean_cluster_for(client)
        assert isinstance(router, AsyncClusterLean)
        slot = router.slot(counter)
        manager = client.nodes_manager
        owner = manager.get_node_from_slot(slot)
        other = next(n for n in client.get_primaries() if n.name != owner.name)
        manager.slots_cache[slot] = [other]  # the client now believes another primary owns it
        redirects = router.redirects
        assert await executor.execute(ScriptCall("counter", (counter,), ())) == 2  # ran once
        assert router.redirects == redirects + 1
        assert manager.get_node_from_slot(slot).name == owner.name  # redis-py patched its map
        assert await executor.execute(ScriptCall("counter", (counter,), ())) == 3
        assert router.redirects == redirects + 1  # lean again, to the right node
        assert int(await client.get(counter)) == 3
        assert _in_use(client) == 0
    finally:
        await client.delete(counter)
        await client.aclose()


async def test_a_store_on_an_asyncio_cluster_takes_the_lean_path(cluster: Any) -> None:
    namespace = "t" + uuid.uuid4().hex[:10]
    async with AsyncConversationStore.from_config(
        _config(cluster.url, namespace=namespace)
    ) as store:
        key = ConversationKey(str(uuid.uuid4()), "im")
        receipts = [
            await store.append(key, AvatarMessage(text=f"hello lean {n}")) for n in range(3)
        ]
        assert [r.seq for r in receipts] == [1, 2, 3]
        router = store.executor.lean_cluster_for(store.client)
        assert isinstance(router, AsyncClusterLean)
        appended = router.calls
        assert appended >= 3
        context = await store.context(key, limit=5)
        assert router.calls > appended  # the read transaction went lean too
        assert [t.fields["text"] for t in context.turns] == [f"hello lean {n}" for n in range(3)]
        together = await asyncio.gather(
            *(store.append(key, AvatarMessage(text=f"c{n}", turn_id=f"c{n}")) for n in range(8))
        )
        assert sorted(r.seq for r in together) == list(range(4, 12))
        assert len((await store.context(key)).turns) == 11
        assert _in_use(store.client) == 0


async def test_a_context_read_on_a_stale_slot_map_is_redirected_and_answers_once(
    cluster: Any,
) -> None:
    """The lean read transaction sent to a primary that does not own the slot: the EXEC
    aborts (MOVED while queueing, nothing ran), the transaction goes once through
    redis-py's ClusterPipeline, and the read answers; the next read is lean again."""
    namespace = "t" + uuid.uuid4().hex[:10]
    async with AsyncConversationStore.from_config(
        _config(cluster.url, namespace=namespace)
    ) as store:
        key = ConversationKey(str(uuid.uuid4()), "im")
        for n in range(3):
            await store.append(key, AvatarMessage(text=f"moved {n}"))
        router = store.executor.lean_cluster_for(store.client)
        assert isinstance(router, AsyncClusterLean)
        slot = router.slot(next(iter(router._slots)))  # the session's slot (one tag)
        manager = store.client.nodes_manager
        owner = manager.get_node_from_slot(slot)
        other = next(n for n in store.client.get_primaries() if n.name != owner.name)
        manager.slots_cache[slot] = [other]
        redirects = router.redirects
        turns = (await store.context(key, limit=5)).turns
        assert [t.seq for t in turns] == [1, 2, 3]
        assert router.redirects == redirects + 1
        calls = router.calls
        assert [t.seq for t in (await store.context(key, limit=2)).turns] == [2, 3]
        assert router.redirects == redirects + 1 and router.calls == calls + 1
        assert _in_use(store.client) == 0


def _drop_node(manager: Any, dropped: Any) -> None:
    """Leave ``dropped`` out of redis-py's map and startup list, as ``initialize()`` does
    when ``CLUSTER SLOTS`` omits a node (redis-py then closes its free connections)."""
    for known in (manager.nodes_cache, manager.startup_nodes):
        survivors = {n: node for n, node in known.items() if n != dropped.name}
        manager.set_nodes(known, survivors, remove_old=True)


async def _store_with_a_called_node(
    url: str,
) -> tuple[AsyncConversationStore, ConversationKey, AsyncClusterLean, int, Any]:
    """An open store that appended once: its router, the session's slot and its node."""
    namespace = "t" + uuid.uuid4().hex[:10]
    store = AsyncConversationStore.from_config(_config(url, namespace=namespace))
    await store.open()
    key = ConversationKey(str(uuid.uuid4()), "im")
    await store.append(key, AvatarMessage(text="kept"))
    router = store.executor.lean_cluster_for(store.client)
    assert isinstance(router, AsyncClusterLean) and router.pipelined
    slot = router.slot(next(iter(router._slots)))
    return store, key, router, slot, store.client.nodes_manager.get_node_from_slot(slot)


def _all_closed(store: AsyncConversationStore, dropped: Any) -> None:
    assert not any(c.is_connected for c in dropped._connections)
    for node in store.client.get_nodes():
        assert not any(c.is_connected for c in node._connections)


@pytest.mark.parametrize("reread", [True, False], ids=["map-reread", "closed-at-once"])
async def test_a_node_dropped_from_the_slot_map_leaves_no_connection_open(
    cluster: Any, reread: bool
) -> None:
    """A slot-map refresh that leaves a node out (as redis-py's ``initialize`` does when
    ``CLUSTER SLOTS`` omits it during a failover) drops redis-py's node object; redis-py
    then closes only that node's free connections, and on close only its current
    nodes'.  So a node pipeline must keep no connection of its own between calls (a
    node's ``acquire_connection`` is a deque pop: nothing to save): after the next call
    finds a new object for that node name, or after the store closes, no connection of
    the dropped object is open (a connection kept idle by its pipeline would be)."""
    store, key, router, slot, dropped = await _store_with_a_called_node(cluster.url)
    try:
        manager = store.client.nodes_manager
        assert router._pipelines[dropped.name].direct_calls >= 1
        assert any(c.is_connected for c in dropped._connections)  # the kept one
        _drop_node(manager, dropped)
        if reread:
            await ask_refresh_and_wait_due(store.client)  # the next call re-reads the map
            await store.append(key, AvatarMessage(text="after"))
            fresh = manager.get_node_from_slot(slot)
            assert fresh.name == dropped.name and fresh is not dropped
            assert router._pipelines[fresh.name].pool.node is fresh
            await asyncio.sleep(0.05)  # redis-py's disconnect task for the dropped node
            assert not any(c.is_connected for c in dropped._connections)
            assert [t.seq for t in (await store.context(key)).turns] == [1, 2]
    finally:
        await store.close()
    _all_closed(store, dropped)


_PING = (b"*1\r\n$4\r\nPING\r\n",)


@pytest.mark.parametrize("calls", [1, 8])
async def test_calls_queued_for_a_dropped_node_leave_no_connection_open(
    cluster: Any, calls: int
) -> None:
    """Calls queued on a node's pipeline before redis-py drops that node object from its
    map, and sent after: their batch takes a connection of the dropped object (its free
    one, before redis-py's disconnect task runs, or a new one).  redis-py never closes
    that object again (its ``aclose`` walks the current map), so the pipeline closes
    the connection when the batch gives it back: none is open after the calls, nor after
    the store closes.  (Seen in CI as a ResourceWarning for a node of a failover test.)"""
    store, key, router, _, dropped = await _store_with_a_called_node(cluster.url)
    try:
        pipeline = router.pipeline_for(dropped)
        assert pipeline is not None
        queued = [pipeline.submit(_PING) for _ in range(calls)]  # the send task not run yet
        _drop_node(store.client.nodes_manager, dropped)
        assert await asyncio.gather(*queued) == [b"PONG"] * calls  # sent to the old object
        await asyncio.sleep(0.05)  # redis-py's own disconnect task for the dropped node
        assert dropped._connections, "the batch took no connection of the dropped node"
        assert not any(c.is_connected for c in dropped._connections)
        await ask_refresh_and_wait_due(store.client)  # the next call re-reads the map
        await store.append(key, AvatarMessage(text="after"))
        assert [t.seq for t in (await store.context(key)).turns] == [1, 2]
    finally:
        await store.close()
    _all_closed(store, dropped)


async def _concurrent(url: str, scripts: ScriptRegistry, limit: int, n: int) -> None:
    config = MemtierConfig.load(redis_url=url, redis={**SETTINGS, "max_connections": limit})
    client, _ = connect_async(config)
    try:
        executor = AsyncExecutor(
            client, scripts, AsyncClientGuard(client, config.redis), RetryPolicy()
        )
        await executor.guard.open()
        await _fill(client)
        calls = [_call(i % TAGS, "str", f"c{i}") for i in range(n)]
        replies = await asyncio.gather(*(executor.execute(c) for c in calls))
        assert replies == [f"c{i}".encode() for i in range(n)]  # each its own reply
        router = executor.lean_cluster_for(client)
        assert router is not None and router.pipelined
        pipelines = list(router._pipelines.values())
        assert len(pipelines) == len(client.get_primaries())  # every primary was called
        assert sum(p.calls for p in pipelines) >= n
        assert sum(p.batches for p in pipelines) < n  # concurrent calls shared writes
        assert _in_use(client) == 0
        # one at a time: each caller writes its own call on an idle node pipeline
        direct = sum(p.direct_calls for p in pipelines)
        for i in range(4):
            assert await executor.execute(_call(i, "str", f"s{i}")) == f"s{i}".encode()
        assert sum(p.direct_calls for p in router._pipelines.values()) == direct + 4
    finally:
        await client.aclose()


@pytest.mark.parametrize("limit", [1, 4])
async def test_node_pipelines_batch_concurrent_calls_within_max_connections(
    cluster: Any, scripts: ScriptRegistry, limit: int
) -> None:
    """64 concurrent calls over every primary, at ``max_connections`` 1 and 4: each gets
    its own reply, the calls of one node share writes, and nothing waits out the pool
    timeout (a node's batch holds one slot for all its callers; a caller holds none)."""
    await _concurrent(cluster.url, scripts, limit, 64)  # a slot held twice: backend_busy


async def test_auto_pipelining_off_sends_each_call_alone(
    cluster: Any, scripts: ScriptRegistry
) -> None:
    config = MemtierConfig.load(redis_url=cluster.url, redis={**SETTINGS, "auto_pipelining": False})
    client, _ = connect_async(config)
    try:
        executor = AsyncExecutor(
            client,
            scripts,
            AsyncClientGuard(client, config.redis),
            RetryPolicy(),
            pipeline=None,
        )
        await executor.guard.open()
        await _fill(client)
        replies = await asyncio.gather(
            *(executor.execute(_call(i % TAGS, "str", f"o{i}")) for i in range(16))
        )
        assert replies == [f"o{i}".encode() for i in range(16)]
        router = executor.lean_cluster_for(client)
        assert router is not None and not router.pipelined and router._pipelines == {}
        assert router.calls >= 16
        assert _in_use(client) == 0
    finally:
        await client.aclose()
