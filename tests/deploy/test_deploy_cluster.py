"""deploy/cluster: ``create-cluster.sh`` really creates a 3-primary + 3-replica cluster from
``node.conf.template``, and a worker runs with the compose environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import sys
from pathlib import Path

import redis
from deployhelpers import (
    CLUSTER_SCRIPT,
    DEPLOY,
    ROOT,
    distinct_free_ports,
    load_yaml_docs,
    run,
    server_command,
    server_config,
    wait_until,
)
from servers import HOST, RedisServer, require_real_redis


def test_create_cluster_script_syntax() -> None:
    result = run(["bash", "-n", str(CLUSTER_SCRIPT)])
    assert result.returncode == 0, result.stderr
    assert os.access(CLUSTER_SCRIPT, os.X_OK), "create-cluster.sh must be executable"
    shellcheck = shutil.which("shellcheck")  # an extra lint where installed (Debian: shellcheck)
    if shellcheck is not None:
        result = run([shellcheck, str(CLUSTER_SCRIPT)])
        assert result.returncode == 0, result.stdout


def _cluster_logs(data: Path) -> str:
    return "\n".join(
        f"--- {log.parent.name}:\n{log.read_text(errors='replace')[-1500:]}"
        for log in sorted(data.glob("*/redis.log"))
    )


def _running(pid: int) -> bool:
    """True while ``pid`` runs (a zombie left for init to reap has stopped)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


CLUSTER_PORT_ATTEMPTS = 3  # another process may take a probed-free port before a node binds it


def _kill_processes_under(root: Path) -> None:
    """Last resort: SIGKILL every process whose working directory is under ``root``."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if cwd.startswith(str(root)):
            with contextlib.suppress(OSError):
                os.kill(int(proc.name), signal.SIGKILL)


def test_create_cluster_script_starts_and_stops_a_cluster(tmp_path: Path) -> None:
    """The script's own start and stop, checked; a node that outlives them is killed."""
    try:
        _create_cluster_script_starts_and_stops_a_cluster(tmp_path)
    finally:
        _kill_processes_under(tmp_path)


def _create_cluster_script_starts_and_stops_a_cluster(tmp_path: Path) -> None:
    require_real_redis("redis-server", "redis-cli")
    for attempt in range(CLUSTER_PORT_ATTEMPTS):
        ports = distinct_free_ports(6, bus=True)
        data = tmp_path / f"cluster-{attempt}"
        cmd = ["bash", str(CLUSTER_SCRIPT), "start", "-d", str(data), "-H", HOST]
        start = run([*cmd, *map(str, ports)], timeout=300)
        if start.returncode == 0 or "Address already in use" not in _cluster_logs(data):
            break
        run(["bash", str(CLUSTER_SCRIPT), "stop", "-d", str(data)], timeout=120)
    pids: list[int] = []
    try:
        assert start.returncode == 0, f"{start.stdout}\n{start.stderr}\n{_cluster_logs(data)}"
        assert f"redis+cluster://{HOST}:{ports[0]}" in start.stdout
        pids = [int((data / str(port) / "redis.pid").read_text()) for port in ports]
        node = redis.Redis(host=HOST, port=ports[0], socket_timeout=5, decode_responses=True)
        info = server_command(node, "CLUSTER", "INFO")
        nodes = server_command(node, "CLUSTER", "NODES")
        node.close()
        assert "cluster_state:ok" in info and "cluster_size:3" in info, info
        roles = [line.split()[2] for line in nodes.splitlines()]
        assert sum("master" in r for r in roles) == 3, nodes
        assert sum("slave" in r for r in roles) == 3, nodes
        for port in ports:
            client = redis.Redis(host=HOST, port=port, socket_timeout=5, decode_responses=True)
            config = server_config(client)
            client.close()
            assert config["maxmemory-policy"] == "noeviction", port
            assert config["appendonly"] == "yes", port
            assert config["cluster-require-full-coverage"] == "no", port
            assert config["cluster-allow-reads-when-down"] == "no", port
            assert config["cluster-node-timeout"] == "5000", port
        # memtier's own cluster client, from the URL the script prints.
        from memtier.config import MemtierConfig
        from memtier.connection import connect_sync

        client, embedded = connect_sync(
            MemtierConfig(redis_url=f"redis+cluster://{HOST}:{ports[0]}")
        )
        assert not embedded
        keys = ["{memtier:o:t1:u1}:a", "{memtier:o:t1:u1}:b"]  # one hash tag: one slot
        script = "redis.call('SET', KEYS[1], 1); return redis.call('INCR', KEYS[2])"
        assert client.eval(script, 2, *keys) == 1
        client.close()
    finally:
        stop = run(["bash", str(CLUSTER_SCRIPT), "stop", "-d", str(data)], timeout=120)
    assert stop.returncode == 0, f"{stop.stdout}\n{stop.stderr}"
    # Redis removes its pid file (what `stop` waits for) just before it exits.
    wait_until("every node to exit", lambda: not any(_running(pid) for pid in pids), 30)


def test_worker_runs_with_the_compose_environment(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """`memtier worker` as docker-compose.yml starts it (env, persistence on) on a real Redis."""
    (compose,) = load_yaml_docs(DEPLOY / "docker-compose.yml")
    service = compose["services"]["memtier-worker"]
    storage = tmp_path / "snapshots"
    storage.mkdir(mode=0o700)
    env = dict(os.environ)
    env.update({k: str(v) for k, v in service["environment"].items()})
    assert env["MEMTIER_CONVERSATION__PERSISTENCE_ENABLED"] == "true"
    # This machine's Redis, a private namespace, and tmp_path for the container's volumes.
    env.update(
        MEMTIER_REDIS_URL=redis_server.url,
        MEMTIER_NAMESPACE="deploy" + secrets.token_hex(4),
        MEMTIER_CONVERSATION__STORAGE_PATH=str(storage),
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path),
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    cmd = [sys.executable, "-m", "memtier", *service["command"], "--drain", "--deadline", "60"]
    result = run(cmd, timeout=180, env=env)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    stats = json.loads(result.stdout.strip().splitlines()[-1])
    assert stats["failed"] == 0 and stats["flush_errors"] == 0, stats
    snapshots = storage / "conversations"
    assert snapshots.is_dir(), "persistence on: the worker owns <storage_path>/conversations"
    assert snapshots.stat().st_mode & 0o777 == 0o700
