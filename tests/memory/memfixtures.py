"""Fixtures shared by memory tests: the embedded backend and a real redis-server."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import fakeredis
import pytest
from servers import Backend, RedisServer


def forget_backend(namespace: str) -> None:
    """Hook for per-backend caches of a test module (cleared at teardown)."""
    for cache in CACHES:
        cache.pop(namespace, None)


CACHES: list[dict[str, object]] = []


@pytest.fixture(
    params=[
        pytest.param("fake", marks=pytest.mark.fake),
        pytest.param("real", marks=pytest.mark.real),
    ]
)
async def fake_or_real(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    """fakeredis and a real standalone redis-server, for behaviour no cluster changes."""
    namespace = "t" + uuid.uuid4().hex[:10]
    if request.param == "fake":
        made = Backend("fake", namespace=namespace, url=None, fake_server=fakeredis.FakeServer())
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        made = Backend("real", namespace=namespace, url=server.url, node_url=server.url)
    try:
        yield made
    finally:
        forget_backend(namespace)
        await made.aclose()
