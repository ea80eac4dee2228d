"""``ConversationStore.from_url(url, **settings)`` and the close / context-manager API."""

from __future__ import annotations

from typing import Any

import pytest

from memtier import AsyncConversationStore, AvatarMessage, ConversationKey, ConversationStore
from memtier.errors import ConfigurationError

KEY = ConversationKey("00000000-0000-4000-8000-000000000001", "im")


def test_from_url_with_settings_round_trips(backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMTIER_REDIS_URL", raising=False)
    closed: list[bool] = []
    with ConversationStore.from_url(
        backend.url, namespace=backend.namespace, conversation={"max_turns_per_session": 12}
    ) as store:
        real_close = store.client.close
        store.client.close = lambda: (closed.append(True), real_close())[1]
        assert store.config.namespace == backend.namespace
        assert store.config.redis_url == backend.url
        assert store.config.conversation.max_turns_per_session == 12
        assert store.embedded is (backend.url is None)
        store.append(KEY, AvatarMessage(text="hello"))
        (message,) = store.context(KEY).messages
        assert "hello" in message.content
    assert closed == [True]


async def test_async_from_url_and_aclose(backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMTIER_REDIS_URL", raising=False)
    async with AsyncConversationStore.from_url(backend.url, namespace=backend.namespace) as store:
        await store.append(KEY, AvatarMessage(text="hi"))
        assert len((await store.context(KEY)).messages) == 1
    other = AsyncConversationStore.from_url(backend.url, namespace=backend.namespace)
    await other.aclose()


def test_from_url_rejects_bad_settings() -> None:
    with pytest.raises(ConfigurationError, match="unknown Redis URL scheme"):
        ConversationStore.from_url("ftp://nowhere")
    with pytest.raises(ConfigurationError, match="no_such_setting"):
        ConversationStore.from_url(None, no_such_setting=1)


def test_from_url_none_takes_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMTIER_REDIS_URL", "redis://127.0.0.1:1/0")  # nothing listens there
    store = ConversationStore.from_url(None, namespace="envurl")
    try:
        assert store.config.redis_url == "redis://127.0.0.1:1/0" and not store.embedded
    finally:
        store.close()
