"""Client construction, deadlines, back-pressure and the async life cycle (issue 16, issue 10).

* Every client memtier builds carries memtier's own socket/connect timeouts and pool size.
* A stalled server (``CLIENT PAUSE`` on a private server) hits the socket deadline: a
  typed, retryable ``outcome_unknown``, never a hang or a raw redis-py error.
* Back-pressure: callers beyond ``max_connections`` wait (bounded) instead of failing;
  a wait that times out is ``backend_busy``.  With one connection per node on the real
  client, 50 concurrent calls all succeed.
* The asyncio guard initialises a cluster client once, and again after redis-py marked
  its slot map stale.
"""

from __future__ import annotations

import asyncio
import re
import threading
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import redis.exceptions
from clusterrefresh import ask_refresh_and_wait_due
from redispy import PACED_REFRESH
from servers import running_server, unavailable

from memtier import (
    AsyncConversationService,
    AsyncConversationStore,
    AvatarMessage,
    BackendBusyError,
    BackendError,
    ConversationKey,
    ConversationStore,
    MemtierConfig,
    OutcomeUnknownError,
    Ownership,
    RedisConfig,
    create_conversation_service,
)
from memtier.aioleancluster import request_refresh
from memtier.connection import AsyncClientGuard, SyncClientGuard, connect_async, connect_sync

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
SETTINGS = {
    "max_connections": 7,
    "socket_timeout_seconds": 1.5,
    "connect_timeout_seconds": 0.5,
    "pool_timeout_seconds": 3.0,
}


def test_readme_redis_table_matches_the_bounds() -> None:
    rows = {
        name: (float(default), float(ceiling))
        for name, default, ceiling in re.findall(
            r"^\| `(\w+)` \| ([\d.]+) \| ([\d.]+) \|$", README, flags=re.MULTILINE
        )
    }
    for name, bound in RedisConfig.BOUNDS.items():
        assert rows.get(name) == (bound.default, bound.ceiling), name
    assert "MEMTIER_REDIS__MAX_CONNECTIONS" in README


def test_redis_settings_have_hard_ceilings() -> None:
    from memtier import ConfigurationError

    for name, bound in RedisConfig.BOUNDS.items():
        with pytest.raises(ConfigurationError, match=name):
            MemtierConfig.load(redis={name: bound.ceiling * 2 + 1})


def test_env_variable_sets_the_pool_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMTIER_REDIS__MAX_CONNECTIONS", "12")
    monkeypatch.setenv("MEMTIER_REDIS_URL", "redis://127.0.0.1:1/0")
    config = MemtierConfig.load()
    assert config.redis.max_connections == 12 and config.redis_url == "redis://127.0.0.1:1/0"


def test_standalone_clients_get_memtiers_deadlines_and_a_blocking_pool() -> None:
    config = MemtierConfig.load(redis_url="redis://127.0.0.1:1/0", redis=SETTINGS)
    sync_client, _ = connect_sync(config)
    async_client, _ = connect_async(config)
    try:
        for pool in (sync_client.connection_pool, async_client.connection_pool):
            # memtier's sync pool is a BlockingConnectionPool that takes back the lean
            # path's kept connections (tests/test_lean_connections.py).
            assert "BlockingConnectionPool" in [c.__name__ for c in type(pool).__mro__]
            assert pool.max_connections == 7 and pool.timeout == 3.0
            assert pool.connection_kwargs["socket_timeout"] == 1.5
            assert pool.connection_kwargs["socket_connect_timeout"] == 0.5
    finally:
        sync_client.close()


def test_async_cluster_client_gets_memtiers_deadlines_and_pool_size() -> None:
    config = MemtierConfig.load(redis_url="redis+cluster://127.0.0.1:1", redis=SETTINGS)
    client, _ = connect_async(config)  # no I/O until opened
    (node,) = client.nodes_manager.startup_nodes.values()
    assert node.max_connections == 7
    assert node.connection_kwargs["socket_timeout"] == 1.5
    assert node.connection_kwargs["socket_connect_timeout"] == 0.5


@pytest.mark.cluster
def test_sync_cluster_client_nodes_get_memtiers_deadlines(redis_cluster: Any) -> None:
    config = MemtierConfig.load(redis_url=redis_cluster.url, redis=SETTINGS)
    client, _ = connect_sync(config)
    try:
        nodes = client.get_nodes()
        assert len(nodes) >= redis_cluster.PRIMARIES  # replicas only with read_from_replicas
        for node in nodes:
            pool = node.redis_connection.connection_pool
            assert pool.max_connections == 7
            assert pool.connection_kwargs["socket_timeout"] == 1.5
            assert pool.connection_kwargs["socket_connect_timeout"] == 0.5
    finally:
        client.close()


