"""Helpers for the conversation-memory tests: stores with a driven clock, key makers."""

from __future__ import annotations

import uuid
from typing import Any

from memtier import AsyncConversationStore, ConversationKey, ConversationStore

T0 = 1_800_000_000_000  # a fixed test epoch, ms


class Clock:
    """A test clock handed to the store's test-only clock hook (ms)."""

    def __init__(self, start: int = T0) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: float) -> None:
        self.now += int(ms)


def avatar(n: int) -> uuid.UUID:
    return uuid.UUID(int=n)


def key(n: int, channel: str = "public") -> ConversationKey:
    return ConversationKey(avatar(n), channel)


def sync_store(backend: Any, clock: Clock | None = None, **config: Any) -> ConversationStore:
    return ConversationStore(backend.sync_client(), backend.config(**config), clock=clock)


def async_store(backend: Any, clock: Clock | None = None, **config: Any) -> AsyncConversationStore:
    return AsyncConversationStore(backend.async_client(), backend.config(**config), clock=clock)
