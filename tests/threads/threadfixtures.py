"""The threads behaviour suites on both APIs (issue 13).

A module runs its ``make_service`` / ``service`` tests on the sync
:class:`~memtier.threads.ConversationService` and on the
:class:`~memtier.threads.AsyncConversationService` by naming these fixtures in its
namespace (``make_service = threadfixtures.make_service``); they override the sync-only
ones of tests/threads/conftest.py there.  ``make_sync_service`` and ``make_asyncio_service``
are for the tests of such a module that reach into one service's plumbing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from threadhelpers import Service, ServiceMaker

__all__ = ["Service", "make_asyncio_service", "make_service", "make_sync_service", "service"]


@pytest.fixture(params=["sync", "async"])
def make_service(backend: Any, request: pytest.FixtureRequest) -> Iterator[ServiceMaker]:
    """``make_service(threads={...}, **options)`` on the sync service and on the asyncio
    one (behind threadhelpers.AsyncServiceAdapter); ids read ``[sync-fake]``."""
    maker = ServiceMaker(request.param, backend)
    try:
        yield maker
    finally:
        maker.shutdown()


@pytest.fixture
def service(make_service: ServiceMaker) -> Service:
    return make_service()


def _one_api(api: str, backend: Any) -> Iterator[ServiceMaker]:
    maker = ServiceMaker(api, backend)
    try:
        yield maker
    finally:
        maker.shutdown()


@pytest.fixture
def make_sync_service(backend: Any) -> Iterator[ServiceMaker]:
    """The sync service only, for tests that reach into its plumbing."""
    yield from _one_api("sync", backend)


@pytest.fixture
def make_asyncio_service(backend: Any) -> Iterator[ServiceMaker]:
    """The asyncio service only (behind its adapter), for tests of its own plumbing."""
    yield from _one_api("async", backend)
