"""The ``make_store`` fixture really runs each behaviour test on the API it names.

The async variant must drive an :class:`AsyncConversationStore` (not a sync store in
disguise), in its own event loop, through public names only; and every public method of
the sync store must have an awaited twin, or a behaviour test could not run on both.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any

import memfixtures
import pytest
from memhelpers import AsyncStoreAdapter, Clock, StoreMaker, key

from memtier import AsyncConversationStore, AvatarMessage, ConversationStore

make_store = memfixtures.make_store
fake_or_real = memfixtures.fake_or_real

FACTORIES = {"from_config", "from_url"}  # classmethods: sync on both


class ThreadRecordingClock(Clock):
    """A test clock that notes which thread read it (the store reads it on each call)."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[str] = set()

    def __call__(self) -> int:
        self.threads.add(threading.current_thread().name)
        return super().__call__()


def test_each_variant_drives_the_store_of_its_name(
    make_store: StoreMaker, fake_or_real: Any
) -> None:
    clock = ThreadRecordingClock()
    store = make_store(fake_or_real, clock)
    receipt = store.append(key(1), AvatarMessage(text="hello"))
    assert receipt.seq == 1
    assert [m.turn_count for m in store.iter_metadata()] == [1]
    if make_store.api == "sync":
        assert type(store) is ConversationStore
        assert clock.threads == {threading.current_thread().name}
    else:
        assert isinstance(store, AsyncStoreAdapter)
        assert type(store.async_store) is AsyncConversationStore
        # The store ran in the adapter's private loop, never in the test's thread.
        assert clock.threads == {"memtier-test-loop"}
        assert store.config is store.async_store.config  # public attributes read through
        with pytest.raises(AttributeError, match="private"):
            store._run  # noqa: B018 -- the adapter refuses private plumbing
        with pytest.raises(AttributeError, match="does not set"):
            store.client = None  # would replace the adapter's attribute, not the store's
        assert store.async_store.client is not None


def test_every_public_sync_method_has_an_awaited_twin() -> None:
    public = {n for n in dir(ConversationStore) if not n.startswith("_")}
    methods = {n for n in public if callable(getattr(ConversationStore, n))} - FACTORIES
    assert methods  # the comparison below is not vacuous
    for name in sorted(methods):
        twin = getattr(AsyncConversationStore, name, None)
        assert twin is not None, f"AsyncConversationStore has no {name}"
        assert inspect.iscoroutinefunction(twin) or inspect.isasyncgenfunction(twin), name
