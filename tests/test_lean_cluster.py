"""The lean call path on Redis Cluster and Valkey (issue 12, "A lean call path").

A :class:`~memtier.executor.SyncExecutor` on a plain sync ``RedisCluster`` computes each
call's slot once (from its first key), reads the slot's primary from the client's slot
map and sends the packed EVALSHA on that node's pool (:mod:`memtier.leancluster`).
These tests hold it to redis-py's generic cluster path, on the session's Redis Cluster
(3 primaries + 3 replicas) and Valkey 9 cluster (3 primaries):

* it is taken on a plain cluster client (counted), never on a subclass or a client
  whose ``execute_command`` was replaced; the slot cache is bounded;
* a Hypothesis property over script replies and error replies, keys spread over every
  primary, and NOSCRIPT after ``SCRIPT FLUSH`` on every node: the same reply or the same
  memtier error and attempt count on both paths -- except ``TRYAGAIN``, which the lean
  path leaves to memtier's retry layer exactly as the standalone lean path does (the
  generic cluster path re-sends it inside redis-py first): there the lean cluster
  outcome equals the standalone one;
* a stale slot map (the client believes another primary owns the slot): the node
  answers MOVED, the call is re-sent once through redis-py (which patches its map), the
  script ran exactly once, and the next call goes lean to the right node;
* a store's append and context take the lean path on both clusters; the standalone lean
  path works on Valkey too;
* a primary that refuses connections while the cluster still names it (a failover before
  the node timeout): the failed calls ask for slot-map refreshes that merge and run at
  most once per ``topology_refresh_min_interval`` (redis-py 8.2's pacing), not one per
  failed call, and the refresh asked for still runs on the next call once due.

Slot migration (ASK) and a primary killed mid-call, judged by a ledger, are in
``tests/faults/test_lean_cluster_faults.py`` (a private cluster).
"""

from __future__ import annotations

import itertools
import socket
import string
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from redis.cluster import PRIMARY, ClusterNode, RedisCluster
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redispy import LEAN_CLUSTER, PACED_REFRESH
from servers import RedisClusterServers, held_connections
from test_lean_call import PROBE_LUA

from memtier import MemtierConfig, MemtierError
from memtier.connection import SyncClientGuard, connect_sync
from memtier.engine import ScriptCall
from memtier.executor import SyncExecutor
from memtier.leancluster import ClusterLean, lean_cluster
from memtier.retry import RetryPolicy
from memtier.scripts import ScriptRegistry, load_registry

pytestmark = [pytest.mark.cluster, pytest.mark.redis_py(LEAN_CLUSTER)]

COUNTER_LUA = """#!lua
-- KEYS[1] a counter; returns it incremented (how many times the script ran).
return redis.call("INCR", KEYS[1])
"""
SETTINGS = {
    "max_connections": 2,
    "socket_timeout_seconds": 2.0,
    "connect_timeout_seconds": 2.0,
    "pool_timeout_seconds": 5.0,
}
TAGS = 12  # list keys {leanN}:list, spread over every primary


def _registry(root: Path) -> ScriptRegistry:
    folder = root / "probe"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "probe-1.lua").write_text(PROBE_LUA, encoding="utf-8")
    (folder / "counter-1.lua").write_text(COUNTER_LUA, encoding="utf-8")
    return load_registry("probe", root)


def _list_key(tag: int) -> str:
    return f"{{lean{tag}}}:list"


def _executor(client: Any, scripts: ScriptRegistry, *, lean: bool = True) -> SyncExecutor:
    config = MemtierConfig.load(redis=SETTINGS)
    return SyncExecutor(client, scripts, SyncClientGuard(config.redis), RetryPolicy(), lean=lean)


def _call(tag: int, kind: str, *payload: str | int) -> ScriptCall:
    return ScriptCall("probe", (_list_key(tag),), (kind, *payload), attempts=[0])


def _outcome(executor: SyncExecutor, call: ScriptCall) -> tuple[Any, ...]:
    try:
        reply = executor.execute(call)
    except MemtierError as exc:
        return ("error", type(exc), str(exc), exc.code, call.attempts)
    return ("reply", reply, call.attempts)


def _in_use(client: Any) -> list[Any]:
    """Connections checked out of any node pool of a cluster client (or a standalone one)."""
    if not isinstance(client, RedisCluster):
        return held_connections(client)
    pools = [client.get_redis_connection(n).connection_pool for n in client.get_nodes()]
    return [c for pool in pools for c in pool._in_use_connections]


