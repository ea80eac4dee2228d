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


class AsyncBridge:
    """An :class:`AsyncConversationStore` behind the sync store's interface.

    Every coroutine method runs to completion on a private event loop in its own thread
    (async iterators are drained there), so a test written against the sync API runs
    unchanged on the asyncio store.  :meth:`shutdown` closes the store in that loop.
    """

    TIMEOUT_S = 120.0

    def __init__(self, store: AsyncConversationStore) -> None:
        import asyncio
        import threading

        self._bridge_store = store
        self._bridge_loop = asyncio.new_event_loop()
        self._bridge_thread = threading.Thread(
            target=self._bridge_loop.run_forever, name="async-bridge"
        )
        self._bridge_thread.start()

    def _bridge_run(self, awaitable: Any) -> Any:
        import asyncio

        return asyncio.run_coroutine_threadsafe(awaitable, self._bridge_loop).result(self.TIMEOUT_S)

    def __getattr__(self, name: str) -> Any:
        import inspect

        attr = getattr(self._bridge_store, name)
        if inspect.iscoroutinefunction(attr):
            return lambda *a, **kw: self._bridge_run(attr(*a, **kw))
        if inspect.isasyncgenfunction(attr):

            async def drain(*a: Any, **kw: Any) -> list[Any]:
                return [item async for item in attr(*a, **kw)]

            return lambda *a, **kw: iter(self._bridge_run(drain(*a, **kw)))
        if name == "executor":  # its coroutine methods run on the bridge's loop too
            return _BridgedExecutor(attr, self._bridge_run)
        return attr

    def shutdown(self) -> None:
        try:
            self._bridge_run(self._bridge_store.close())
        finally:
            self._bridge_loop.call_soon_threadsafe(self._bridge_loop.stop)
            self._bridge_thread.join(self.TIMEOUT_S)
            self._bridge_loop.close()


class _BridgedExecutor:
    """The asyncio store's executor behind the sync executor's ``execute``/``run``."""

    def __init__(self, executor: Any, run: Any) -> None:
        self._executor, self._run = executor, run

    def execute(self, request: Any, operation: str | None = None) -> Any:
        return self._run(self._executor.execute(request, operation))

    def run(self, plan: Any, operation: str | None = None) -> Any:
        return self._run(self._executor.run(plan, operation, offload=True))


def bridged_store(
    bridges: list[AsyncBridge], backend: Any, clock: Clock | None = None, **config: Any
) -> Any:
    """``sync_store``'s twin on the asyncio store (the caller shuts ``bridges`` down)."""
    bridge = AsyncBridge(async_store(backend, clock, **config))
    bridges.append(bridge)
    return bridge
