"""Fixtures shared by memory tests: the embedded backend and a real redis-server, and the
store API (sync or asyncio) a behaviour test runs on.

A test module uses a fixture defined here by naming it in its namespace
(``make_store = memfixtures.make_store``)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import fakeredis
import pytest
from memhelpers import StoreMaker
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


BACKEND_FIXTURES = ("backend", "backend_no_fake", "fake_or_real")


@pytest.fixture(params=["sync", "async"])
def make_store(request: pytest.FixtureRequest) -> Iterator[StoreMaker]:
    """``make_store(backend, clock, **config)``: the same behaviour test on the sync
    :class:`~memtier.ConversationStore` and on the :class:`~memtier.AsyncConversationStore`
    (behind memhelpers.AsyncStoreAdapter, on a private event loop).  Test ids read
    ``[sync-real]``, ``[async-fake]``.
    """
    for name in BACKEND_FIXTURES:
        if name in request.fixturenames:
            # Set the backend up first so it is torn down after the async stores: their
            # clients are closed in the adapter's loop, then the backend's teardown runs.
            request.getfixturevalue(name)
    maker = StoreMaker(request.param)
    try:
        yield maker
    finally:
        maker.shutdown()
