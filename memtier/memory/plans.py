"""Sans-I/O plans: one implementation of compaction, flush and recovery for both shells.

A *plan* is a generator that yields requests -- a :class:`~memtier.memory.core.ScriptCall`,
a plain redis-py :class:`Command`, or a :class:`Sleep` -- and receives each reply back
(or has the exception thrown into it, so it can clean up, e.g. unlink a temp file).
Its return value is the result.  :func:`drive_sync` runs a plan on the synchronous
store, :func:`drive_async` on the asyncio store; the plan itself never touches a socket.

The asyncio driver advances the generator in a worker thread
(:func:`asyncio.to_thread`): plans do blocking file I/O (snapshot files) and may call
a blocking summarizer hook, and neither may stall the event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from memtier.memory.core import ScriptCall

__all__ = ["Command", "Plan", "Request", "Sleep", "drive_async", "drive_sync"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Command:
    """One plain redis-py call: ``getattr(client, method)(*args, **kwargs)``.

    Only commands that are safe to re-send after a lost reply are used (reads, XACK, XDEL).
    """

    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait ``seconds`` (a bounded poll, e.g. while another worker restores)."""

    seconds: float


Request = ScriptCall | Command | Sleep
Plan = Generator[Request, Any, T]


def drive_sync(plan: Plan[T], execute: Callable[[ScriptCall | Command], Any]) -> T:
    """Run ``plan`` to completion; ``execute`` performs one script call or command."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            request = plan.throw(error) if error is not None else plan.send(reply)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        reply, error = None, None
        try:
            if isinstance(request, Sleep):
                time.sleep(max(0.0, request.seconds))
            else:
                reply = execute(request)
        except BaseException as exc:  # handed to the plan, which re-raises after cleanup
            error = exc


async def drive_async(
    plan: Plan[T], execute: Callable[[ScriptCall | Command], Awaitable[Any]]
) -> T:
    """Asyncio twin of :func:`drive_sync`; plan steps run in a worker thread."""
    reply: Any = None
    error: BaseException | None = None

    def step(reply: Any, error: BaseException | None) -> tuple[bool, Any]:
        try:
            return False, (plan.throw(error) if error is not None else plan.send(reply))
        except StopIteration as stop:
            return True, stop.value

    while True:
        done, value = await asyncio.to_thread(step, reply, error)
        if done:
            return value  # type: ignore[no-any-return]
        reply, error = None, None
        try:
            if isinstance(value, Sleep):
                await asyncio.sleep(max(0.0, value.seconds))
            else:
                reply = await execute(value)
        except BaseException as exc:
            error = exc
