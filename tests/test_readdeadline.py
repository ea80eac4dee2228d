"""The asyncio socket-read timeouts (memtier.readdeadline): one timer per loop, what
``asyncio.timeout`` would give each read.

Real loops and real time.  Reads that should time out get short deadlines; reads that
should not get deadlines far beyond anything a loaded machine stalls for, so no outcome
here depends on the machine's speed.  The order-sensitive cases (a timeout and an outside
cancellation at once) are driven step by step, not by the clock.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from memtier.readdeadline import deadlines_of, read_within

LONG = 30.0  # a deadline no test run reaches
SHORT = (0.01, 0.02, 0.05)

# One read of a batch: ("answered", None) completes at once under a LONG deadline;
# ("stalls", s) never completes, deadline s; ("cancelled", None) is cancelled from outside
# under a LONG deadline.
reads = st.lists(
    st.one_of(
        st.tuples(st.just("answered"), st.none()),
        st.tuples(st.just("stalls"), st.sampled_from(SHORT)),
        st.tuples(st.just("cancelled"), st.none()),
    ),
    min_size=1,
    max_size=10,
)


async def _one(kind: str, seconds: float | None, gate: asyncio.Future[str]) -> tuple[str, float]:
    loop = asyncio.get_running_loop()
    started = loop.time()
    waits: asyncio.Future[str] = gate if kind == "answered" else loop.create_future()
    try:
        await read_within(waits, seconds if seconds is not None else LONG)
    except TimeoutError:
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0  # the timeout's cancel undone
        return "timeout", loop.time() - started
    return "value", loop.time() - started


async def _batch(plan: list[tuple[str, float | None]]) -> list[Any]:
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[str] = loop.create_future()
    tasks = [asyncio.create_task(_one(kind, s, gate)) for kind, s in plan]
    await asyncio.sleep(0)  # every read registered
    gate.set_result("reply")
    for (kind, _), task in zip(plan, tasks, strict=True):
        if kind == "cancelled":
            task.cancel()
    # asyncio's own timer bounds the test: a read whose deadline never fires fails it
    # instead of hanging it.
    async with asyncio.timeout(LONG / 2):
        out = await asyncio.gather(*tasks, return_exceptions=True)
    deadlines = deadlines_of(loop)
    assert not deadlines.reads  # every read removed itself
    return out


@given(reads)
@example([("stalls", 0.01), ("answered", None), ("cancelled", None), ("stalls", 0.05)])
@example([("cancelled", None)])
def test_each_read_gets_its_own_outcome_and_no_timeout_comes_early(
    plan: list[tuple[str, float | None]],
) -> None:
    out = asyncio.run(_batch(plan))
    for (kind, seconds), got in zip(plan, out, strict=True):
        if kind == "cancelled":
            assert isinstance(got, asyncio.CancelledError)
        elif kind == "answered":
            assert got[0] == "value"
        else:
            assert seconds is not None
            outcome, elapsed = got
            assert outcome == "timeout"
            assert elapsed >= seconds - 1e-6  # never before its deadline


def test_a_timeout_and_an_outside_cancel_at_once_stay_a_cancel() -> None:
    """asyncio.Timeout's rule: a cancellation requested from outside while the deadline
    fired is not turned into a timeout."""

    async def run() -> None:
        loop = asyncio.get_running_loop()
        never: asyncio.Future[None] = loop.create_future()
        task = asyncio.create_task(read_within(never, LONG))
        await asyncio.sleep(0)
        deadlines = deadlines_of(loop)
        (read,) = deadlines.reads
        read.deadline = loop.time()  # due now: the timer's next run expires it
        deadlines._fire()
        task.cancel()  # and the caller's own cancellation, in the same iteration
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not deadlines.reads

    asyncio.run(run())


def test_the_timer_follows_the_earliest_deadline_and_stops_when_idle() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        deadlines = deadlines_of(loop)
        slow = asyncio.create_task(read_within(loop.create_future(), LONG))
        await asyncio.sleep(0)
        assert deadlines._timer is not None
        at_long = deadlines._timer_at
        fast = asyncio.create_task(read_within(loop.create_future(), 0.01))
        await asyncio.sleep(0)
        assert deadlines._timer_at < at_long  # re-armed for the earlier deadline
        with pytest.raises(TimeoutError):
            await fast
        assert deadlines._timer_at == pytest.approx(at_long)  # set again for the next one
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        # Nothing in flight: the pending timer fires once more, finds nothing, stops.
        assert deadlines._timer is not None
        deadlines._timer.cancel()
        deadlines._fire()
        assert deadlines._timer is None

    asyncio.run(run())


def test_loops_in_threads_keep_their_own_deadlines() -> None:
    results: dict[int, Any] = {}

    def worker(n: int, seconds: float) -> None:
        async def run() -> tuple[str, float]:
            loop = asyncio.get_running_loop()
            started = loop.time()
            try:
                await read_within(loop.create_future(), seconds)
            except TimeoutError:
                return "timeout", loop.time() - started
            return "value", 0.0

        results[n] = asyncio.run(run())

    threads = [threading.Thread(target=worker, args=(n, 0.02 * (n + 1))) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(results) == [0, 1, 2, 3]
    for n, (outcome, elapsed) in results.items():
        assert outcome == "timeout"
        assert elapsed >= 0.02 * (n + 1) - 1e-6


def test_a_closed_loop_is_not_kept_alive_by_its_deadlines() -> None:
    loop = asyncio.new_event_loop()

    async def run() -> None:
        with pytest.raises(TimeoutError):
            await read_within(asyncio.get_running_loop().create_future(), 0.01)

    loop.run_until_complete(run())
    loop.close()
    gone = weakref.ref(loop)
    del loop
    gc.collect()
    assert gone() is None
