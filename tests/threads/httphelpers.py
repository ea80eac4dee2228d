"""A real uvicorn server for the HTTP tests: the API mounted beside a host route."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import uvicorn
from servers import HOST, free_ports
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route
from threadhelpers import OTHER, OWNER

from memtier.config import parse_redis_url
from memtier.threads import AsyncConversationService, Ownership
from memtier.threads.http import DEFAULT_BASE_PATH, create_conversation_app

TOKENS = {"alice-token": OWNER, "mallory-token": OTHER}
ALICE = {"Authorization": "Bearer alice-token"}
MALLORY = {"Authorization": "Bearer mallory-token"}
START_TIMEOUT_S = 60.0


def authorize(request: Request) -> Ownership | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return TOKENS.get(token) if scheme.lower() == "bearer" else None


def async_client_for(backend: Any) -> Any:
    """A fresh asyncio client owned by the server (closed by its lifespan)."""
    if backend.is_fake:
        import fakeredis

        return fakeredis.FakeAsyncRedis(server=backend.fake_server)
    is_cluster, url = parse_redis_url(backend.url)
    if is_cluster:
        from redis.asyncio.cluster import RedisCluster

        return RedisCluster.from_url(url)
    import redis.asyncio

    return redis.asyncio.Redis.from_url(url)


class ApiServer:
    """uvicorn in a thread on a free loopback port; ``url`` is the API base URL."""

    def __init__(
        self,
        service: AsyncConversationService,
        base_path: str,
        auth: Any = None,
        **app_kw: Any,
    ) -> None:
        conversations = create_conversation_app(
            service, auth or authorize, base_path=base_path, **app_kw
        )

        async def ping(request: Request) -> PlainTextResponse:
            return PlainTextResponse("host says pong")

        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            yield
            await service.aclose()

        host = Starlette(
            routes=[Route("/host/ping", ping), Mount("/", app=conversations)], lifespan=lifespan
        )
        # Bound here, on port 0, and handed to uvicorn: a port probed free and bound later
        # can be taken in between by anyone on the machine (CI saw EADDRINUSE once).
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.bind((HOST, 0))
        self.port = int(self.socket.getsockname()[1])
        config = uvicorn.Config(host, log_level="warning", lifespan="on", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=lambda: self.server.run(sockets=[self.socket]), name="uvicorn", daemon=True
        )
        self.root = f"http://{HOST}:{self.port}"
        self.url = self.root + base_path

    def start(self) -> ApiServer:
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            assert self.thread.is_alive(), "uvicorn exited during startup"
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        if self.thread.is_alive():  # a request still in flight: do not wait for it forever
            self.server.force_exit = True
            self.thread.join(30)
        assert not self.thread.is_alive(), "uvicorn did not stop"
        self.socket.close()


@contextlib.contextmanager
def api_server(
    backend: Any,
    *,
    threads: dict[str, Any] | None = None,
    base_path: str = DEFAULT_BASE_PATH,
    auth: Any = None,
    **service_kw: Any,
) -> Iterator[ApiServer]:
    config = backend.config(threads=threads) if threads else backend.config()
    service = AsyncConversationService(async_client_for(backend), config, **service_kw)
    server = ApiServer(service, base_path, auth).start()
    try:
        yield server
    finally:
        server.stop()


# --- `memtier serve` in a subprocess --------------------------------------------------------------

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


class ServeProcess:
    """``python -m memtier serve ...`` on a loopback socket this process binds (port 0) and
    hands down with ``--fd``, so no other process can take the port between choosing it
    and binding it (and the health checks can only reach this server); its output goes
    to a log file.  ``--workers`` > 1 binds ``--host``/``--port`` itself: there a free
    port is probed, and a start that lost the port to another process is retried."""

    def __init__(self, args: list[str], workdir: Any, env: dict[str, str] | None = None) -> None:
        self._args, self._workdir, self._env = args, workdir, env
        self._start()

    def _start(self) -> None:
        import os
        import socket
        import subprocess
        import sys

        args, workdir, env = self._args, self._workdir, self._env
        listen: socket.socket | None = None
        if "--workers" in args:
            (self.port,) = free_ports(1)
            where = ["--host", HOST, "--port", str(self.port)]
        else:
            listen = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listen.bind((HOST, 0))
            self.port = listen.getsockname()[1]
            where = ["--fd", str(listen.fileno())]
        self.url = f"http://{HOST}:{self.port}"
        self.log_path = workdir / f"serve-{self.port}.log"
        full_env = dict(os.environ)
        full_env.pop("MEMTIER_REDIS_URL", None)
        full_env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT), str(workdir), full_env.get("PYTHONPATH", "")]
        )
        full_env.update(env or {})
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "memtier",
                "serve",
                *where,
                *args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            env=full_env,
            start_new_session=True,
            pass_fds=() if listen is None else (listen.fileno(),),
        )
        if listen is not None:
            listen.close()  # the child holds its own copy
        self._restarts_left = getattr(self, "_restarts_left", 3)

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def wait_healthy(self) -> None:
        import httpx

        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                if "address already in use" in self.log().lower() and self._restarts_left:
                    # --workers: another process took the probed port before uvicorn bound it
                    self._restarts_left -= 1
                    self._log.close()
                    self._start()
                    continue
                raise AssertionError(f"memtier serve exited ({code}):\n{self.log()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"memtier serve never healthy:\n{self.log()}"
            time.sleep(0.05)

    def wait_status(self, path: str, status: int) -> Any:
        import httpx

        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            response = httpx.get(self.url + path, timeout=10)
            if response.status_code == status:
                return response
            assert time.monotonic() < deadline, f"{path} never {status}:\n{self.log()}"
            time.sleep(0.05)

    def stop(self) -> int:
        import signal
        import subprocess

        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(60)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(30)
            return self.proc.returncode
        finally:
            self._log.close()


@contextlib.contextmanager
def serve_process(args: list[str], workdir: Any, **kw: Any) -> Iterator[ServeProcess]:
    process = ServeProcess(args, workdir, **kw)
    try:
        process.wait_healthy()
        yield process
    finally:
        import signal

        code = process.stop()
        # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal (exit -15)
        assert code in (0, -signal.SIGTERM), f"memtier serve exited {code}:\n{process.log()}"
        assert "Application shutdown complete" in process.log(), process.log()
