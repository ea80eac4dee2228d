"""The one engine: both drivers against a reference model, and the executors on fakeredis.

The model: a plan is a script of steps (send a request, expect a reply or an error,
catch or not); both drivers must hand the plan the same replies and errors in the same
order, return its value, close it on every exit, and propagate what it does not catch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any

import fakeredis
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from redis import exceptions as rexc

from memtier.config import MemtierConfig
from memtier.connection import AsyncClientGuard, SyncClientGuard
from memtier.engine import (
    Batch,
    Command,
    Handoff,
    Plan,
    Request,
    ScriptCall,
    Sleep,
    drive_async,
    drive_sync,
)
from memtier.errors import OutcomeUnknownError
from memtier.executor import AsyncExecutor, SyncExecutor
from memtier.retry import RetryPolicy
from memtier.scripts import load_registry


class Boom(Exception):
    """The error a step's execution raises in the model."""


# A step: (fails, caught).  fails: executing the request raises Boom; caught: the plan
# catches it and goes on (else the driver must propagate it).
Step = tuple[bool, bool]


def model(steps: list[Step]) -> tuple[list[str], Any]:
    """What the plan must see, and its result ("raised" when an error escapes)."""
    seen: list[str] = []
    for i, (fails, caught) in enumerate(steps):
        if fails:
            seen.append(f"error:{i}")
            if not caught:
                return seen, "raised"
        else:
            seen.append(f"reply:{i}")
    return seen, len(steps)


def scripted_plan(steps: list[Step], seen: list[str], closed: list[bool]) -> Plan[int]:
    try:
        for i, (_fails, caught) in enumerate(steps):
            if i % 3 == 2:
                yield Sleep(0)  # the driver itself waits: execute never sees a Sleep
            try:
                reply = yield Command("step", (i,))
                seen.append(str(reply))
            except Boom:
                seen.append(f"error:{i}")
                if not caught:
                    raise
        return len(steps)
    finally:
        closed.append(True)


def execute_step(steps: list[Step], request: Request) -> str:
    assert isinstance(request, Command), "a Sleep reached execute"
    index = int(request.args[0])
    if steps[index][0]:
        raise Boom(index)
    return f"reply:{index}"


STEPS = st.lists(st.tuples(st.booleans(), st.booleans()), max_size=12)


def run_sync(steps: list[Step]) -> tuple[list[str], Any, list[bool]]:
    seen: list[str] = []
    closed: list[bool] = []
    try:
        result: Any = drive_sync(
            scripted_plan(steps, seen, closed), lambda r: execute_step(steps, r)
        )
    except Boom:
        result = "raised"
    return seen, result, closed


def run_async(steps: list[Step], offload: bool) -> tuple[list[str], Any, list[bool]]:
    seen: list[str] = []
    closed: list[bool] = []

    async def execute(request: Request) -> str:
        return execute_step(steps, request)

    async def main() -> Any:
        try:
            return await drive_async(scripted_plan(steps, seen, closed), execute, offload=offload)
        except Boom:
            return "raised"

    return seen, asyncio.run(main()), closed


@given(STEPS)
@example([])
@example([(True, False)])
@example([(False, False), (True, True), (False, False), (True, False), (False, True)])
def test_both_drivers_follow_the_model(steps: list[Step]) -> None:
    expected_seen, expected_result = model(steps)
    for seen, result, closed in (
        run_sync(steps),
        run_async(steps, offload=False),
        run_async(steps, offload=True),
    ):
        assert seen == expected_seen
        assert result == expected_result
        assert closed == [True]


def test_a_plan_abandoned_by_a_base_exception_is_closed() -> None:
    closed: list[bool] = []

    def plan() -> Generator[Request, Any, None]:
        try:
            yield Command("x")
        finally:
            closed.append(True)

    def interrupt(_: Request) -> Any:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        drive_sync(plan(), interrupt)
    assert closed == [True]


# --- the executors on fakeredis ----------------------------------------------------------------


