"""Run one behaviour suite on a sync API and on its asyncio twin (issue 13).

:class:`AsyncAdapter` puts an asyncio object (``AsyncConversationStore``,
``AsyncConversationService``) behind its sync twin's method names: each public coroutine
method is awaited to the end on a :class:`PrivateLoop` (one per test, in its own thread),
async iterators are drained into a list there, and public attributes read through.  A
test body written against the sync API then runs unchanged on both.

Only public names pass: a test that reaches into private plumbing stays sync-only (with
its reason), so the adapter keeps working however the shells are built inside.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

LOOP_THREAD_NAME = "memtier-test-loop"


class PrivateLoop:
    """One asyncio event loop of its own, in a dedicated thread.

    :meth:`run` blocks until the awaitable is done (at most ``TIMEOUT_S``), so sync test
    code can drive asyncio objects whether or not the test itself runs in a loop.
    """

    TIMEOUT_S = 120.0

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=LOOP_THREAD_NAME)
        self._thread.start()

    def run(self, awaitable: Awaitable[T]) -> T:
        async def wrapped() -> T:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop).result(self.TIMEOUT_S)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(self.TIMEOUT_S)
        self.loop.close()


class AsyncAdapter:
    """``target``'s public coroutine methods as blocking calls run on ``loop``."""

    OWN_ATTRIBUTES = frozenset({"target", "loop", "async_store", "async_service"})

    def __init__(self, target: Any, loop: PrivateLoop) -> None:
        self.target = target
        self.loop = loop

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(f"{name!r} is private: the async adapter passes only public names")
        attr = getattr(self.target, name)
        if inspect.iscoroutinefunction(attr):
            return lambda *args, **kwargs: self.loop.run(attr(*args, **kwargs))
        if inspect.isasyncgenfunction(attr):

            async def drain(*args: Any, **kwargs: Any) -> list[Any]:
                return [item async for item in attr(*args, **kwargs)]

            return lambda *args, **kwargs: iter(self.loop.run(drain(*args, **kwargs)))
        return attr

    def __setattr__(self, name: str, value: Any) -> None:
        # A test that replaces a part of the object (its client, its scripts) would only
        # replace the adapter's attribute and silently test nothing: such a test is sync-only.
        if name not in self.OWN_ATTRIBUTES:
            raise AttributeError(f"the async adapter does not set {name!r} on {self.target!r}")
        super().__setattr__(name, value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.target!r})"


class AdapterPool:
    """The async adapters of one test, on one private loop (started on first use).

    :meth:`adapt` builds the asyncio object inside the loop (an asyncio client belongs to
    the loop it first runs in); :meth:`shutdown` closes each with its ``closer``, in that
    loop, then stops the loop.
    """

    def __init__(self) -> None:
        self._loop: PrivateLoop | None = None
        self._closers: list[Callable[[], Any]] = []

    @property
    def loop(self) -> PrivateLoop:
        if self._loop is None:
            self._loop = PrivateLoop()
        return self._loop

    def build(self, factory: Callable[[], T]) -> T:
        """Call ``factory`` in the private loop's thread, with that loop running."""

        async def in_loop() -> T:
            return factory()

        return self.loop.run(in_loop())

    def on_shutdown(self, closer: Callable[[], Any]) -> None:
        self._closers.append(closer)

    def shutdown(self) -> None:
        if self._loop is None:
            return
        try:
            for closer in self._closers:
                closer()
        finally:
            self._loop.stop()
