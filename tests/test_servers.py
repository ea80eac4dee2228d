"""The test fixtures themselves: real servers come up, behave, and go away."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster
from servers import (
    ALLOW_SKIP_ENV,
    Backend,
    RedisClusterServers,
    RedisServer,
    ValkeyClusterServers,
    pid_alive,
    unavailable,
)

import memtier.retry
from memtier.config import MemtierConfig, parse_redis_url

# --------------------------------------------------------------------- standalone


@pytest.mark.real
def test_standalone_ping_set_get(redis_server: RedisServer) -> None:
    assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"
    client = redis.Redis.from_url(redis_server.url)
    try:
        assert client.ping() is True
        assert client.set("t-servers:key", b"value") is True
        assert client.get("t-servers:key") == b"value"
        client.delete("t-servers:key")
    finally:
        client.close()


@pytest.mark.real
def test_standalone_listens_on_loopback_only(redis_server: RedisServer) -> None:
    with redis_server.client() as client:
        bind = client.config_get("bind")["bind"]
    assert bind.split() == ["127.0.0.1"]


@pytest.mark.real
def test_restart_keeps_port_and_wipes_data_and_scripts() -> None:
    with RedisServer() as server:
        port, pid_before = server.port, server.pid
        with server.client() as client:
            client.set("k", "v")
            sha = client.script_load("return 1")
        server.restart()
        assert server.port == port
        assert server.pid != pid_before
        assert pid_before is not None and not pid_alive(pid_before)
        with server.client() as client:
            assert client.ping() is True
            assert client.get("k") is None  # no persistence: a restart is a wipe
            assert client.script_exists(sha) == [False]


@pytest.mark.real
def test_standalone_stop_leaves_no_process() -> None:
    server = RedisServer().start()
    pid, port = server.pid, server.port
    assert pid is not None and pid_alive(pid)
    server.stop()
    assert not pid_alive(pid)
    with pytest.raises(redis.ConnectionError), server.client() as client:
        client.ping()
    # the port is free again
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))


@pytest.mark.real
def test_flushall_empties_standalone(redis_server: RedisServer) -> None:
    with redis_server.client() as client:
        client.set("t-servers:flush", "1")
        redis_server.flushall()
        assert client.dbsize() == 0


@pytest.mark.real
def test_killed_pytest_does_not_leave_redis_behind(tmp_path: Path) -> None:
    """A hard-killed test process takes its servers with it (PR_SET_PDEATHSIG)."""
    tests_dir = Path(__file__).resolve().parent
    script = tmp_path / "child.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, signal, sys
            sys.path.insert(0, {str(tests_dir)!r})
            from servers import RedisServer
            server = RedisServer().start()
            print(server.pid, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
            """
        ),
        encoding="utf-8",
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # its server's directory stays in tmp_path
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, timeout=120, env=env, check=False
    )
    assert done.returncode == -9, done.stderr.decode()
    pid = int(done.stdout.split()[0])
    # The kernel delivers SIGTERM at once; redis exits within its shutdown time.
    # Wait for that by polling /proc rather than asserting a duration.
    for _ in range(1200):
        if not pid_alive(pid) or _is_zombie(pid):
            break
        time.sleep(0.05)
    assert not pid_alive(pid) or _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


# --------------------------------------------------------------------- cluster


@pytest.mark.cluster
def test_cluster_is_ok_with_three_primaries_and_replicas(
    redis_cluster: RedisClusterServers,
) -> None:
    assert redis_cluster.url.startswith("redis+cluster://127.0.0.1:")
    assert len(redis_cluster.startup_nodes) == 6
    assert len(redis_cluster.primaries()) == 3
    for host, port in redis_cluster.startup_nodes:
        assert host == "127.0.0.1"
        with redis_cluster.node_client(port) as node:
            info = node.cluster("info")
            assert info["cluster_state"] == "ok"
            assert int(info["cluster_slots_assigned"]) == 16384
            assert int(info["cluster_known_nodes"]) == 6


@pytest.mark.cluster
def test_cluster_url_is_memtiers_scheme(redis_cluster: RedisClusterServers) -> None:
    is_cluster, plain = parse_redis_url(redis_cluster.url)
    assert is_cluster is True
    assert plain == redis_cluster.node_url
    assert MemtierConfig.load(redis_url=redis_cluster.url).redis_url == redis_cluster.url


@pytest.mark.cluster
def test_cluster_spreads_hash_tags_over_primaries(redis_cluster: RedisClusterServers) -> None:
    client = RedisCluster.from_url(redis_cluster.node_url)
    try:
        owners = set()
        for i in range(64):
            key = f"{{t-servers-spread:{i}}}:k"
            client.set(key, i)
            owners.add(client.get_node_from_key(key).port)  # type: ignore[no-untyped-call]
        assert owners == set(redis_cluster.primaries())
        for i in range(64):
            client.delete(f"{{t-servers-spread:{i}}}:k")
    finally:
        client.close()


