"""Stores on a test backend with a driven clock, for the adapter tests.

(The same helpers as tests/memory/memhelpers.py, under a name of their own: test
folders here have no __init__.py, so two helper modules must not share a name.)
"""

from __future__ import annotations

from typing import Any

from memtier import AsyncConversationStore, ConversationStore

T0 = 1_800_000_000_000  # a fixed test epoch, ms


class Clock:
    """A test clock handed to the store's test-only clock hook (ms)."""

    def __init__(self, start: int = T0) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: float) -> None:
        self.now += int(ms)


def sync_store(backend: Any, clock: Clock | None = None, **config: Any) -> ConversationStore:
    return ConversationStore(backend.sync_client(), backend.config(**config), clock=clock)


def async_store(backend: Any, clock: Clock | None = None, **config: Any) -> AsyncConversationStore:
    return AsyncConversationStore(backend.async_client(), backend.config(**config), clock=clock)