@pytest.fixture(scope="module", params=["redis_cluster", "valkey_cluster"])
def probe(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, ScriptRegistry, RedisClusterServers]]:
    cluster: RedisClusterServers = request.getfixturevalue(request.param)
    scripts = _registry(tmp_path_factory.mktemp("leancluster"))
    client, _ = connect_sync(MemtierConfig.load(redis_url=cluster.url, redis=SETTINGS))
    for tag in range(TAGS):
        client.delete(_list_key(tag))
        client.rpush(_list_key(tag), "x")
    yield client, scripts, cluster
    for tag in range(TAGS):
        client.delete(_list_key(tag))
    client.close()


def test_the_lean_path_is_taken_on_a_plain_cluster_client(probe: Any) -> None:
    client, scripts, _ = probe
    lean, generic = _executor(client, scripts), _executor(client, scripts, lean=False)
    for tag in range(TAGS):
        assert lean.execute(_call(tag, "str", f"a{tag}")) == f"a{tag}".encode()
        assert generic.execute(_call(tag, "str", f"a{tag}")) == f"a{tag}".encode()
    assert (lean.lean_calls, generic.lean_calls) == (TAGS, 0)
    router = lean_cluster(client)
    assert isinstance(router, ClusterLean)
    for tag in range(TAGS):
        assert router.slot(_list_key(tag)) == key_slot(f"lean{tag}".encode())
    manager = client.nodes_manager
    owners = {manager.get_node_from_slot(router.slot(_list_key(t))).name for t in range(TAGS)}
    assert len(owners) == len(client.get_primaries())  # the keys reach every primary

    class Traced(RedisCluster):  # a subclass may hook execute_command: keep redis-py's path
        pass

    assert lean_cluster(Traced.__new__(Traced)) is None
    client.execute_command = client.execute_command  # an instance-level replacement
    try:
        assert lean_cluster(client) is None
    finally:
        del client.execute_command
    assert lean_cluster(client) is not None
    assert _in_use(client) == []


