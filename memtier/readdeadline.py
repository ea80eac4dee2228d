"""Socket-read timeouts of the lean asyncio paths: one timer per event loop, not one per read.

``async with asyncio.timeout(t)`` around each socket read schedules a timer and cancels it
again: about 4 us a read in a loop, 10-12 us of client CPU per asyncio append between
real replies (``bench.client_cpu``, docs/performance.md).  Here a read registers its
deadline in its loop's :class:`ReadDeadlines` and removes it when it ends; one timer per
loop, set for the earliest deadline in flight, cancels the task of every read whose
deadline has passed when it fires, and sets itself again for the next one (or not at all
when no read is in flight).

What a caller sees is what ``asyncio.timeout`` gives it: a read past its deadline raises
TimeoutError (the caller maps it to redis-py's type), a cancellation from outside stays a
CancelledError, and when both happen at once the outside cancellation wins (the same
``uncancel`` count rule as ``asyncio.Timeout``).  A deadline fires at its time or later,
never earlier (asyncio's own rule: a timer runs once the loop's clock is within its clock
resolution of it).
"""

from __future__ import annotations

import asyncio
import math
import time
import weakref
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["ReadDeadlines", "deadlines_of", "read_within"]

T = TypeVar("T")

# asyncio's BaseEventLoop._clock_resolution: a timer is due once the clock is this close.
_RESOLUTION = time.get_clock_info("monotonic").resolution


class _Read:
    __slots__ = ("cancelling", "deadline", "expired", "task")

    def __init__(self, task: asyncio.Task[object], deadline: float) -> None:
        self.task = task
        self.deadline = deadline
        self.cancelling = task.cancelling()  # outside cancellations already pending
        self.expired = False


class ReadDeadlines:
    """The reads in flight on one event loop and the one timer that enforces their deadlines."""

    __slots__ = ("_timer", "_timer_at", "loop_ref", "reads")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weak: the registry below maps each loop to this object, and must not keep the
        # loop alive through it.
        self.loop_ref = weakref.ref(loop)
        self.reads: set[_Read] = set()  # bounded by the reads in flight (one per connection)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def start(self, task: asyncio.Task[object], timeout: float) -> _Read:
        loop = task.get_loop()
        read = _Read(task, loop.time() + timeout)
        self.reads.add(read)
        if read.deadline < self._timer_at:  # none set, or set for a later deadline
            self._arm(loop, read.deadline)
        return read

    def end(self, read: _Read) -> None:
        # The timer stays: when it fires with nothing due it sets itself for the next
        # deadline in flight, or stops.  At most one wakeup per timeout period.
        self.reads.discard(read)

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(when, self._fire)
        self._timer_at = when

    def _fire(self) -> None:
        self._timer, self._timer_at = None, math.inf
        loop = self.loop_ref()
        if loop is None:  # pragma: no cover - a timer runs on its (live) loop
            return
        due = loop.time() + _RESOLUTION
        following = math.inf
        for read in tuple(self.reads):
            if read.deadline <= due:
                if not read.expired:
                    read.expired = True
                    read.task.cancel()
            elif read.deadline < following:
                following = read.deadline
        if following < math.inf:
            self._arm(loop, following)


# One ReadDeadlines per loop, and the last one looked up (threads that each run their own
# loop may overwrite it in turn: it is checked against the loop asking, never trusted).
_BY_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ReadDeadlines] = (
    weakref.WeakKeyDictionary()
)
_last: ReadDeadlines | None = None


def deadlines_of(loop: asyncio.AbstractEventLoop) -> ReadDeadlines:
    """The :class:`ReadDeadlines` of ``loop`` (made on first use)."""
    global _last
    last = _last
    if last is not None and last.loop_ref() is loop:
        return last
    found = _BY_LOOP.get(loop)
    if found is None:
        found = _BY_LOOP.setdefault(loop, ReadDeadlines(loop))
    _last = found
    return found


async def read_within(awaitable: Awaitable[T], seconds: float) -> T:
    """``await awaitable``, or TimeoutError once ``seconds`` passed (the running
    task is cancelled to stop it, as ``asyncio.timeout`` does)."""
    task = asyncio.current_task()
    if task is None:  # pragma: no cover - always called from a task
        raise RuntimeError("read_within needs a running task")
    deadlines = deadlines_of(task.get_loop())
    read = deadlines.start(task, seconds)
    try:
        return await awaitable
    except asyncio.CancelledError:
        # Ours (and no other cancellation requested since the read started): a timeout.
        if read.expired and task.uncancel() <= read.cancelling:
            raise TimeoutError from None
        raise
    finally:
        deadlines.end(read)