@pytest.mark.cluster
def test_cluster_runs_script_whose_keys_share_a_tag(redis_cluster: RedisClusterServers) -> None:
    client = RedisCluster.from_url(redis_cluster.node_url)
    try:
        keys = ["{t-servers-tag}:a", "{t-servers-tag}:b"]
        script = (
            "redis.call('SET', KEYS[1], ARGV[1]); redis.call('SET', KEYS[2], ARGV[1]);"
            " return redis.call('MGET', KEYS[1], KEYS[2])"
        )
        assert client.eval(script, 2, *keys, "x") == [b"x", b"x"]
        client.delete(*keys)
        # Keys of different slots are refused by the server: a real cluster, not one node.
        with (
            redis_cluster.node_client(redis_cluster.port) as node,
            pytest.raises(redis.ResponseError, match="same slot"),
        ):
            node.eval(script, 2, "{t-servers-a}:k", "{t-servers-b}:k", "x")
    finally:
        client.close()


@pytest.mark.cluster
def test_cluster_flushall_empties_every_primary(redis_cluster: RedisClusterServers) -> None:
    client = RedisCluster.from_url(redis_cluster.node_url)
    try:
        for i in range(16):
            client.set(f"{{t-servers-flush:{i}}}", i)
        redis_cluster.flushall()
        for port in redis_cluster.primaries():
            with redis_cluster.node_client(port) as node:
                assert node.dbsize() == 0
    finally:
        client.close()


@pytest.mark.cluster
@pytest.mark.slow
def test_cluster_stop_leaves_no_process() -> None:
    cluster = RedisClusterServers().start()
    pids = cluster.pids
    assert len(pids) == 6 and all(pid_alive(pid) for pid in pids)
    cluster.stop()
    assert [pid for pid in pids if pid_alive(pid)] == []


# --------------------------------------------------------------------- backend fixture


def test_retry_testing_switch_is_on() -> None:
    assert memtier.retry._testing is True


def test_backend_basics(backend: Backend) -> None:
    assert backend.kind in {"fake", "real", "cluster", "valkey", "valkey-cluster"}
    assert backend.namespace.startswith("t") and len(backend.namespace) == 11
    client = backend.sync_client()
    key = "{" + backend.namespace + ":m:0}:s:x"
    client.set(key, "1")
    assert client.get(key) == b"1"
    config = backend.config(partitions=3)
    assert config.namespace == backend.namespace
    assert config.partitions == 3
    assert config.redis_url == backend.url
    if backend.kind == "fake":
        assert backend.url is None
    elif backend.kind in ("real", "valkey"):
        assert backend.url is not None and backend.url.startswith("redis://")
    else:
        assert backend.url is not None and backend.url.startswith("redis+cluster://")


async def test_backend_async_client(backend: Backend) -> None:
    client = backend.async_client()
    key = "{" + backend.namespace + ":m:1}:s:y"
    await client.set(key, "2")
    assert await client.get(key) == b"2"
    # a sync client of the same backend sees the same data
    assert backend.sync_client().get(key) == b"2"


@pytest.mark.real
async def test_backend_teardown_deletes_only_its_namespace(redis_server: RedisServer) -> None:
    from servers import Backend as B

    mine = B("real", namespace="tmine000000", url=redis_server.url, node_url=redis_server.url)
    theirs = "{tother00000:m:0}:s:keep"
    client = mine.sync_client()
    for i in range(1200):  # more than one delete batch
        client.set("{tmine000000:m:" + str(i) + "}:s:x", i)
    client.set(theirs, "1")
    await mine.aclose()
    with redis_server.client() as check:
        assert list(check.scan_iter(match="*tmine000000*")) == []
        assert check.get(theirs) == b"1"
        check.delete(theirs)


@pytest.mark.cluster
async def test_cluster_backend_teardown_deletes_on_every_primary(
    redis_cluster: RedisClusterServers,
) -> None:
    from servers import Backend as B

    mine = B(
        "cluster", namespace="tclu0000000", url=redis_cluster.url, node_url=redis_cluster.node_url
    )
    client = mine.sync_client()
    for i in range(64):
        client.set("{tclu0000000:m:" + str(i) + "}:s:x", i)
    await mine.aclose()
    for port in redis_cluster.primaries():
        with redis_cluster.node_client(port) as node:
            assert list(node.scan_iter(match="*tclu0000000*")) == []