def test_the_slot_cache_is_bounded(probe: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import memtier.leancluster

    client = probe[0]
    monkeypatch.setattr(memtier.leancluster, "SLOT_CACHE_CEILING", 8)
    router = lean_cluster(client)
    assert router is not None
    for n in range(50):
        key = f"{{k{n}}}:x"
        assert router.slot(key) == key_slot(f"k{n}".encode())
        assert len(router._slots) <= 8


_TEXT = st.text(string.ascii_letters + string.digits + " _-", min_size=1, max_size=24)
_CALLS = st.one_of(
    st.tuples(st.just("int"), st.integers(-(2**53), 2**53).map(str)),
    st.tuples(st.sampled_from(["str", "status", "err", "memtier", "transient"]), _TEXT),
    st.tuples(st.just("nil")),
    st.lists(_TEXT, max_size=6).map(lambda items: ("arr", *items)),
    st.tuples(st.just("nested"), _TEXT, st.integers(-1000, 1000).map(str)),
    st.tuples(st.just("wrongtype")),
)


@pytest.fixture(scope="module")
def standalone(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A standalone lean executor: what TRYAGAIN must give on the lean cluster path."""
    scripts = _registry(tmp_path_factory.mktemp("leanstandalone"))
    client, _ = connect_sync(MemtierConfig.load(redis_url=redis_server.url, redis=SETTINGS))
    for tag in range(TAGS):
        client.delete(_list_key(tag))
        client.rpush(_list_key(tag), "x")
    yield _executor(client, scripts)
    client.close()


@settings(max_examples=60, deadline=None)
@given(call=_CALLS, tag=st.integers(0, TAGS - 1), flush_first=st.booleans())
@example(call=("transient", "x"), tag=0, flush_first=False)
@example(call=("memtier", "x"), tag=1, flush_first=True)
@example(call=("nil",), tag=2, flush_first=True)
@example(call=("wrongtype",), tag=3, flush_first=True)
def test_lean_and_generic_cluster_paths_give_the_same_replies_and_errors(
    probe: Any, standalone: SyncExecutor, call: tuple[str, ...], tag: int, flush_first: bool
) -> None:
    client, scripts, cluster = probe
    outcomes = []
    for lean in (True, False):
        executor = _executor(client, scripts, lean=lean)
        if flush_first:  # NOSCRIPT on the first send, on whichever node owns the slot
            cluster.script_flush()
        outcomes.append(_outcome(executor, _call(tag, *call)))
        assert executor.lean_calls == (outcomes[-1][-1][0] if lean else 0)
    if call[0] == "transient":  # the generic cluster path retries TRYAGAIN inside redis-py
        assert outcomes[0] == _outcome(standalone, _call(tag, *call))
        assert outcomes[0][0] == "error" and outcomes[0][-1] == [5]  # TESTING_MAX_ATTEMPTS
    else:
        assert outcomes[0] == outcomes[1]
    assert _in_use(client) == []


def test_a_stale_slot_map_is_redirected_once_and_runs_the_script_once(probe: Any) -> None:
    client, scripts, _ = probe
    executor = _executor(client, scripts)
    counter = "{leanmoved}:" + uuid.uuid4().hex
    try:
        assert executor.execute(ScriptCall("counter", (counter,), ())) == 1
        router = executor._lean_for(client)
        assert isinstance(router, ClusterLean)
        slot = router.slot(counter)
        manager = client.nodes_manager
        owner = manager.get_node_from_slot(slot)
        other = next(n for n in client.get_primaries() if n.name != owner.name)
        manager.slots_cache[slot] = [other]  # the client now believes another primary owns it
        redirects = router.redirects
        assert executor.execute(ScriptCall("counter", (counter,), ())) == 2  # ran once
        assert router.redirects == redirects + 1
        assert manager.get_node_from_slot(slot).name == owner.name  # redis-py patched its map
        assert executor.execute(ScriptCall("counter", (counter,), ())) == 3
        assert router.redirects == redirects + 1  # lean again, to the right node
        assert int(client.get(counter)) == 3
        assert _in_use(client) == []
    finally:
        client.delete(counter)


@pytest.mark.parametrize(
    "kind",
    [
        "cluster",
        pytest.param("valkey-cluster", marks=pytest.mark.valkey),
        pytest.param("valkey", marks=pytest.mark.valkey),
    ],
)
def test_a_store_on_a_cluster_or_valkey_takes_the_lean_path(
    request: pytest.FixtureRequest, kind: str
) -> None:
    from memtier import AvatarMessage, ConversationKey, ConversationStore

    fixture = {"cluster": "redis_cluster", "valkey-cluster": "valkey_cluster"}.get(
        kind, "valkey_server"
    )
    server = request.getfixturevalue(fixture)
    namespace = "t" + uuid.uuid4().hex[:10]
    config = MemtierConfig.load(redis_url=server.url, namespace=namespace, redis=SETTINGS)
    client, _ = connect_sync(config)
    try:
        store = ConversationStore(client, config)
        key = ConversationKey(str(uuid.uuid4()), "im")
        for n in range(3):
            store.append(key, AvatarMessage(text=f"hello lean {n}"))
        appended = store.executor.lean_calls
        assert appended >= 3
        context = store.context(key, limit=5)
        assert store.executor.lean_calls > appended
        dumped = context.model_dump_json()
        assert all(f"hello lean {n}" in dumped for n in range(3))
        assert dumped.index("hello lean 0") < dumped.index("hello lean 2")
        assert _in_use(client) == []
    finally:
        client.close()


def test_a_context_read_on_a_stale_slot_map_is_redirected_and_answers_once(
    redis_cluster: Any,
) -> None:
    """The lean read transaction (MULTI, context_head, LRANGE, EXEC) sent to a primary
    that does not own the slot: the EXEC aborts (MOVED while queueing, nothing ran), the
    transaction goes once through redis-py's ClusterPipeline, and the read answers."""
    from memtier import AvatarMessage, ConversationKey, ConversationStore

    namespace = "t" + uuid.uuid4().hex[:10]
    config = MemtierConfig.load(redis_url=redis_cluster.url, namespace=namespace, redis=SETTINGS)
    client, _ = connect_sync(config)
    try:
        store = ConversationStore(client, config)
        key = ConversationKey(str(uuid.uuid4()), "im")
        for n in range(3):
            store.append(key, AvatarMessage(text=f"moved {n}"))
        router = store.executor._lean_for(client)
        assert isinstance(router, ClusterLean)
        slot = router.slot(next(iter(router._slots)))  # the session's slot (one tag)
        manager = client.nodes_manager
        owner = manager.get_node_from_slot(slot)
        other = next(n for n in client.get_primaries() if n.name != owner.name)
        manager.slots_cache[slot] = [other]
        redirects = router.redirects
        turns = store.context(key, limit=5).turns
        assert [t.seq for t in turns] == [1, 2, 3]
        assert router.redirects > redirects
        assert [t.seq for t in store.context(key, limit=2).turns] == [2, 3]
        assert _in_use(client) == []
    finally:
        client.close()


REFRESH_INTERVAL_S = 0.4


class DeadPrimary:
    """A slot whose primary, in every slot map a refresh reads, is a port bound but not
    listening (the window before the cluster fails a dead primary over): every call on
    the slot is refused.  Counts the refreshes (``initialize`` calls) and their times;
    ``revive()`` lets the next refresh read the real owner again."""

    def __init__(self, client: RedisCluster, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        router = lean_cluster(client)
        assert isinstance(router, ClusterLean)
        self.router = router
        self.key = _list_key(0)
        self.slot = router.slot(self.key)
        self.manager = manager = client.nodes_manager
        self.owner = manager.get_node_from_slot(self.slot)
        host, port = self.sock.getsockname()
        self.gone = ClusterNode(host, port, PRIMARY, manager.create_redis_node(host, port))
        self.refreshes: list[float] = []
        self.failed_names: list[str | None] = []
        self._dead = True
        initialize = manager.initialize

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.refreshes.append(time.monotonic())
            self.failed_names.append(kwargs.get("last_failed_node_name"))
            result = initialize(*args, **kwargs)
            if self._dead:
                self._name_the_dead_primary()
            return result

        monkeypatch.setattr(manager, "initialize", counted)
        self._name_the_dead_primary()

    def _name_the_dead_primary(self) -> None:
        self.manager.nodes_cache[self.gone.name] = self.gone
        self.manager.slots_cache[self.slot] = [self.gone]

    def call(self) -> Any:
        return self.router.execute(self.slot, ("LLEN", self.key), [])

    def revive(self) -> None:
        self._dead = False

    def close(self) -> None:
        self.sock.close()


def _cluster_client(probe: Any) -> RedisCluster:
    _, _, cluster = probe
    return RedisCluster(
        host="127.0.0.1",
        port=cluster.ports[0],
        topology_refresh_min_interval=REFRESH_INTERVAL_S,
        socket_timeout=2.0,
        socket_connect_timeout=2.0,
    )


@pytest.mark.redis_py(PACED_REFRESH)
def test_connection_errors_ask_for_paced_refreshes_not_one_per_failed_call(
    probe: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = _cluster_client(probe)
    dead = DeadPrimary(client, monkeypatch)
    try:
        manager, refreshes = dead.manager, dead.refreshes
        # Calls keep failing for a little over three intervals.
        calls = 0
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < 3.2 * REFRESH_INTERVAL_S:
            with pytest.raises(RedisConnectionError):
                dead.call()
            calls += 1
            time.sleep(0.001)
        # A refresh runs once due (the requests are not lost) and no more than once per
        # interval: 3-4 in 3.2 intervals, not one per failed call.
        assert calls >= 20, calls  # well above the refreshes allowed: the bound means something
        assert (
            int(elapsed / REFRESH_INTERVAL_S) - 1
            <= len(refreshes)
            <= 2 + int(elapsed / REFRESH_INTERVAL_S)
        ), (len(refreshes), calls, elapsed)
        assert manager._refresh_requested  # the last failures' request is pending
        gaps = [b - a for a, b in itertools.pairwise(refreshes)]
        assert all(gap >= REFRESH_INTERVAL_S * 0.9 for gap in gaps), gaps

        # The primary is back in the topology: the pending request runs on the next call
        # once due, and that call goes to the slot's real owner.
        dead.revive()
        before = len(refreshes)
        time.sleep(REFRESH_INTERVAL_S * 1.5)
        assert dead.call() == 1
        assert len(refreshes) == before + 1
        assert manager.get_node_from_slot(dead.slot).name == dead.owner.name
        assert not manager._refresh_requested
    finally:
        dead.close()
        client.close()


def test_without_paced_refreshes_a_connection_error_re_reads_the_map_at_once(
    probe: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py before 8.2 has no paced refresh requests (leancluster's ``_PACED_PARTS``):
    there a connection error re-reads the slot map at once, with the failed node last,
    as redis-py's own cluster client did then.  CI runs redis-py 8.2 (and the floor run's
    6.3 never takes the lean Cluster path), so the older client is simulated here by
    turning the router's ``_paced`` off: the branch is what runs on redis-py 8.0-8.1."""
    client = _cluster_client(probe)
    dead = DeadPrimary(client, monkeypatch)
    try:
        dead.router._paced = False
        for calls in range(1, 6):
            with pytest.raises(RedisConnectionError):
                dead.call()
            assert len(dead.refreshes) == calls  # one refresh per failed call, at once
        assert dead.failed_names == [dead.gone.name] * 5  # the failed node last
        if hasattr(dead.manager, "_refresh_requested"):  # redis-py >= 8.2 underneath
            assert not dead.manager._refresh_requested  # nothing asked for: it ran at once
        dead.revive()
        with pytest.raises(RedisConnectionError):
            dead.call()  # this failure's refresh reads the real owner again ...
        assert dead.call() == 1  # ... so the next call reaches it
        assert dead.manager.get_node_from_slot(dead.slot).name == dead.owner.name
    finally:
        dead.close()
        client.close()
