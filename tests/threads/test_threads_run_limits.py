"""Shared RunLimits (issue 15): counters in Redis beside the thread, shared by every turn on
every host, visible on get; a turn past a limit is refused before its runner starts; a report
past a turn's allowance is refused; the caps hold under racing turns from several processes."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

import httpx
import pytest
import threadfixtures
from httphelpers import ALICE, api_server
from hypothesis import example, given, settings
from hypothesis import strategies as st
from threadfixtures import Service
from threadhelpers import (
    OWNER,
    codes,
    process_limited_continue,
    run_concurrently,
)

from memtier.errors import ConfigurationError, ConversationError
from memtier.threads import ConversationService, RunLimits, RunnerEvent, RunnerReply, RunnerTurn
from memtier.threads.runlimits import TurnBudget

# The service tests run on the sync and the asyncio service (issue 13): [sync-fake], ...
make_service = threadfixtures.make_service


class Spender:
    """Reports ``tokens`` through emit (or its reply) and counts its calls."""

    def __init__(self, tokens: int = 40, via_reply: bool = False, swallow: bool = False) -> None:
        self.tokens, self.via_reply, self.swallow = tokens, via_reply, swallow
        self.calls = 0
        self.allowances: list[Any] = []

    def __call__(self, turn: RunnerTurn) -> RunnerReply:
        self.calls += 1
        self.allowances.append(turn.allowance)
        if self.via_reply:
            return RunnerReply("spent", usage={"tokens": self.tokens})
        try:
            turn.emit(RunnerEvent("usage", {"tokens": self.tokens, "note": "model call"}))
        except ConversationError:
            if not self.swallow:
                raise
        return RunnerReply("spent")


LIMITS = RunLimits(per_turn={"tokens": 50}, per_thread={"tokens": 120})


@pytest.mark.parametrize("via_reply", [False, True])
def test_turns_consume_the_shared_counter_until_it_is_used_up(
    make_service: Callable[..., Service], via_reply: bool
) -> None:
    runner = Spender(40, via_reply=via_reply)
    service = make_service(runner=runner, run_limits=LIMITS)
    other = make_service(run_limits=LIMITS)  # another host: sees the same counters
    thread = service.create(OWNER)
    for i in range(3):
        service.continue_(OWNER, thread.id, f"turn {i}")
        assert other.get(OWNER, thread.id).usage == {"tokens": 40 * (i + 1)}
    assert runner.allowances == [{"tokens": 50}, {"tokens": 50}, {"tokens": 40}]
    with pytest.raises(ConversationError) as err:
        service.continue_(OWNER, thread.id, "one more")
    assert err.value.code == "limit_exceeded" and err.value.details["limit"] == "run:tokens"
    assert runner.calls == 3  # refused before the runner started
    finished = [r for r in service.replay(OWNER, thread.id).records if r.type == "agent_finished"]
    assert [r.data["usage"] for r in finished] == [{"tokens": 40}] * 3


@pytest.mark.parametrize("swallow", [False, True])
def test_a_report_past_the_allowance_is_refused_and_the_turn_commits_nothing(
    make_service: Callable[..., Service], swallow: bool
) -> None:
    service = make_service(runner=Spender(40), run_limits=LIMITS)
    thread = service.create(OWNER)
    for _ in range(2):
        service.continue_(OWNER, thread.id, "spend")  # 80 of 120
    greedy = make_service(runner=Spender(41, swallow=swallow), run_limits=LIMITS)
    with pytest.raises(ConversationError) as err:  # allowance 40: one token too many
        greedy.continue_(OWNER, thread.id, "too much", request_id="big")
    assert err.value.code == "limit_exceeded" and err.value.details["limit"] == "run:tokens"
    after = service.get(OWNER, thread.id)
    assert after.usage == {"tokens": 80}  # the refused report was not counted
    last = service.replay(OWNER, thread.id).records[-1]
    assert last.type == "error" and last.data["code"] == "limit_exceeded"
    assert last.data["entryIds"] == []
    events = service.export(OWNER, thread.id).events
    assert len([e for e in events if e.type == "agent_finished"]) == 2
    fitting = make_service(runner=Spender(40), run_limits=LIMITS)
    # the request id may be retried; it fits now
    assert fitting.continue_(OWNER, thread.id, "too much", request_id="big").status == "completed"
    assert service.get(OWNER, thread.id).usage == {"tokens": 120}


def test_wall_time_is_measured_and_stops_the_turn(
    make_service: Callable[..., Service],
) -> None:
    def slow(turn: RunnerTurn) -> RunnerReply:
        assert turn.cancelled.wait(60), "the wall-time allowance never fired"
        return RunnerReply("too late")

    service = make_service(runner=slow, run_limits=RunLimits(per_turn={"wall_ms": 200}))
    thread = service.create(OWNER)
    with pytest.raises(ConversationError) as err:
        service.continue_(OWNER, thread.id, "think hard")
    assert err.value.details["limit"] == "run:wall_ms"
    assert service.get(OWNER, thread.id).usage == {"wall_ms": 200}
    assert service.get(OWNER, thread.id).head_id is None


def test_run_limits_validation() -> None:
    for bad in (
        {"per_turn": {"Tokens": 1}},
        {"per_turn": {"tokens": 0}},
        {"per_thread": {"tokens": True}},
        {"per_thread": {"tokens": 2**53 + 1}},
        {"per_turn": {f"m{i}": 1 for i in range(17)}},
    ):
        with pytest.raises(ConfigurationError):
            RunLimits(**bad)


@given(
    st.lists(st.integers(0, 30), max_size=12),
    st.integers(1, 60),
)
@example([30, 1], 30)  # exactly at the allowance, then one more
@settings(max_examples=200)
def test_a_budget_never_passes_its_allowance(reports: list[int], allowance: int) -> None:
    budget = TurnBudget({"tokens": allowance})
    accepted = 0
    for amount in reports:
        try:
            budget.consume({"tokens": amount, "other": 5})
            accepted += amount
        except ConversationError as exc:
            assert exc.code == "limit_exceeded"
            assert accepted + amount > allowance
        assert budget.used.get("tokens", 0) == accepted <= allowance


def test_racing_turns_share_the_cap_exactly(
    make_service: Callable[..., Service],
) -> None:
    limits = RunLimits(per_thread={"tokens": 30})
    services = [
        make_service(runner=Spender(10), run_limits=limits, busy_wait_s=120.0) for _ in range(6)
    ]
    thread = services[0].create(OWNER)
    results = run_concurrently(
        [lambda s=s, i=i: s.continue_(OWNER, thread.id, f"t{i}") for i, s in enumerate(services)]
    )
    assert sorted(codes(results)) == ["limit_exceeded"] * 3 + ["ok"] * 3
    assert services[0].get(OWNER, thread.id).usage == {"tokens": 30}


@pytest.mark.slow
def test_racing_turns_from_several_processes_share_the_cap(backend_no_fake: Any) -> None:
    config = backend_no_fake.config()
    service = ConversationService(backend_no_fake.sync_client(), config)
    thread = service.create(OWNER)
    n = 6
    with ProcessPoolExecutor(n, mp_context=get_context("spawn")) as pool:
        futures = [
            pool.submit(
                process_limited_continue,
                backend_no_fake.url,
                config.namespace,
                thread.id,
                f"proc-{i}",
                10,
                40,
            )
            for i in range(n)
        ]
        results = sorted(f.result(timeout=240) for f in futures)
    assert results == ["limit_exceeded"] * 2 + ["ok"] * 4
    assert service.get(OWNER, thread.id).usage == {"tokens": 40}
    finished = [r for r in service.export(OWNER, thread.id).events if r.type == "agent_finished"]
    assert len(finished) == 4
    service.close()


def test_run_limits_over_http(backend: Any) -> None:
    with (
        api_server(backend, runner=Spender(40), run_limits=LIMITS) as api,
        httpx.Client(timeout=60) as c,
    ):
        tid = c.post(api.url, json={}, headers=ALICE).json()["id"]
        for _ in range(3):
            done = c.post(f"{api.url}/{tid}/continue", json={"message": "x"}, headers=ALICE)
            assert done.status_code == 200, done.text
        assert c.get(f"{api.url}/{tid}", headers=ALICE).json()["usage"] == {"tokens": 120}
        refused = c.post(f"{api.url}/{tid}/continue", json={"message": "x"}, headers=ALICE)
        assert refused.status_code == 400
        assert refused.json()["code"] == "limit_exceeded"
        assert refused.json()["limit"] == "run:tokens"
