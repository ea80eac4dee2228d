"""``memtier serve``: options, API keys, health/readiness, metrics, runners -- as a real process."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from httphelpers import serve_process
from servers import HOST, RedisClusterServers, RedisServer, find_binary, free_ports
from starlette.requests import Request

from memtier.errors import ConfigurationError
from memtier.threads.apikeys import ApiKeys, token_digest
from memtier.threads.models import Ownership
from memtier.threads.serve import main

BASE = "/memtier/conversations"


def _keys_file(tmp_path: Path, entries: list[tuple[str, str, str]]) -> Path:
    lines = []
    for token, tenant, user in entries:
        digest = hashlib.sha256(token.encode()).hexdigest()
        lines.append(f'[[keys]]\nsha256 = "{digest}"\ntenant = "{tenant}"\nuser = "{user}"\n')
    path = tmp_path / "api-keys.toml"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


# --- refusals (in-process, before anything listens) ----------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "refusing to start without authentication"),
        (["--insecure-dev-auth", "--api-keys", "k.toml"], "not both"),
        (["--insecure-dev-auth", "--host", "0.0.0.0"], "only binds loopback"),
        (["--insecure-dev-auth", "--runner", "nodots"], "package.module:factory"),
        (["--insecure-dev-auth", "--runner", "no_such_module_xyz:make"], "no_such_module_xyz"),
        (["--insecure-dev-auth", "--workers", "2"], "needs a Redis URL"),
        (["--insecure-dev-auth", "--redis-url", "http://x"], "unknown Redis URL scheme"),
        (["--api-keys", "/nonexistent/keys.toml"], "cannot read API-keys file"),
    ],
)
def test_serve_refuses_bad_options(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    monkeypatch.delenv("MEMTIER_REDIS_URL", raising=False)
    assert main(args) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[keys]]\ntoken = "plain"\ntenant = "t"\nuser = "u"\n', "plaintext token"),
        ('[[keys]]\nsha256 = "abc"\ntenant = "t"\nuser = "u"\n', "64 hex digits"),
        (f'[[keys]]\nsha256 = "{"a" * 64}"\ntenant = "t"\n', "tenant and user"),
        (f'[[keys]]\nsha256 = "{"a" * 64}"\ntenant = "t:x"\nuser = "u"\n', "ownership"),
        (f'[[keys]]\nsha256 = "{"a" * 64}"\ntenant = "t"\nuser = "u"\nrole = "x"\n', "unknown"),
        (
            f'[[keys]]\nsha256 = "{"a" * 64}"\ntenant = "t"\nuser = "u"\n'
            f'[[keys]]\nsha256 = "{"A" * 64}"\ntenant = "t"\nuser = "v"\n',
            "duplicate",
        ),
        ("", "no [[keys]]"),
        ("title = 1\n", "only [[keys]]"),
        ("[[keys]\n", "cannot read"),
    ],
)
def test_api_keys_file_is_validated(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigurationError) as info:
        ApiKeys.load(path)
    assert message in info.value.message


def _request(headers: dict[str, str]) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "GET", "path": "/", "headers": raw})


def test_api_keys_authorize_bearer_tokens_by_digest(tmp_path: Path) -> None:
    keys = ApiKeys.load(
        _keys_file(tmp_path, [("tok-a", "acme", "alice"), ("tok-b", "acme", "bob")])
    )
    assert keys.authorize(_request({"Authorization": "Bearer tok-a"})) == Ownership("acme", "alice")
    assert keys.authorize(_request({"Authorization": "bearer  tok-b"})) == Ownership("acme", "bob")
    for header in ["", "Bearer", "Bearer wrong", "Basic tok-a", "tok-a", "Bearer " + "x" * 5000]:
        assert keys.authorize(_request({"Authorization": header} if header else {})) is None
    assert token_digest("tok-a") == hashlib.sha256(b"tok-a").hexdigest()
    assert "tok-a" not in (tmp_path / "api-keys.toml").read_text()


# --- the real process ----------------------------------------------------------------------------


def test_serve_with_api_keys_on_real_redis(tmp_path: Path, redis_server: RedisServer) -> None:
    keys = _keys_file(tmp_path, [("alice-secret", "acme", "alice"), ("bob-secret", "acme", "bob")])
    alice = {"Authorization": "Bearer alice-secret"}
    bob = {"Authorization": "Bearer bob-secret"}
    env = {"MEMTIER_NAMESPACE": "serve" + str(time.monotonic_ns())[-8:]}
    args = ["--redis-url", redis_server.url, "--api-keys", str(keys)]
    with serve_process(args, tmp_path, env=env) as serve, httpx.Client(timeout=60) as c:
        health = c.get(serve.url + "/healthz").json()
        assert health == {"status": "ok", "embedded": False, "insecureDevAuth": False}
        serve.wait_status("/readyz", 200)
        assert c.get(serve.url + BASE).status_code == 401
        assert c.get(serve.url + BASE, headers={"Authorization": "Bearer nope"}).status_code == 401
        created = c.post(serve.url + BASE, json={"title": "served"}, headers=alice)
        assert created.status_code == 201 and created.json()["userId"] == "alice"
        tid = created.json()["id"]
        turn = c.post(f"{serve.url}{BASE}/{tid}/continue", json={"message": "hi"}, headers=alice)
        assert turn.json()["entries"][1]["content"] == "echo (0 earlier entries): hi"
        wrong = c.get(f"{serve.url}{BASE}/{tid}", headers=bob)
        missing = c.get(f"{serve.url}{BASE}/conv_none", headers=bob)
        assert wrong.status_code == 404 and wrong.content == missing.content
        openapi = c.get(serve.url + BASE + "/openapi.json")
        assert openapi.status_code == 200 and BASE in openapi.json()["paths"]
        metrics = c.get(serve.url + "/metrics")
        assert metrics.status_code == 200
        assert 'memtier_thread_operations_total{operation="create",outcome="ok"} 1.0' in (
            metrics.text
        )
        assert "memtier_thread_runner_duration_seconds_count" in metrics.text
        assert 'operation="get",outcome="not_found"' in metrics.text
    assert "alice-secret" not in serve.log()


def test_serve_embedded_with_insecure_dev_auth_says_so(tmp_path: Path) -> None:
    with serve_process(["--insecure-dev-auth"], tmp_path) as serve, httpx.Client() as c:
        assert c.get(serve.url + "/healthz").json()["embedded"] is True
        serve.wait_status("/readyz", 200)
        created = c.post(serve.url + BASE, json={"title": "dev"})  # no credentials at all
        assert created.status_code == 201
        assert (created.json()["tenantId"], created.json()["userId"]) == ("dev", "dev")
    log = serve.log()
    assert "INSECURE DEVELOPMENT AUTHENTICATION" in log
    assert "embedded in-process Redis" in log
    # It served on the socket the test bound and handed down (serve_process: --fd).
    assert f"listening on {serve.url} (--fd " in log


@pytest.mark.parametrize(
    ("make", "extra", "message"),
    [
        ("file", [], "is not a socket"),
        ("udp", [], "is not a TCP socket"),
        ("any_address", [], "only binds loopback addresses, not '0.0.0.0'"),
        ("loopback", ["--workers", "2"], "--fd serves in one process"),
    ],
)
def test_serve_refuses_an_unfit_inherited_socket(
    make: str,
    extra: list[str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: Any,
) -> None:
    import socket

    monkeypatch.delenv("MEMTIER_REDIS_URL", raising=False)
    handle: Any
    if make == "file":
        handle = open(tmp_path / "not-a-socket", "wb")  # noqa: SIM115 - closed below
    elif make == "udp":
        handle = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        handle.bind((HOST, 0))
    else:  # bound, never listening: nothing can connect to it
        handle = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        handle.bind(("0.0.0.0" if make == "any_address" else HOST, 0))
    try:
        assert main(["--insecure-dev-auth", "--fd", str(handle.fileno()), *extra]) == 2
        assert message in capsys.readouterr().err
        os.fstat(handle.fileno())  # refused, and left open: the descriptor is the caller's
    finally:
        handle.close()


def test_serve_loads_a_host_runner(tmp_path: Path) -> None:
    (tmp_path / "hostrunner.py").write_text(
        "from memtier.threads import RunnerEvent, RunnerReply\n"
        "class Shouter:\n"
        "    async def __call__(self, turn):\n"
        "        await turn.emit(RunnerEvent('host.step', {'ok': True}))\n"
        "        return RunnerReply(turn.message.upper())\n"
        "def make():\n"
        "    return Shouter()\n",
        encoding="utf-8",
    )
    args = ["--insecure-dev-auth", "--runner", "hostrunner:make", "--base-path", "/api/threads"]
    with serve_process(args, tmp_path) as serve, httpx.Client() as c:
        tid = c.post(serve.url + "/api/threads", json={}).json()["id"]
        turn = c.post(f"{serve.url}/api/threads/{tid}/continue", json={"message": "hello"})
        assert turn.json()["entries"][1]["content"] == "HELLO"
        events = c.get(f"{serve.url}/api/threads/{tid}/events").json()["records"]
        assert "host.step" in [e["type"] for e in events]


def test_readyz_fails_until_redis_answers_and_scripts_exist(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    url = f"redis://{HOST}:{port}/0"
    with serve_process(["--insecure-dev-auth", "--redis-url", url], tmp_path) as serve:
        not_ready = serve.wait_status("/readyz", 503)
        assert not_ready.json()["status"] == "not ready"
        assert httpx.get(serve.url + "/healthz").status_code == 200  # alive, just not ready
        workdir = tmp_path / "redis"
        workdir.mkdir()
        redis_proc = subprocess.Popen(
            [
                find_binary("redis-server"),
                "--port",
                str(port),
                "--bind",
                HOST,
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            serve.wait_status("/readyz", 200)  # Redis answers; the scripts got loaded
            import redis

            with redis.Redis(host=HOST, port=port) as probe:
                probe.script_flush()  # as after a restart or failover: the cache is empty
            flushed = httpx.get(serve.url + "/readyz")
            assert flushed.status_code == 503
            assert flushed.json()["reason"] == "thread scripts were not loaded"
            serve.wait_status("/readyz", 200)  # ... and it reloaded them
        finally:
            redis_proc.terminate()
            redis_proc.wait(30)


def test_serve_on_a_redis_cluster(tmp_path: Path, redis_cluster: RedisClusterServers) -> None:
    env = {"MEMTIER_NAMESPACE": "servecl" + str(time.monotonic_ns())[-8:]}
    args = ["--insecure-dev-auth", "--redis-url", redis_cluster.url]
    with serve_process(args, tmp_path, env=env) as serve, httpx.Client(timeout=60) as c:
        serve.wait_status("/readyz", 200)
        tid = c.post(serve.url + BASE, json={}).json()["id"]
        assert c.post(f"{serve.url}{BASE}/{tid}/continue", json={"message": "m"}).is_success
        assert c.delete(f"{serve.url}{BASE}/{tid}").json() == {"deleted": True, "held": False}
        redis_cluster.script_flush()
        assert httpx.get(serve.url + "/readyz").status_code == 503
        serve.wait_status("/readyz", 200)


@pytest.mark.slow
def test_serve_with_workers_aggregates_metrics(tmp_path: Path, redis_server: RedisServer) -> None:
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    env = {
        "MEMTIER_NAMESPACE": "servew" + str(time.monotonic_ns())[-8:],
        "PROMETHEUS_MULTIPROC_DIR": str(multiproc),
    }
    args = ["--insecure-dev-auth", "--redis-url", redis_server.url, "--workers", "2"]
    with serve_process(args, tmp_path, env=env) as serve, httpx.Client() as c:
        serve.wait_status("/readyz", 200)
        for _ in range(20):  # new connections: both workers get some
            with httpx.Client() as fresh:
                assert fresh.post(serve.url + BASE, json={}).status_code == 201
        text = c.get(serve.url + "/metrics").text
        line = next(
            line
            for line in text.splitlines()
            if line.startswith('memtier_thread_operations_total{operation="create",outcome="ok"}')
        )
        assert float(line.rsplit(" ", 1)[1]) == 20.0  # every worker's count, whichever answers


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--agent", "scripted_agent:agent"], "--agent needs --runner"),
        (["--runner", "memtier.threads:EchoRunner", "--agent", "nodots"], "package.module:attr"),
        (["--runner", "memtier.threads:EchoRunner", "--agent", "os:path"], "does not take --agent"),
        (["--runner", "memtier.integrations.openai_agents_runner:runner"], "needs --agent"),
    ],
)
def test_serve_refuses_bad_agent_options(args: list[str], message: str) -> None:
    from memtier.errors import ConfigurationError
    from memtier.threads.serve import build_app, parse_args

    with pytest.raises(ConfigurationError) as err:
        build_app(parse_args(["--insecure-dev-auth", *args]))
    assert message in err.value.message
