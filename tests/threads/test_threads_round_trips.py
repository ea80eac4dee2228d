"""Issue 12 (threads): what one operation costs in round trips, and that the merged claim
keeps every promise of the continue protocol.

* A successful continue with the echo runner is three requests: ``run_claim`` (lease, run
  record, the two opening rows, the thread hash and the history inline), the runner's
  ``events_append`` and ``run_commit``; the same whatever the history's length.
* A replay page is one ``read_events``; an export one ``HGETALL`` plus one
  ``read_events`` per page: constant per page, never per row.
* A generated adversary (any messages, outcomes, branches, lost claim replies, a history
  too long to send inline) against a reference model of the thread: the runner sees the
  exact branch path, the ledger names the right base and entry ids, no opening row is
  written twice, and entry ids stay unique.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis.exceptions
import threadfixtures
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from threadfixtures import Service
from threadhelpers import OWNER, ModelRunner, counter_by_label

from memtier.engine import Batch, Command, Handoff, ScriptCall
from memtier.errors import ConversationError
from memtier.threads import ConversationService, RunnerReply, RunnerTurn
from memtier.threads import turns as turns_module

make_service = threadfixtures.make_service
service = threadfixtures.service
make_sync_service = threadfixtures.make_sync_service
make_asyncio_service = threadfixtures.make_asyncio_service

MakeService = Callable[..., Service]


def _name(request: Any) -> str:
    if isinstance(request, ScriptCall):
        return request.script
    if isinstance(request, Command):
        return request.method
    if isinstance(request, Batch):
        return "batch"
    if isinstance(request, Handoff):
        return "handoff"
    return type(request).__name__


Watch = Callable[[Any, "str | None"], contextlib.AbstractContextManager[list[Any]]]


def watch_execute(service: Any, watch: Watch) -> None:
    """Run every request the service's executor performs (either API) inside
    ``watch(request, operation)``: the list it yields gets the reply appended (an
    exception propagates through it)."""
    executor = getattr(service, "async_service", service).executor
    original = executor.execute
    if inspect.iscoroutinefunction(original):

        async def execute_async(request: Any, operation: str | None = None) -> Any:
            with watch(request, operation) as reply:
                reply.append(await original(request, operation))
            return reply[-1]

        executor.execute = execute_async
    else:

        def execute(request: Any, operation: str | None = None) -> Any:
            with watch(request, operation) as reply:
                reply.append(original(request, operation))
            return reply[-1]

        executor.execute = execute


def count_requests(service: Any) -> list[str]:
    """Record every request the service's executor performs (either API), by name; a
    hand-off to the runner is listed as ``handoff`` (no round trip)."""
    seen: list[str] = []

    def named(request: Any, operation: str | None) -> contextlib.nullcontext[list[Any]]:
        seen.append(_name(request))
        return contextlib.nullcontext([])

    watch_execute(service, named)
    return seen


def round_trips(seen: list[str]) -> list[str]:
    return [name for name in seen if name != "handoff"]


# --- continue -------------------------------------------------------------------------------------


@pytest.mark.parametrize("earlier_turns", [0, 1, 12])
def test_a_successful_echo_continue_is_claim_emit_commit(
    make_service: MakeService, earlier_turns: int
) -> None:
    service = make_service(cursor_secret="s" * 32)
    tid = service.create(OWNER).id
    for i in range(earlier_turns):
        service.continue_(OWNER, tid, f"m{i}")
    seen = count_requests(service)
    result = service.continue_(OWNER, tid, "hello")
    assert round_trips(seen) == ["run_claim", "events_append", "run_commit"]
    assert "handoff" in seen
    # the runner saw the whole history (the echo says how long it was)
    assert result.entries[1].content == f"echo ({2 * earlier_turns} earlier entries): hello"
    # and the ledger holds the opening rows in order, with the claim's ids
    records = service.replay(OWNER, tid).records
    rows = [r for r in records if r.request_id == result.request_id]
    assert [r.type for r in rows] == [
        "agent_started",
        "user_message",
        "echo.reply",
        "assistant_message",
        "agent_finished",
    ]
    base = f"e{2 * earlier_turns}" if earlier_turns else None
    assert rows[0].data["leafId"] == base
    assert rows[1].data == {"entryId": result.entries[0].id, "content": "hello"}


def test_a_runner_without_events_costs_two_round_trips(make_service: MakeService) -> None:
    service = make_service(runner=lambda turn: RunnerReply("ok"))
    tid = service.create(OWNER).id
    service.continue_(OWNER, tid, "first")
    seen = count_requests(service)
    service.continue_(OWNER, tid, "second")
    assert round_trips(seen) == ["run_claim", "run_commit"]


def test_a_history_beyond_the_inline_budget_is_read_by_id(
    make_service: MakeService, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = make_service()
    tid = writer.create(OWNER).id
    for i in range(3):
        writer.continue_(OWNER, tid, f"m{i}")
    # Another process (the writer's own history cache holds the entries it wrote)
    service = make_service()
    monkeypatch.setattr(turns_module, "_INLINE_HISTORY_BYTES", 200)  # about one entry
    seen = count_requests(service)
    result = service.continue_(OWNER, tid, "late")
    assert round_trips(seen) == ["run_claim", "hmget", "events_append", "run_commit"]
    assert result.entries[1].content == "echo (6 earlier entries): late"


def slow_runner(seconds: float) -> Callable[[RunnerTurn], RunnerReply]:
    """A runner that works ``seconds`` (or until the turn is cancelled), then replies."""

    def slow(turn: RunnerTurn) -> RunnerReply:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not turn.cancelled.is_set():
            time.sleep(0.05)
        return RunnerReply("slow reply")

    return slow


def test_a_turn_longer_than_its_lease_is_kept_alive_by_heartbeats(
    make_service: MakeService,
) -> None:
    # The lease is 2 s; the runner takes 5 s: only renewals keep run_commit's lease.  At
    # 3 s (past 1.5 leases) the thread must still be busy; the renews seen by then are
    # in the failure message (when, and what each answered), so a miss says whether
    # beats went out late, failed, or were answered "lost".
    lease_s = 2.0
    service = make_service(
        runner=slow_runner(2.5 * lease_s), lease_ms=int(lease_s * 1000), busy_wait_s=0
    )
    other = make_service(lease_ms=int(lease_s * 1000), busy_wait_s=0)
    tid = service.create(OWNER).id
    started = time.monotonic()
    beats = record_renews(service, started)
    counted = lease_beats()
    outcome: list[Any] = []
    worker = threading.Thread(target=lambda: outcome.append(service.continue_(OWNER, tid, "go")))
    worker.start()
    time.sleep(1.5 * lease_s)  # past the first lease: still held, by renewals
    with pytest.raises(ConversationError) as busy:
        other.continue_(OWNER, tid, "meanwhile")
    assert busy.value.code == "thread_busy", beats
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert outcome and outcome[0].entries[1].content == "slow reply", beats
    sent = [at for at, _, _ in beats]
    assert len(sent) >= 3 and max(b - a for a, b in itertools.pairwise(sent)) < lease_s, beats
    # Every renew is counted by its outcome on the metric: each answered one as renewed;
    # one that stalled past the next beat on a loaded machine (abandoned: the next beat
    # keeps the lease, as the gap check above shows) as missed.  CI once saw a renew on
    # a Valkey Cluster take over 0.67 s (the beat interval): renewed 6, missed 1 of 7.
    now = lease_beats()
    answered = sum(1 for _, _, reply in beats if reply == "[0]")
    renewed = now.get("renewed", 0) - counted.get("renewed", 0)
    missed = now.get("missed", 0) - counted.get("missed", 0)
    assert renewed >= answered and renewed + missed >= len(sent), (now, beats)


def test_a_stuck_renew_does_not_hold_up_the_beats_behind_it(
    make_asyncio_service: MakeService,
) -> None:
    # The first renew never answers (a dead connection, a retry back-off): the asyncio
    # heartbeat abandons it when the next beat is due, and that beat keeps the lease.
    service = make_asyncio_service(runner=slow_runner(2.5), lease_ms=1_000, busy_wait_s=0)
    executor = service.async_service.executor
    original = executor.execute
    stuck: list[Any] = []

    async def first_renew_hangs(request: Any, operation: str | None = None) -> Any:
        if operation == "lease_renew" and not stuck:
            stuck.append(request)
            await asyncio.Event().wait()  # until cancelled
        return await original(request, operation)

    executor.execute = first_renew_hangs  # type: ignore[method-assign]
    tid = service.create(OWNER).id
    beats = record_renews(service, time.monotonic())
    counted = lease_beats()
    result = service.continue_(OWNER, tid, "go")
    assert result.entries[1].content == "slow reply", beats
    assert stuck and "CancelledError" in beats[0][2], beats
    assert [outcome for _, _, outcome in beats[1:]] and all(
        outcome == "[0]" for _, _, outcome in beats[1:]
    ), beats
    # The abandoned renew is a missed beat on the metric, the others renewed ones.
    now = lease_beats()
    assert now.get("missed", 0) - counted.get("missed", 0) >= 1, now
    assert now.get("renewed", 0) - counted.get("renewed", 0) >= len(beats) - 1, now


def lease_beats() -> dict[str, float]:
    """``memtier_thread_lease_beats_total`` by outcome, as Prometheus reads it."""
    return counter_by_label("memtier_thread_lease_beats", "outcome")


def record_renews(service: Any, started: float) -> list[tuple[float, float, str]]:
    """Each ``lease_renew`` the service's executor performs (either API), as (seconds
    after ``started`` it was sent, seconds it took, its reply or exception)."""
    beats: list[tuple[float, float, str]] = []

    @contextlib.contextmanager
    def noted(request: Any, operation: str | None) -> Iterator[list[Any]]:
        if operation != "lease_renew":
            yield []
            return
        sent = time.monotonic()
        reply: list[Any] = []
        try:
            yield reply
        except BaseException as exc:
            reply.append(exc)
            raise
        finally:
            outcome = repr(reply[0]) if reply else "no reply"
            beats.append((round(sent - started, 3), round(time.monotonic() - sent, 3), outcome))

    watch_execute(service, noted)
    return beats


def test_short_turns_start_no_heartbeat_thread(make_sync_service: MakeService) -> None:
    service = make_sync_service()
    tid = service.create(OWNER).id
    before = {t.ident for t in threading.enumerate() if t.name == "memtier-lease"}
    for i in range(20):
        service.continue_(OWNER, tid, f"m{i}")
    started = {t.ident for t in threading.enumerate() if t.name == "memtier-lease"} - before
    assert started == set()


# --- replay and export pages ----------------------------------------------------------------------


@pytest.mark.parametrize("turns", [1, 30])
def test_replay_and_export_pages_cost_the_same_whatever_their_rows(
    make_service: MakeService, turns: int
) -> None:
    service = make_service(cursor_secret="s" * 32)
    tid = service.create(OWNER).id
    for i in range(turns):
        service.continue_(OWNER, tid, f"m{i}")
    seen = count_requests(service)
    page = service.replay(OWNER, tid, limit=100)
    assert len(page.records) == min(5 * turns, 100) and round_trips(seen) == ["read_events"]
    seen.clear()
    first = service.replay(OWNER, tid, limit=4)
    assert round_trips(seen) == ["read_events"] and first.next_cursor
    seen.clear()
    service.replay(OWNER, tid, cursor=first.next_cursor, limit=4)
    assert round_trips(seen) == ["read_events"]
    seen.clear()
    exported = service.export(OWNER, tid)
    assert len(exported.events) == 5 * turns
    pages = -(-5 * turns // 100)  # replay_page_rows = 100 rows per page
    assert round_trips(seen) == ["hgetall"] + ["read_events"] * pages


# --- a generated adversary against a reference model ----------------------------------------------

_MESSAGES = st.text(
    alphabet=st.sampled_from(
        ['"', "\\", "\x00", "\x01", "a", "é", "💥", " ", "}", "{", "/", "e", "1"]
    ),
    min_size=1,
    max_size=12,
).filter(lambda s: bool(s.replace("\x00", "").replace("\x01", "").strip()))
_STEPS = st.lists(
    st.tuples(
        st.sampled_from(["ok", "ok", "fail", "deny"]),
        _MESSAGES,
        st.booleans(),  # the first claim's reply is lost (its retry replays our own claim)
        st.integers(min_value=-1, max_value=6),  # continue from the n-th committed reply
    ),
    min_size=1,
    max_size=7,
)


class _LoseClaimReplies:
    """Wraps run_claim: when ``lose`` is set, its next call runs in Redis and then raises a
    connection error (the reply was lost): the executor's retry replays our own claim."""

    def __init__(self, script: Any) -> None:
        self.script, self.lose, self.lost = script, False, 0

    def __call__(self, client: Any, keys: Any, args: Any) -> Any:
        if self.lose:
            self.lose = False
            self.script(client, keys, args)
            self.lost += 1
            raise redis.exceptions.ConnectionError("connection reset (injected)")
        return self.script(client, keys, args)