@pytest.mark.parametrize("opt_in", [False, True])
@pytest.mark.parametrize("ci", ["", "true"])
@pytest.mark.parametrize("allow", ["", "1"])
def test_unavailable_fails_under_ci_and_skips_only_as_allowed(
    monkeypatch: pytest.MonkeyPatch, ci: str, allow: str, opt_in: bool
) -> None:
    """The one decision every "this machine lacks X" site calls: CI always fails; locally
    a plain requirement skips, and an opt-in one (a real Redis) skips only with
    MEMTIER_ALLOW_SKIP_REAL=1."""
    monkeypatch.setenv("CI", ci)
    monkeypatch.setenv(ALLOW_SKIP_ENV, allow)
    skips = not ci and (allow == "1" or not opt_in)
    expected = pytest.skip.Exception if skips else pytest.fail.Exception
    with pytest.raises(expected) as raised:
        unavailable("no widget here", skip_needs_opt_in=opt_in)
    assert "no widget here" in str(raised.value)
    if ci:
        assert "never skipped" in str(raised.value)


def test_missing_redis_fails_under_ci(tmp_path: Path) -> None:
    """With CI set and no redis-server on PATH, a test needing Redis FAILS (never skips)."""
    result = _run_inner_pytest(tmp_path, {"CI": "true", "MEMTIER_ALLOW_SKIP_REAL": "1"})
    assert "1 error" in result or "1 failed" in result, result
    assert re.search(r"\d+ skipped", result) is None, result
    assert "redis-server not found" in result


def test_missing_redis_skips_only_when_allowed_locally(tmp_path: Path) -> None:
    result = _run_inner_pytest(tmp_path, {"CI": "", "MEMTIER_ALLOW_SKIP_REAL": "1"})
    assert "1 skipped" in result, result
    result = _run_inner_pytest(tmp_path, {"CI": "", "MEMTIER_ALLOW_SKIP_REAL": ""})
    assert "1 error" in result or "1 failed" in result, result
    assert "MEMTIER_ALLOW_SKIP_REAL=1" in result


def _run_inner_pytest(tmp_path: Path, env_overrides: dict[str, str]) -> str:
    """Run one tiny test using ``redis_server`` with an empty PATH (no redis binaries)."""
    tests_dir = Path(__file__).resolve().parent
    inner = tmp_path / "inner"
    inner.mkdir(exist_ok=True)
    # conftest and every local module it imports
    for name in ("conftest.py", "servers.py", "localmodules.py", "redispy.py"):
        (inner / name).write_text((tests_dir / name).read_text(), encoding="utf-8")
    (inner / "test_needs_redis.py").write_text(
        "def test_needs_redis(redis_server):\n    assert redis_server\n", encoding="utf-8"
    )
    empty_bin = tmp_path / "empty-bin"
    empty_bin.mkdir(exist_ok=True)
    env = {**os.environ, "PATH": str(empty_bin), **env_overrides}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", str(inner)],
        capture_output=True,
        timeout=300,
        env=env,
        cwd=inner,
        check=False,
    )
    return (done.stdout + done.stderr).decode("utf-8", "replace")


# --------------------------------------------------------------------- Valkey


def test_backend_server_is_the_program_its_kind_names(backend: Backend) -> None:
    """``valkey*`` backends really are Valkey 9 (INFO server), the others are not."""
    if backend.is_fake:
        return
    info = backend.sync_client().info("server")
    if backend.is_cluster:  # RedisCluster.info merges per node: {node: info} or flat
        values = list(info.values())
        info = values[0] if values and isinstance(values[0], dict) else info
    if backend.kind.startswith("valkey"):
        assert str(info.get("server_name")) == "valkey"
        assert str(info["valkey_version"]).startswith("9.")
    else:
        assert "server_name" not in info or str(info["server_name"]) == "redis"


@pytest.mark.valkey
def test_valkey_cluster_has_three_primaries_owning_every_slot(
    valkey_cluster: ValkeyClusterServers,
) -> None:
    assert len(valkey_cluster.primaries()) == 3
    with valkey_cluster.node_client(valkey_cluster.port) as node:
        info = node.execute_command("CLUSTER", "INFO")
    text = info.decode() if isinstance(info, bytes) else str(info)
    assert "cluster_state:ok" in text and "cluster_slots_assigned:16384" in text


# --------------------------------------------------------------------- one module, two names


def test_bench_and_tests_share_one_servers_module() -> None:
    """bench/ imports ``tests.servers``, the tests ``servers``: one module object (conftest
    aliases it), so one registry of live servers and one RedisUnavailableError class."""
    import importlib

    import servers

    import bench.server

    assert importlib.import_module("tests.servers") is servers
    assert bench.server.RedisUnavailableError is servers.RedisUnavailableError
