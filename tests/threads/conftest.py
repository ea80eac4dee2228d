"""Fixtures of the conversation-thread tests (the backends come from tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from memtier.threads import AsyncConversationService, ConversationService


@pytest.fixture
def make_service(backend: Any) -> Callable[..., ConversationService]:
    """``make_service(threads={...}, **service_options)`` on the test's backend and namespace."""

    def make(threads: dict[str, Any] | None = None, **options: Any) -> ConversationService:
        config = backend.config(threads=threads) if threads else backend.config()
        return ConversationService(backend.sync_client(), config, **options)

    return make


@pytest.fixture
def service(make_service: Callable[..., ConversationService]) -> ConversationService:
    return make_service()


@pytest.fixture
def make_async_service(backend: Any) -> Callable[..., AsyncConversationService]:
    def make(threads: dict[str, Any] | None = None, **options: Any) -> AsyncConversationService:
        config = backend.config(threads=threads) if threads else backend.config()
        return AsyncConversationService(backend.async_client(), config, **options)

    return make