class _Scripts:
    def __init__(self, registry: Any, wrapper: Any) -> None:
        self.registry, self.wrapper = registry, wrapper

    def __getitem__(self, name: str) -> Any:
        return self.wrapper if name == "run_claim" else self.registry[name]

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.registry, attr)


@pytest.mark.parametrize("inline_bytes", [1 << 20, 150])
@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=_STEPS)
@example(steps=[("ok", "a", True, -1), ("ok", '"}\\', True, -1)])  # lost replies, JSON text
@example(steps=[("ok", "a", False, -1), ("fail", "b", True, 0), ("ok", "c", False, 0)])
@example(steps=[("deny", "x", True, -1), ("ok", "y", False, -1), ("ok", "z", True, 0)])
def test_any_turns_and_lost_claim_replies_match_the_model(
    backend: Any, monkeypatch: pytest.MonkeyPatch, inline_bytes: int, steps: list[Any]
) -> None:
    monkeypatch.setattr(turns_module, "_INLINE_HISTORY_BYTES", inline_bytes)
    runner = ModelRunner()
    service = ConversationService(backend.sync_client(), backend.config(), runner=runner)
    try:
        _check_against_the_model(service, runner, steps)
    finally:
        service.close()


def _check_against_the_model(
    service: ConversationService, runner: ModelRunner, steps: list[Any]
) -> None:
    flaky = _LoseClaimReplies(service.scripts["run_claim"])
    service.scripts = _Scripts(service.scripts, flaky)  # type: ignore[assignment]
    tid = service.create(OWNER).id
    parent: dict[str, str | None] = {}  # the model: committed entry -> its parent
    head: str | None = None
    replies: list[str] = []  # committed assistant entries, in order
    expected_rows: list[tuple[str, Any]] = []
    for outcome, message, lose, from_reply in steps:
        runner.outcome = outcome
        flaky.lose = lose
        leaf = replies[from_reply] if 0 <= from_reply < len(replies) else None
        if leaf is not None:
            service.branch(OWNER, tid, leaf)  # a recorded ref (again: no change)
        base = leaf or head
        path: list[str] = []
        cursor = base
        while cursor is not None:
            path.append(cursor)
            cursor = parent[cursor]
        path.reverse()
        try:
            result = service.continue_(OWNER, tid, message, leaf_id=leaf)
        except ConversationError as exc:
            assert outcome == "fail" and exc.code == "runner_failed"
            result = None
        assert runner.seen[-1] == tuple(path)  # the runner saw exactly the branch path
        user_id = None
        if result is not None and result.entries:
            user, assistant = result.entries
            user_id = user.id
            assert (user.parent_id, assistant.parent_id) == (base, user.id)
            assert user.id not in parent and assistant.id not in parent  # ids never reused
            parent[user.id], parent[assistant.id] = base, user.id
            replies.append(assistant.id)
            head = assistant.id
        expected_rows.append(("agent_started", base))
        expected_rows.append(("user_message", user_id))
    assert flaky.lost == sum(1 for s in steps if s[2])
    records = service.replay(OWNER, tid).records
    opening = [r for r in records if r.type in ("agent_started", "user_message")]
    # one pair of opening rows per turn (a replayed claim writes none), naming the base
    assert len(opening) == 2 * len(steps)
    for (etype, expected), record in zip(expected_rows, opening, strict=True):
        assert record.type == etype
        if etype == "agent_started":
            assert record.data["leafId"] == expected
        elif expected is not None:
            assert record.data["entryId"] == expected  # the committed user entry's id
    announced = [r.data["entryId"] for r in opening if r.type == "user_message"]
    assert len(set(announced)) == len(announced)  # never two messages under one id
    thread = service.get(OWNER, tid)
    assert thread.head_id == head
