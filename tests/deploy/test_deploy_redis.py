"""deploy/redis.conf (as is, and with the overrides of the compose file and of the Kubernetes
StatefulSet) is started by the real ``redis-server``.
"""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path

import pytest
import redis
from deployhelpers import (
    DEPLOY,
    START_TIMEOUT_S,
    Proc,
    free_port,
    k8s_container,
    load_yaml_docs,
    server_config,
    wait_until,
)
from servers import HOST, require_real_redis


def _redis_variants() -> dict[str, list[str]]:
    """Command-line overrides after deploy/redis.conf: as shipped, as compose, as Kubernetes."""
    (compose,) = load_yaml_docs(DEPLOY / "docker-compose.yml")
    compose_args = compose["services"]["redis"]["command"][2:]
    k8s_args = k8s_container("memtier-redis")["args"][1:]
    return {"plain": [], "compose": list(compose_args), "kubernetes": list(k8s_args)}


@pytest.mark.parametrize("variant", ["plain", "compose", "kubernetes"])
def test_redis_conf_is_accepted_by_redis_server(variant: str, tmp_path: Path) -> None:
    require_real_redis("redis-server")
    overrides = _redis_variants()[variant]
    password = secrets.token_hex(16)
    auth = tmp_path / "auth.conf"
    auth.write_text(f"requirepass {password}\n")
    args: list[str] = []
    it = iter(overrides)
    for arg in it:
        if arg in ("--bind", "--dir", "--include"):
            value = next(it)
            # Never listen beyond loopback; data and the password file in tmp_path.
            value = {"--bind": HOST, "--dir": str(tmp_path), "--include": str(auth)}[arg]
            args += [arg, value]
        else:
            args.append(arg)
    port = free_port()
    cmd = [
        shutil.which("redis-server") or "redis-server",
        str(DEPLOY / "redis.conf"),
        *args,
        "--port",
        str(port),
        "--dir",
        str(tmp_path),
    ]
    proc = Proc("redis-server", cmd, tmp_path / "redis.log")
    uses_auth = "--include" in overrides
    client = redis.Redis(
        host=HOST,
        port=port,
        password=password if uses_auth else None,
        socket_timeout=5,
        decode_responses=True,
    )
    try:
        wait_until("redis-server to answer PING", client.ping, START_TIMEOUT_S, proc)
        config = server_config(client)
        assert config["maxmemory-policy"] == "noeviction"
        assert config["appendonly"] == "yes"
        assert config["appendfsync"] == "everysec"
        assert config["aof-use-rdb-preamble"] == "yes"
        assert config["save"], "RDB snapshots are the second line"
        assert int(config["maxmemory"]) > 0, "maxmemory must be set"
        assert config["lazyfree-lazy-user-del"] == "yes"
        assert int(config["latency-monitor-threshold"]) > 0
        assert config["dir"] == str(tmp_path)
        if variant == "plain":
            assert config["bind"].split()[0] == "127.0.0.1", "loopback by default"
            assert config["protected-mode"] == "yes"
        if variant == "kubernetes":
            assert int(config["maxmemory"]) == 1536 * 1024 * 1024
            assert config["protected-mode"] == "yes"
            anonymous = redis.Redis(host=HOST, port=port, socket_timeout=5)
            with pytest.raises(redis.AuthenticationError):
                anonymous.ping()
            anonymous.close()
        # Writes work and land in the AOF directory.
        assert client.set("{memtier:m:0}:probe", "1")
        assert (tmp_path / config["appenddirname"]).is_dir()
        client.shutdown(nosave=True)  # redis-py treats the closed connection as success
    finally:
        client.close()
        proc.stop()