def test_unreachable_sync_cluster_is_a_typed_error() -> None:
    from servers import free_ports

    (port,) = free_ports(1)
    config = MemtierConfig.load(
        redis_url=f"redis+cluster://127.0.0.1:{port}", redis={"connect_timeout_seconds": 0.5}
    )
    with pytest.raises(BackendError) as info:
        ConversationStore.from_config(config)
    assert info.value.__cause__ is not None


def test_unreachable_async_cluster_is_a_typed_error() -> None:
    from servers import free_ports

    (port,) = free_ports(1)
    config = MemtierConfig.load(
        redis_url=f"redis+cluster://127.0.0.1:{port}", redis={"connect_timeout_seconds": 0.5}
    )

    async def main() -> None:
        store = AsyncConversationStore.from_config(config)
        with pytest.raises(BackendError):
            await store.append(ConversationKey(str(uuid.uuid4()), "im"), AvatarMessage(text="x"))
        with pytest.raises(BackendError):
            await store.open()
        await store.close()

    asyncio.run(main())


# --- deadlines ---------------------------------------------------------------------------------


class _stall:  # used like a function: ``with _stall(server, ms):``
    """``CLIENT PAUSE <ms> ALL`` on our own server, acknowledged before the body runs: every
    other client's command waits (a stall past the socket timeout), then runs."""

    def __init__(self, server: Any, ms: int) -> None:
        self.server, self.ms = server, ms

    def __enter__(self) -> None:
        with self.server.client() as admin:
            assert admin.info("server")["process_id"] == self.server.pid  # our own server
            assert admin.execute_command("CLIENT", "PAUSE", self.ms, "ALL")

    def __exit__(self, *exc: object) -> None:
        with self.server.client() as admin:
            admin.execute_command("CLIENT", "UNPAUSE")


@pytest.mark.real
@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_stalled_server_hits_the_socket_deadline(api: str) -> None:
    """CLIENT PAUSE on a private server: each attempt times out after socket_timeout, and
    the append ends as outcome_unknown (retryable), never a hang or a raw error; the
    retry with the same turn id, once the server is back, stores it exactly once."""
    with running_server() as server:
        config = MemtierConfig.load(
            redis_url=server.url,
            namespace="stall",
            redis={"socket_timeout_seconds": 0.2, "retry_horizon_seconds": 0.5},
        )
        key = ConversationKey(str(uuid.uuid4()), "im")
        if api == "sync":
            with ConversationStore.from_config(config) as store:
                store.append(key, AvatarMessage(text="before", turn_id="t0"))  # warm
                with _stall(server, 3000), pytest.raises(OutcomeUnknownError) as info:
                    store.append(key, AvatarMessage(text="stalled", turn_id="t1"))
            error = info.value
        else:

            async def main() -> OutcomeUnknownError:
                async with AsyncConversationStore.from_config(config) as store:
                    await store.append(key, AvatarMessage(text="before", turn_id="t0"))
                    with _stall(server, 3000), pytest.raises(OutcomeUnknownError) as caught:
                        await store.append(key, AvatarMessage(text="stalled", turn_id="t1"))
                    return caught.value

            error = asyncio.run(main())
        assert error.retryable and error.code == "outcome_unknown"
        assert error.details["error_type"] == "TimeoutError"
        patient = MemtierConfig.load(redis_url=server.url, namespace="stall")
        with ConversationStore.from_config(patient) as store:  # default 5 s socket timeout
            again = store.append(key, AvatarMessage(text="stalled", turn_id="t1"))
            assert [t.seq for t in store.context(key).turns] == [1, 2] and again.seq == 2


# --- back-pressure -----------------------------------------------------------------------------


def test_sync_guard_waits_for_a_slot_then_reports_busy() -> None:
    guard = SyncClientGuard(RedisConfig(max_connections=2, pool_timeout_seconds=0.2))
    release = threading.Event()
    entered = threading.Barrier(3)

    def hold() -> str:
        entered.wait(30)
        assert release.wait(30)
        return "held"

    holders = [threading.Thread(target=guard.call, args=(hold,)) for _ in range(2)]
    for t in holders:
        t.start()
    entered.wait(30)  # both slots are taken
    with pytest.raises(BackendBusyError) as info:
        guard.call(lambda: "never")
    assert info.value.retryable and info.value.details["max_connections"] == 2
    waiter: list[str] = []
    late = threading.Thread(target=lambda: waiter.append(guard.call(lambda: "got a slot")))
    guard.timeout_s = 30.0  # the next caller waits long enough for a holder to finish
    late.start()
    release.set()
    late.join(30)
    for t in holders:
        t.join(30)
    assert waiter == ["got a slot"]


