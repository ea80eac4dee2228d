"""Helpers for the conversation-memory tests: stores with a driven clock, key makers."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from asyncadapter import AdapterPool, AsyncAdapter, PrivateLoop

from memtier import AsyncConversationStore, ConversationKey, ConversationStore, MemtierConfig
from memtier.memory.persistence import snapshot_dir_for

T0 = 1_800_000_000_000  # a fixed test epoch, ms


class Clock:
    """A test clock handed to the store's test-only clock hook (ms)."""

    def __init__(self, start: int = T0) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: float) -> None:
        self.now += int(ms)


def command_calls(client: Any) -> dict[str, int]:
    """Calls per command on a server this test started (``INFO commandstats``), keyed
    ``cmdstat_<name>``."""
    stats = client.info("commandstats")
    return {name: int(v["calls"]) for name, v in stats.items()}


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


class AsyncStoreAdapter(AsyncAdapter):
    """An :class:`AsyncConversationStore` behind :class:`ConversationStore`'s method names
    (tests/asyncadapter.py: awaited on a private loop; private names refused)."""

    def __init__(self, store: AsyncConversationStore, loop: PrivateLoop) -> None:
        super().__init__(store, loop)
        self.async_store = store

    def __enter__(self) -> AsyncStoreAdapter:
        self.loop.run(self.async_store.open())
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.loop.run(self.async_store.close())


STORE_APIS = ("sync", "async")
# A store of either API: the sync one, or the asyncio one behind its adapter.
Store = ConversationStore | AsyncStoreAdapter


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
        self._pool = AdapterPool()

    def __call__(self, backend: Any, clock: Clock | None = None, **config: Any) -> Store:
        if self.api == "sync":
            return sync_store(backend, clock, **config)
        store = self._pool.build(lambda: async_store(backend, clock, **config))
        adapter = AsyncStoreAdapter(store, self._pool.loop)
        self._pool.on_shutdown(adapter.close)
        return adapter

    def shutdown(self) -> None:
        self._pool.shutdown()
