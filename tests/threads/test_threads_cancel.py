"""Cancellation (issue 15): the caller's cancel (also from another process), shutdown and a lost
lease stop the runner; a cancelled turn commits nothing and ends its ledger with ``cancelled``;
a retry is a new run; a client that disconnects does not cancel."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import threadfixtures
from httphelpers import ALICE, MALLORY, api_server
from threadfixtures import Service
from threadhelpers import OTHER, OWNER, CountingRunner, run_concurrently, thread_key_names

from memtier.errors import ConversationError
from memtier.threads import (
    AsyncConversationService,
    AsyncRunnerTurn,
    RunnerReply,
    RunnerTurn,
)
from memtier.threads.runner import adapt_sync_runner

MakeService = Callable[..., Service]

# The service tests run on the sync and the asyncio service (issue 13): [sync-fake], ...
make_service = threadfixtures.make_service

# Heartbeats every second: a cross-process cancel lands within a second, and a loop or
# thread stalled under load for up to two seconds does not lose the lease (a lost lease
# makes cancel_run answer "cancelled" for an abandoned run, not "cancelling").
LEASE_MS = 3_000


class WaitsForCancel:
    """A sync runner that blocks until its turn is cancelled (bounded), then returns."""

    def __init__(self, raise_on_cancel: bool = True) -> None:
        self.entered = threading.Event()
        self.saw_cancel = threading.Event()
        self.raise_on_cancel = raise_on_cancel
        self.calls = 0

    def __call__(self, turn: RunnerTurn) -> RunnerReply:
        self.calls += 1
        self.entered.set()
        if self.calls > 1:
            return RunnerReply("second run")
        assert turn.cancelled.wait(120), "never cancelled"
        self.saw_cancel.set()
        if self.raise_on_cancel:
            raise RuntimeError("stopped")
        return RunnerReply("finished anyway")  # ignored: a cancelled turn commits nothing


def _assert_cancelled_ledger(service: Any, thread_id: str, reason: str) -> None:
    records = service.replay(OWNER, thread_id).records
    assert records[-1].type == "cancelled"
    assert records[-1].data["reason"] == reason
    assert records[-1].data["entryIds"] == []
    assert "assistant_message" not in [r.type for r in records]


def _cancel_while_running(
    service: Service, canceller: Any, runner: WaitsForCancel
) -> tuple[str, ConversationError]:
    thread = service.create(OWNER)
    # The canceller's first call opens its client (on Cluster: node discovery and COMMAND,
    # synchronous work on the one test loop the running service beats on); do it now, not
    # while the turn's lease depends on that loop.
    assert canceller.get(OWNER, thread.id).id == thread.id
    results = run_concurrently(
        [
            lambda: service.continue_(OWNER, thread.id, "long task", request_id="job-1"),
            lambda: (runner.entered.wait(60), canceller.cancel_run(OWNER, thread.id, "job-1"))[1],
        ]
    )
    (kind, error), (ckind, cancel) = results
    assert kind == "err" and ckind == "ok", results
    assert cancel.status == "cancelling"
    return thread.id, error


@pytest.mark.parametrize("raise_on_cancel", [True, False])
def test_a_cancelled_turn_commits_nothing_and_a_retry_is_a_new_run(
    make_service: MakeService, backend: Any, raise_on_cancel: bool
) -> None:
    runner = WaitsForCancel(raise_on_cancel)
    service = make_service(runner=runner, lease_ms=LEASE_MS)
    tid, error = _cancel_while_running(service, service, runner)
    assert error.code == "run_cancelled"
    assert runner.saw_cancel.is_set()
    _assert_cancelled_ledger(service, tid, "caller")
    thread = service.get(OWNER, tid)
    assert thread.head_id is None
    entries_key = thread_key_names(service, OWNER, tid)[1]
    assert not backend.sync_client().exists(entries_key)  # nothing committed
    again = service.cancel_run(OWNER, tid, "job-1")
    assert again.status == "cancelled"  # idempotent
    # a retry with the same request id after a cancellation is a new run (any message)
    result = service.continue_(OWNER, tid, "another message", request_id="job-1")
    assert result.status == "completed" and runner.calls == 2
    assert service.cancel_run(OWNER, tid, "job-1").status == "completed"  # left as it is
    assert service.replay(OWNER, tid).terminal


def test_a_cancel_from_another_process_reaches_the_runner(
    make_service: MakeService,
) -> None:
    runner = WaitsForCancel()
    running = make_service(runner=runner, lease_ms=LEASE_MS)
    elsewhere = make_service(lease_ms=LEASE_MS)  # another host: only Redis is shared
    tid, error = _cancel_while_running(running, elsewhere, runner)
    assert error.code == "run_cancelled"
    _assert_cancelled_ledger(running, tid, "caller")


def test_cancel_is_owner_only_and_needs_a_known_run(
    make_service: MakeService,
) -> None:
    service = make_service()
    thread = service.create(OWNER)
    service.continue_(OWNER, thread.id, "hi", request_id="r1")
    cases = ((OTHER, thread.id, "r1"), (OWNER, thread.id, "nope"), (OWNER, "x", "r1"))
    for owner, tid, rid in cases:
        with pytest.raises(ConversationError) as err:
            service.cancel_run(owner, tid, rid)
        assert err.value.code == "not_found"
    assert service.cancel_run(OWNER, thread.id, "r1").status == "completed"


def test_shutdown_cancels_running_turns(
    make_service: MakeService,
) -> None:
    runner = WaitsForCancel()
    service = make_service(runner=runner)
    thread = service.create(OWNER)
    reader = make_service()
    results = run_concurrently(
        [
            lambda: service.continue_(OWNER, thread.id, "long", request_id="s1"),
            lambda: (runner.entered.wait(60), service.close())[1],
        ]
    )
    assert results[0][0] == "err" and results[0][1].code == "run_cancelled", results
    _assert_cancelled_ledger(reader, thread.id, "shutdown")


def test_a_lost_lease_cancels_the_runner(make_service: MakeService, backend: Any) -> None:
    runner = WaitsForCancel()
    service = make_service(runner=runner, lease_ms=LEASE_MS)
    thread = service.create(OWNER)
    lease_key = thread_key_names(service, OWNER, thread.id)[5]

    def steal() -> None:
        assert runner.entered.wait(60)
        backend.sync_client().set(lease_key, "someone-else", px=60_000)

    results = run_concurrently(
        [lambda: service.continue_(OWNER, thread.id, "long", request_id="l1"), steal]
    )
    assert results[0][0] == "err" and results[0][1].code == "thread_busy", results
    assert runner.saw_cancel.is_set()
    assert service.get(OWNER, thread.id).head_id is None


async def test_asyncio_cancellation_of_an_async_runner(
    make_async_service: Callable[..., AsyncConversationService],
) -> None:
    entered = asyncio.Event()
    cleaned: list[str] = []

    async def runner(turn: AsyncRunnerTurn) -> RunnerReply:
        entered.set()
        try:
            await asyncio.sleep(120)
        except asyncio.CancelledError:
            cleaned.append(turn.request_id)
            raise
        return RunnerReply("never")

    service = make_async_service(runner=runner, lease_ms=LEASE_MS)
    thread = await service.create(OWNER)
    turn = asyncio.ensure_future(service.continue_(OWNER, thread.id, "hi", request_id="a1"))
    await asyncio.wait_for(entered.wait(), 60)
    assert (await service.cancel_run(OWNER, thread.id, "a1")).status == "cancelling"
    with pytest.raises(ConversationError) as err:
        await asyncio.wait_for(turn, 60)
    assert err.value.code == "run_cancelled" and cleaned == ["a1"]
    page = await service.replay(OWNER, thread.id)
    assert page.records[-1].type == "cancelled" and page.terminal
    # shutdown: aclose cancels what still runs, and the turn still closes its ledger
    entered.clear()
    turn = asyncio.ensure_future(service.continue_(OWNER, thread.id, "hi", request_id="a2"))
    await asyncio.wait_for(entered.wait(), 60)
    reader = make_async_service()
    await service.aclose()
    with pytest.raises(ConversationError) as err:
        await asyncio.wait_for(turn, 60)
    assert err.value.code == "run_cancelled"
    page = await reader.replay(OWNER, thread.id)
    assert page.records[-1].type == "cancelled"
    assert page.records[-1].data["reason"] == "shutdown"
    await reader.aclose()


@pytest.mark.parametrize("ends", ["raises", "returns"])
def test_a_cancelled_sync_runner_leaves_no_unretrieved_exception(ends: str) -> None:
    """The asyncio service runs a sync runner in a worker thread; cancelled, it sets the
    runner's Event and waits for the thread.  What the runner then ends with is not
    committed -- an exception included -- and must not reach asyncio's "Task exception was
    never retrieved" report (an error in the host's logs for a cancellation that went as
    it should).  No Redis: the wrapper alone, its loop's exception handler watched."""
    entered = threading.Event()

    def runner(turn: RunnerTurn) -> RunnerReply:
        entered.set()
        assert turn.cancelled.wait(30), "never cancelled"
        if ends == "raises":
            raise RuntimeError("stopped")
        return RunnerReply("finished anyway")

    async def emit(event: Any) -> None:  # pragma: no cover - this runner emits nothing
        raise AssertionError(event)

    reported: list[dict[str, Any]] = []

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: reported.append(ctx))
        turn = AsyncRunnerTurn(
            thread=None,  # type: ignore[arg-type]  # the wrapper passes it through
            history=(),
            message="hi",
            request_id="r1",
            leaf_id=None,
            emit=emit,
        )
        task = asyncio.ensure_future(adapt_sync_runner(runner)(turn))
        assert await asyncio.to_thread(entered.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        del task
        for _ in range(3):  # the worker's task is freed with the cancelled frames' cycle
            gc.collect()
            await asyncio.sleep(0)

    asyncio.run(scenario())
    assert reported == []


def test_cancel_over_http_and_a_disconnect_does_not_cancel(backend: Any) -> None:
    gate = threading.Event()
    runner = CountingRunner(gate=gate)
    with api_server(backend, runner=runner) as api, httpx.Client(timeout=60) as c:
        tid = c.post(api.url, json={}, headers=ALICE).json()["id"]
        # a client that gives up (read timeout, connection closed) does not cancel
        with pytest.raises(httpx.TimeoutException):
            httpx.post(
                f"{api.url}/{tid}/continue",
                json={"message": "hi", "requestId": "d1"},
                headers=ALICE,
                timeout=httpx.Timeout(60, read=0.5),
            )
        assert runner.entered.wait(60)
        gate.set()
        deadline = time.monotonic() + 60
        while True:  # the retry collects the turn that went on without its client
            body = {"message": "hi", "requestId": "d1"}
            retry = c.post(f"{api.url}/{tid}/continue", json=body, headers=ALICE)
            if retry.status_code == 200:
                break
            assert retry.json()["code"] == "request_in_progress", retry.text
            assert time.monotonic() < deadline
        assert retry.json()["status"] == "completed" and runner.calls == 1
        done = c.delete(f"{api.url}/{tid}/runs/d1", headers=ALICE)
        assert done.status_code == 200 and done.json() == {
            "threadId": tid,
            "requestId": "d1",
            "status": "completed",
        }
        assert c.delete(f"{api.url}/{tid}/runs/d1", headers=MALLORY).json()["code"] == "not_found"
        assert c.delete(f"{api.url}/{tid}/runs/zz", headers=ALICE).status_code == 404
        assert c.delete(f"{api.url}/{tid}/runs/d1", headers={}).status_code == 401
        odd = c.delete(f"{api.url}/{tid}/runs/a%2Fb", headers=ALICE)  # ids may hold a slash
        assert odd.status_code == 404 and odd.json()["code"] == "not_found"