def test_async_guard_waits_for_a_slot_then_reports_busy() -> None:
    async def main() -> None:
        guard = AsyncClientGuard(
            _NoClient(), RedisConfig(max_connections=1, pool_timeout_seconds=0.1)
        )
        release = asyncio.Event()

        async def hold() -> str:
            await release.wait()
            return "held"

        holder = asyncio.create_task(guard.call(hold))
        await asyncio.sleep(0)
        with pytest.raises(BackendBusyError):
            await guard.call(_value("never"))
        guard.timeout_s = 30.0
        late = asyncio.create_task(guard.call(_value("got a slot")))
        await asyncio.sleep(0)
        release.set()
        assert await holder == "held" and await late == "got a slot"
        assert guard.opens == 1

    asyncio.run(main())


class _NoClient:
    async def aclose(self) -> None:
        return None


def _value(value: str) -> Any:
    async def fn() -> str:
        return value

    return fn


@pytest.mark.parametrize("api", ["sync", "async"])
def test_one_connection_per_node_still_serves_fifty_concurrent_calls(
    backend_no_fake: Any, api: str
) -> None:
    """Back-pressure on the real client: calls queue for the one connection, none fails
    (redis-py alone raises MaxConnectionsError on the cluster client)."""
    config = backend_no_fake.config(redis={"max_connections": 1, "pool_timeout_seconds": 60})
    key = ConversationKey(str(uuid.uuid4()), "im")
    if api == "sync":
        from concurrent.futures import ThreadPoolExecutor

        with ConversationStore.from_config(config) as store, ThreadPoolExecutor(16) as pool:
            receipts = list(
                pool.map(lambda i: store.append(key, AvatarMessage(text=f"t{i}")), range(50))
            )
    else:

        async def main() -> list[Any]:
            async with AsyncConversationStore.from_config(config) as store:
                return list(
                    await asyncio.gather(
                        *[store.append(key, AvatarMessage(text=f"t{i}")) for i in range(50)]
                    )
                )

        receipts = asyncio.run(main())
    assert sorted(r.seq for r in receipts) == list(range(1, 51))


# --- the asyncio life cycle --------------------------------------------------------------------


@pytest.mark.cluster
async def test_async_cluster_client_is_reopened_after_redis_py_marks_it_stale(
    redis_cluster: Any,
) -> None:
    config = MemtierConfig.load(redis_url=redis_cluster.url, namespace="t" + uuid.uuid4().hex[:8])
    store = await AsyncConversationStore.open(config)
    try:
        key = ConversationKey(str(uuid.uuid4()), "im")
        await store.append(key, AvatarMessage(text="one"))
        assert store.guard.opens == 1
        await ask_refresh_and_wait_due(store.client)  # as after a node failed
        receipts = await asyncio.gather(
            *[store.append(key, AvatarMessage(text=f"t{i}")) for i in range(20)]
        )
        assert store.guard.opens == 2  # one re-initialisation for 20 concurrent calls
        assert sorted(r.seq for r in receipts) == list(range(2, 22))
    finally:
        await store.close()


PACE_S = 4.0  # the refresh pacing of the test below's client


@pytest.mark.cluster
@pytest.mark.redis_py(PACED_REFRESH)
async def test_async_cluster_refresh_asked_for_before_it_is_due_takes_no_lock_per_call(
    redis_cluster: Any,
) -> None:
    """redis-py >= 8.2 paces the slot-map refreshes its error paths ask for: the flag
    stays set until the refresh is due.  Meanwhile calls run on the current map without
    re-opening the client (no guard lock, no initialize() per call); the first call once
    it is due re-reads the map, once.

    The client paces at PACE_S (redis-py's default is one second): the window between
    the first map read and the check that the refresh is not due yet must outlast a
    loaded machine's stalls (fresh-clone CI once took more than a second there)."""
    from redis.asyncio.cluster import RedisCluster

    config = MemtierConfig.load(redis_url=redis_cluster.url, namespace="t" + uuid.uuid4().hex[:8])
    try:
        client = RedisCluster.from_url(redis_cluster.node_url, topology_refresh_min_interval=PACE_S)
    except TypeError:  # no such argument: this redis-py does not pace refreshes
        unavailable("this redis-py does not pace slot-map refreshes (before 8.2)")
    store = AsyncConversationStore(client, config)
    await store.open()
    try:
        if not hasattr(store.client, "_initialize_due"):
            message = "this redis-py does not pace slot-map refreshes (before 8.2)"
            unavailable(message)  # CI installs the newest redis-py: there it must run
        key = ConversationKey(str(uuid.uuid4()), "im")
        await store.append(key, AvatarMessage(text="one"))
        request_refresh(store.client)  # right after the first map read: not due yet
        assert store.client._initialize is True and not store.client._initialize_due()
        first = await asyncio.gather(
            *[store.append(key, AvatarMessage(text=f"t{i}")) for i in range(20)]
        )
        assert store.guard.opens == 1
        await ask_refresh_and_wait_due(store.client)
        second = await asyncio.gather(
            *[store.append(key, AvatarMessage(text=f"u{i}")) for i in range(20)]
        )
        assert store.guard.opens == 2 and store.client._initialize is False
        assert sorted(r.seq for r in first + second) == list(range(2, 42))
    finally:
        await store.close()


