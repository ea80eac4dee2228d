"""A real uvicorn server for the HTTP tests: the API mounted beside a host route."""

from __future__ import annotations

import contextlib
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

    def __init__(self, service: AsyncConversationService, base_path: str, **app_kw: Any) -> None:
        conversations = create_conversation_app(service, authorize, base_path=base_path, **app_kw)

        async def ping(request: Request) -> PlainTextResponse:
            return PlainTextResponse("host says pong")

        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            yield
            await service.aclose()

        host = Starlette(
            routes=[Route("/host/ping", ping), Mount("/", app=conversations)], lifespan=lifespan
        )
        (self.port,) = free_ports(1)
        config = uvicorn.Config(
            host, host=HOST, port=self.port, log_level="warning", lifespan="on", access_log=False
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
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


@contextlib.contextmanager
def api_server(
    backend: Any,
    *,
    threads: dict[str, Any] | None = None,
    base_path: str = DEFAULT_BASE_PATH,
    **service_kw: Any,
) -> Iterator[ApiServer]:
    config = backend.config(threads=threads) if threads else backend.config()
    service = AsyncConversationService(async_client_for(backend), config, **service_kw)
    server = ApiServer(service, base_path).start()
    try:
        yield server
    finally:
        server.stop()
