"""Helpers for the conversation-memory tests: stores with a driven clock, key makers."""

from __future__ import annotations

import asyncio
import inspect
import threading
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from memtier import AsyncConversationStore, ConversationKey, ConversationStore, MemtierConfig
from memtier.memory.persistence import snapshot_dir_for

T = TypeVar("T")

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


STORE_OPTIONS = ("summarizer", "inline_compaction")  # constructor options, not config


def _split(backend: Any, config: dict[str, Any]) -> tuple[MemtierConfig, dict[str, Any]]:
    """The store's config and its constructor options; with persistence on, its snapshot
    directory, as ``from_config`` sets it (no restore on start: tests call ``recover``)."""
    options = {name: config.pop(name) for name in STORE_OPTIONS if name in config}
    built: MemtierConfig = backend.config(**config)
    if built.conversation.persistence_enabled:
        options["snapshots"] = snapshot_dir_for(built)
    return built, options


def _unwrapped(client: Any) -> Any:
    return client


def sync_store(
    backend: Any,
    clock: Clock | None = None,
    *,
    wrap_client: Callable[[Any], Any] = _unwrapped,
    **config: Any,
) -> ConversationStore:
    """A store on a new sync client of ``backend`` (``wrap_client`` may wrap that client)."""
    built, options = _split(backend, config)
    return ConversationStore(wrap_client(backend.sync_client()), built, clock=clock, **options)


def async_store(
    backend: Any,
    clock: Clock | None = None,
    *,
    wrap_client: Callable[[Any], Any] = _unwrapped,
    **config: Any,
) -> AsyncConversationStore:
    """``sync_store``'s twin on a new asyncio client (``wrap_client`` wraps that one)."""
    built, options = _split(backend, config)
    client = wrap_client(backend.async_client())
    return AsyncConversationStore(client, built, clock=clock, **options)


class PrivateLoop:
    """One asyncio event loop of its own, in a dedicated thread, for one test.

    :meth:`run` blocks until the awaitable is done (at most ``TIMEOUT_S``), so sync test
    code can drive asyncio objects whether or not the test itself runs in a loop.
    """

    TIMEOUT_S = 120.0

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="memtier-test-loop")
        self._thread.start()

    def run(self, awaitable: Awaitable[T]) -> T:
        async def wrapped() -> T:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop).result(self.TIMEOUT_S)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(self.TIMEOUT_S)
        self.loop.close()


class AsyncStoreAdapter:
    """An :class:`AsyncConversationStore` behind :class:`ConversationStore`'s method names.

    Test-side only: each public coroutine method of the async store is awaited to the end on
    ``loop`` (async iterators such as ``iter_metadata`` are drained there, into a list), and
    public attributes (``config``, ``core``, ...) are read through.  Private names are refused
    on purpose: a test that reaches into a store's plumbing is sync-only, with its reason.
    """

    def __init__(self, store: AsyncConversationStore, loop: PrivateLoop) -> None:
        self.async_store = store
        self.loop = loop

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(
                f"{name!r} is private: the async adapter exposes only the public API"
            )
        attr = getattr(self.async_store, name)
        if inspect.iscoroutinefunction(attr):
            return lambda *args, **kwargs: self.loop.run(attr(*args, **kwargs))
        if inspect.isasyncgenfunction(attr):

            async def drain(*args: Any, **kwargs: Any) -> list[Any]:
                return [item async for item in attr(*args, **kwargs)]

            return lambda *args, **kwargs: iter(self.loop.run(drain(*args, **kwargs)))
        return attr

    def __enter__(self) -> AsyncStoreAdapter:
        self.loop.run(self.async_store.open())
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.loop.run(self.async_store.close())

    def __repr__(self) -> str:
        return f"AsyncStoreAdapter({self.async_store!r})"


STORE_APIS = ("sync", "async")


class StoreMaker:
    """``make_store(backend, clock, **config)``: ``sync_store``'s signature, on either API.

    ``api="sync"`` builds a :class:`ConversationStore`; ``api="async"`` builds an
    :class:`AsyncConversationStore` the way users do (the constructor with an asyncio
    client of the backend) behind an :class:`AsyncStoreAdapter`, on one private loop per
    test.  :meth:`shutdown` closes the async stores in that loop, then stops it.
    """

    def __init__(self, api: str) -> None:
        assert api in STORE_APIS, api
        self.api = api
        self._loop: PrivateLoop | None = None
        self._adapters: list[AsyncStoreAdapter] = []

    def __call__(self, backend: Any, clock: Clock | None = None, **config: Any) -> Any:
        if self.api == "sync":
            return sync_store(backend, clock, **config)
        if self._loop is None:
            self._loop = PrivateLoop()
        # Built in the private loop: an asyncio client belongs to the loop it first runs in.
        adapter = AsyncStoreAdapter(
            self._loop.run(_build_async(backend, clock, config)), self._loop
        )
        self._adapters.append(adapter)
        return adapter

    def shutdown(self) -> None:
        if self._loop is None:
            return
        try:
            for adapter in self._adapters:
                adapter.close()
        finally:
            self._loop.stop()


async def _build_async(
    backend: Any, clock: Clock | None, config: dict[str, Any]
) -> AsyncConversationStore:
    return async_store(backend, clock, **config)