async def test_async_service_life_cycle(backend: Any) -> None:
    owner = Ownership("acme", "life")
    async with AsyncConversationService(backend.async_client(), backend.config()) as service:
        assert service.guard.opens == 1
        created = await service.create(owner, title="t", request_id="r1")
    await service.open()  # reopens after aclose
    try:
        assert (await service.get(owner, created.id)).id == created.id
    finally:
        await service.aclose()


def _readme_block(heading: str) -> str:
    start = README.index(heading)
    match = re.search(r"```python\n(.*?)```", README[start:], flags=re.DOTALL)
    assert match is not None, heading
    return match.group(1)


def test_readme_async_life_cycle_example_runs(backend_no_fake: Any, capsys: Any) -> None:
    code = _readme_block("### The asyncio store's life cycle")
    url = backend_no_fake.url
    code = code.replace('"redis+cluster://127.0.0.1:7000"', repr(url))
    code = code.replace(
        "MemtierConfig.load(redis_url=",
        f'MemtierConfig.load(namespace="{backend_no_fake.namespace}", redis_url=',
    )
    exec(compile(code, "README.md", "exec"), {})
    assert capsys.readouterr().out.strip() == "200"


def test_sync_threads_service_is_guarded(backend: Any) -> None:
    with create_conversation_service(backend.config(redis={"max_connections": 3})) as service:
        assert service.guard.limit == 3
        service.create(Ownership("acme", "g"), title="x", request_id="r")


# --- slot-map refreshes asked for by the asyncio lean cluster path ---------------------------


class _PacedClient:
    """What memtier calls of a redis-py >= 8.2 asyncio cluster client's refresh request."""

    def __init__(self) -> None:
        self._initialize = False
        self.requests: list[dict[str, Any]] = []

    def _request_refresh(self, **named: Any) -> None:
        self.requests.append(named)
        self._initialize = True


class _FlagClient:
    """A redis-py < 8.2 asyncio cluster client: the flag is the request."""

    _initialize = False


@pytest.mark.parametrize("failed", [None, "127.0.0.1:7000"])
def test_a_refresh_is_asked_for_the_way_the_installed_redis_py_asks(failed: str | None) -> None:
    paced = _PacedClient()
    request_refresh(paced, failed)
    named = {} if failed is None else {"last_failed_node_name": failed}
    assert paced.requests == [named] and paced._initialize is True
    flag = _FlagClient()
    request_refresh(flag, failed)
    assert flag._initialize is True


def test_a_connection_error_on_a_node_is_handled_as_the_installed_redis_py_handles_it() -> None:
    """redis-py >= 8.2 marks the node's free connections (given the error) and asks for
    a paced refresh naming the node; before, it marked the in-use ones and set the flag.
    Either way the node goes last in the cached lists."""
    from memtier.aioleancluster import AsyncClusterLean

    marked: list[Any] = []
    moved: list[str] = []

    class Manager:
        def move_node_to_end_of_cached_nodes(self, name: str) -> None:
            moved.append(name)

    class NewNode:
        name = "127.0.0.1:7001"

        def _mark_free_connections_for_reconnect_on_error(self, exc: Exception) -> bool:
            marked.append(exc)
            return True

    class OldNode:
        name = "127.0.0.1:7002"

        def update_active_connections_for_reconnect(self) -> None:
            marked.append("active")

    error = redis.exceptions.ConnectionError("lost")
    paced = _PacedClient()
    paced.nodes_manager = Manager()  # type: ignore[attr-defined]
    AsyncClusterLean._failed(cast(Any, SimpleNamespace(client=paced)), NewNode(), error)
    assert marked == [error] and moved == [NewNode.name]
    assert paced.requests == [{"last_failed_node_name": NewNode.name}]
    flag = _FlagClient()
    flag.nodes_manager = Manager()  # type: ignore[attr-defined]
    AsyncClusterLean._failed(cast(Any, SimpleNamespace(client=flag)), OldNode(), error)
    assert marked == [error, "active"] and moved == [NewNode.name, OldNode.name]
    assert flag._initialize is True