def config() -> MemtierConfig:
    return MemtierConfig.load(namespace="engine")


def sync_executor(client: Any, handoff: Any = None) -> SyncExecutor:
    cfg = config()
    return SyncExecutor(
        client,
        load_registry("memory"),
        SyncClientGuard(cfg.redis),
        RetryPolicy.from_config(cfg),
        handoff=handoff,
    )


def stats_call() -> ScriptCall:
    # partition_stats reads only; on an empty namespace it answers zeros.
    from memtier.memory.core import MemoryCore

    core = MemoryCore(config())
    call = core.stats_call(core.keyspace.partition(0))
    return ScriptCall(call.script, call.keys, call.args, attempts=[0])


@pytest.mark.fake
def test_sync_executor_performs_every_request_kind() -> None:
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    hooked: list[str] = []
    executor = sync_executor(client, handoff=lambda work: f"handled {work}")
    executor.on_script.append(lambda script, args, reply: hooked.append(script))
    call = stats_call()

    def plan() -> Plan[list[Any]]:
        stats = yield call
        written = yield Command("set", ("k", "v"), {"nx": True})
        both = yield Batch((Command("get", ("k",)), Command("strlen", ("k",))))
        handed = yield Handoff("turn")
        return [stats, written, both, handed]

    stats, written, both, handed = executor.run(plan(), "probe")
    assert [int(x) for x in stats[:2]] == [0, 0]
    assert written is True
    assert both == [b"v", 1]
    assert handed == "handled turn"
    assert hooked == ["partition_stats"]
    assert call.attempts == [1]


@pytest.mark.fake
def test_sync_executor_retries_a_lost_connection_and_counts_attempts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    executor = sync_executor(client)
    failures = [rexc.ConnectionError("reset")]
    real_get = client.get

    def flaky_get(key: str) -> Any:
        if failures:
            raise failures.pop()
        return real_get(key)

    monkeypatch.setattr(client, "get", flaky_get)
    client.set("k", "v")
    assert executor.execute(Command("get", ("k",)), "probe") == b"v"
    assert failures == []


@pytest.mark.fake
def test_an_executor_without_handoff_refuses_handoff_work() -> None:
    executor = sync_executor(fakeredis.FakeRedis(server=fakeredis.FakeServer()))
    with pytest.raises(TypeError, match="hand-off"):
        executor.execute(Handoff("turn"))


@pytest.mark.fake
async def test_async_executor_performs_every_request_kind() -> None:
    client = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    cfg = config()

    async def handoff(work: Any) -> str:
        return f"handled {work}"

    executor = AsyncExecutor(
        client,
        load_registry("memory"),
        AsyncClientGuard(client, cfg.redis),
        RetryPolicy.from_config(cfg),
        handoff=handoff,
    )
    call = stats_call()

    def plan() -> Plan[list[Any]]:
        stats = yield call
        yield Sleep(0)
        written = yield Command("set", ("k", "v"))
        both = yield Batch((Command("get", ("k",)), Command("exists", ("k",))))
        handed = yield Handoff("turn")
        return [stats, written, both, handed]

    stats, written, both, handed = await executor.run(plan(), "probe")
    assert [int(x) for x in stats[:2]] == [0, 0]
    assert written is True
    assert both == [b"v", 1]
    assert handed == "handled turn"
    assert call.attempts == [1]
    await client.aclose()


@pytest.mark.fake
def test_replies_that_stay_lost_end_as_outcome_unknown_after_bounded_attempts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    executor = sync_executor(client)
    sent = [0]

    def lost(*_: Any, **__: Any) -> Any:
        sent[0] += 1
        raise rexc.TimeoutError("read timed out")

    monkeypatch.setattr(client, "evalsha", lost)
    monkeypatch.setattr(client, "script_load", lost)
    call = stats_call()
    with pytest.raises(OutcomeUnknownError) as caught:
        executor.execute(call, "probe")
    assert caught.value.code == "outcome_unknown"
    assert call.attempts is not None and call.attempts[0] == sent[0] > 1
