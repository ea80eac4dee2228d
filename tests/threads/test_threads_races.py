"""The spec's races, each run many times with real concurrent clients on real Redis and Cluster.

Every client is its own :class:`ConversationService` on its own redis-py
client (its own connections), started together behind a barrier, in threads
of this process -- and, for idempotent continue, in separate processes.  The
thread races run again with :class:`AsyncConversationService` clients on one
event loop (the ``clients`` fixture's ``async`` variant).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

import pytest
from threadfixtures import Service
from threadhelpers import (
    OWNER,
    CountingRunner,
    ServiceMaker,
    codes,
    process_continue,
    run_concurrently,
    scan_keys,
    watch_requests,
)

from memtier.engine import Sleep
from memtier.errors import ConversationError
from memtier.keys import ThreadKeyspace
from memtier.threads import ConversationService, ThreadState

pytestmark = pytest.mark.slow

CLIENTS = 6
ROUNDS = 20


def _clients(maker: ServiceMaker) -> Callable[..., list[Service]]:
    def make(n: int = CLIENTS, threads: dict[str, Any] | None = None, **options: Any) -> Any:
        return [maker(threads, **options) for _ in range(n)]

    return make


@pytest.fixture(params=["sync", "async"])
def clients(
    backend_no_fake: Any, request: pytest.FixtureRequest
) -> Iterator[Callable[..., list[Service]]]:
    """``clients(n, **options)``: n services, each on its own redis-py client; on the sync
    service, and on the asyncio one (issue 13: the async services of a test share one event
    loop, as the tasks of one asyncio worker do; the threads of the test call into it)."""
    maker = ServiceMaker(request.param, backend_no_fake)
    try:
        yield _clients(maker)
    finally:
        maker.shutdown()


@pytest.fixture
def sync_clients(backend_no_fake: Any) -> Iterator[Callable[..., list[Service]]]:
    """``clients`` on the sync service only, for tests that reach into its plumbing."""
    maker = ServiceMaker("sync", backend_no_fake)
    try:
        yield _clients(maker)
    finally:
        maker.shutdown()


def _thread(service: Service, turns: int) -> tuple[str, int]:
    thread = service.create(OWNER)
    for i in range(turns):
        service.continue_(OWNER, thread.id, f"m{i}")
    return thread.id, service.get(OWNER, thread.id).version


def test_branch_branch_race_has_one_winner(clients: Any) -> None:
    services = clients()
    for _ in range(ROUNDS):
        _branch_branch_round(services)


def _branch_branch_round(services: list[Service]) -> None:
    tid, version = _thread(services[0], CLIENTS // 2)
    results = run_concurrently(
        (lambda s=s, leaf=f"e{i + 1}": s.branch(OWNER, tid, leaf, expected_version=version))
        for i, s in enumerate(services)
    )
    outcome = Counter(codes(results))
    assert outcome == {"ok": 1, "metadata_conflict": CLIENTS - 1}, outcome
    winner = next(value for kind, value in results if kind == "ok")
    final = services[0].get(OWNER, tid)
    assert final.branches == winner.branches and len(final.branches) == 1
    assert final.version == version + 1


def test_branches_without_a_given_version_never_lose_a_ref(clients: Any) -> None:
    services = clients()
    for _ in range(ROUNDS // 2):
        _unversioned_branch_round(services)


def _unversioned_branch_round(services: list[Service]) -> None:
    tid, _ = _thread(services[0], CLIENTS // 2)
    results = run_concurrently(
        (lambda s=s, leaf=f"e{i + 1}": s.branch(OWNER, tid, leaf)) for i, s in enumerate(services)
    )
    won = {value.branches[-1].leaf_id for kind, value in results if kind == "ok"}
    assert set(codes(results)) <= {"ok", "metadata_conflict"}
    final = {b.leaf_id for b in services[0].get(OWNER, tid).branches}
    assert final == won  # every success is recorded, nothing else


def test_branch_archive_race_has_one_winner(clients: Any) -> None:
    services = clients()
    for _ in range(ROUNDS):
        _branch_archive_round(services)


def _branch_archive_round(services: list[Service]) -> None:
    tid, version = _thread(services[0], CLIENTS // 2)
    calls = [
        (lambda s=s, leaf=f"e{i + 1}": s.branch(OWNER, tid, leaf, expected_version=version))
        if i % 2
        else (lambda s=s: s.archive(OWNER, tid, expected_version=version))
        for i, s in enumerate(services)
    ]
    results = run_concurrently(calls)
    archives, branches = codes(results)[0::2], codes(results)[1::2]
    assert set(archives) | set(branches) <= {"ok", "metadata_conflict"}
    final = services[0].get(OWNER, tid)
    if final.state is ThreadState.ARCHIVED:
        # archive won: the other archives are no-ops (archiving an archived thread),
        # every branch lost its CAS
        assert archives == ["ok"] * len(archives), archives
        assert branches == ["metadata_conflict"] * len(branches), branches
        assert final.branches == () and final.version == version + 1
    else:
        # one branch won: every other write lost its CAS
        assert archives == ["metadata_conflict"] * len(archives), archives
        assert branches.count("ok") == 1, branches
        assert len(final.branches) == 1 and final.version == version + 1


def test_create_create_race(clients: Any) -> None:
    services = clients()
    for round_ in range(ROUNDS):
        _create_round(services, round_)


def _create_round(services: list[Service], round_: int) -> None:
    tid = f"race-{round_}"
    results = run_concurrently(
        (lambda s=s, i=i: s.create_or_get(OWNER, thread_id=tid, title=f"title {i}"))
        for i, s in enumerate(services)
    )
    # get-or-create: exactly one call created the thread; every other one either read it
    # (it existed before its write: 200, the winner's thread unchanged) or lost the true
    # race (it appeared between its read and its create-only write: metadata_conflict)
    outcome = Counter(codes(results))
    assert set(outcome) <= {"ok", "metadata_conflict"}, outcome
    oks = [value for kind, value in results if kind == "ok"]
    assert sum(created for _, created in oks) == 1, oks
    winner = next(thread for thread, created in oks if created)
    assert all(thread == winner for thread, _ in oks)
    assert services[0].get(OWNER, tid) == winner  # no loser ever overwrote it
    same = f"same-{round_}"
    results = run_concurrently(
        (lambda s=s: s.create(OWNER, thread_id=same, title="same")) for s in services
    )
    assert codes(results) == ["ok"] * CLIENTS
    assert len({value.model_dump_json() for _, value in results}) == 1


def test_branch_and_archive_racing_delete_never_recreate(
    backend_no_fake: Any, clients: Any
) -> None:
    services = clients()
    probe = backend_no_fake.sync_client()
    pattern = ThreadKeyspace(services[0].config.namespace).owner("acme", "alice").pattern()
    for _ in range(ROUNDS):
        tid = _delete_round(services)
        assert [k for k in scan_keys(backend_no_fake, probe, pattern) if tid in k] == []


def _delete_round(services: list[Service]) -> str:
    tid, version = _thread(services[0], CLIENTS // 2)
    calls: list[Callable[[], Any]] = [lambda: services[0].delete(OWNER, tid)]
    for i, s in enumerate(services[1:]):
        if i % 2:
            calls.append(lambda s=s: s.archive(OWNER, tid, expected_version=version))
        else:
            calls.append(
                lambda s=s, leaf=f"e{i + 1}": s.branch(OWNER, tid, leaf, expected_version=version)
            )
    results = run_concurrently(calls)
    assert codes(results)[0] == "ok"
    assert set(codes(results)[1:]) <= {"ok", "not_found", "metadata_conflict"}
    with pytest.raises(ConversationError) as info:
        services[0].get(OWNER, tid)
    assert info.value.code == "not_found"
    return tid


@pytest.mark.parametrize("cap", [16, 4])
def test_active_branch_cap_is_exact_under_concurrency(clients: Any, cap: int) -> None:
    n = 2 * cap
    services = clients(n, threads={"max_active_branches": cap})
    for _ in range(2 if cap == 16 else 8):
        _cap_round(services, cap)


def _cap_round(services: list[Service], cap: int) -> None:
    n = len(services)
    tid, _ = _thread(services[0], cap)

    def attempt(s: Service, leaf: str) -> str:
        for _ in range(500):  # bounded: re-read and retry after a lost CAS
            try:
                s.branch(OWNER, tid, leaf)
                return "ok"
            except ConversationError as exc:
                if exc.code != "metadata_conflict":
                    return exc.code
        raise AssertionError("never settled")

    results = run_concurrently(
        (lambda s=s, leaf=f"e{i + 1}": attempt(s, leaf)) for i, s in enumerate(services)
    )
    outcome = Counter(value for _, value in results)
    assert outcome == {"ok": cap, "branch_limit": n - cap}, outcome
    assert len({b.leaf_id for b in services[0].get(OWNER, tid).branches}) == cap


def test_concurrent_continues_are_serialized_never_interleaved(clients: Any) -> None:
    services = clients(busy_wait_s=240.0)
    for _ in range(4):
        _serialized_round(services)


def _serialized_round(services: list[Service]) -> None:
    tid = services[0].create(OWNER).id
    results = run_concurrently(
        (lambda s=s, i=i: s.continue_(OWNER, tid, f"message {i}", request_id=f"q{i}"))
        for i, s in enumerate(services)
    )
    assert codes(results) == ["ok"] * CLIENTS
    by_user_entry = {}
    for _, result in results:
        user, assistant = result.entries
        assert int(user.id[1:]) % 2 == 1 and assistant.id == f"e{int(user.id[1:]) + 1}"
        assert assistant.parent_id == user.id
        by_user_entry[user.id] = (user, assistant)
    # one linear chain e1 <- e2 <- ... <- e(2n): every turn hangs off the previous one
    for k in range(1, CLIENTS):
        assert by_user_entry[f"e{2 * k + 1}"][0].parent_id == f"e{2 * k}"
    assert services[0].get(OWNER, tid).head_id == f"e{2 * CLIENTS}"
    # the ledger: each run's rows are contiguous, agent_started .. agent_finished
    rows = services[0].replay(OWNER, tid, limit=100).records
    blocks: list[list[Any]] = []
    for row in rows:
        if not blocks or blocks[-1][0].request_id != row.request_id:
            blocks.append([])
        blocks[-1].append(row)
    assert len(blocks) == CLIENTS, "interleaved ledger rows"
    for block in blocks:
        assert block[0].type == "agent_started" and block[-1].type == "agent_finished"


def test_a_busy_thread_fails_the_loser_clearly_when_not_waiting(clients: Any) -> None:
    gate = threading.Event()
    runner = CountingRunner(gate=gate)
    first, second = clients(2, runner=runner, busy_wait_s=0.0)
    tid = first.create(OWNER).id
    holder = threading.Thread(target=lambda: first.continue_(OWNER, tid, "slow", request_id="a"))
    holder.start()
    assert runner.entered.wait(60)
    with pytest.raises(ConversationError) as info:
        second.continue_(OWNER, tid, "fast", request_id="b")
    assert info.value.code == "thread_busy" and info.value.http_status == 409
    gate.set()
    holder.join(60)
    entries = first.export(OWNER, tid).events
    assert {e.request_id for e in entries} == {"a"}  # nothing of the loser was stored
    assert second.continue_(OWNER, tid, "fast", request_id="b").entries[0].id == "e3"


class _SleepCounter:
    """Counts the waits of duplicates that found their request in flight."""

    def __init__(self) -> None:
        self.sleepers: set[int] = set()
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)

    def wrap(self, service: ConversationService) -> None:
        def see(request: Any) -> None:
            if isinstance(request, Sleep):
                with self.lock:
                    self.sleepers.add(id(service))
                    self.changed.notify_all()

        watch_requests(service, see)

    def wait_for(self, n: int) -> None:
        """Until n distinct services waited for an in-flight request."""
        with self.lock:
            assert self.changed.wait_for(lambda: len(self.sleepers) >= n, 120)


def test_idempotent_continue_runs_the_runner_once_for_concurrent_duplicates(
    sync_clients: Any,
) -> None:
    # Sync only: the duplicates' waits are observed by wrapping the private _execute.
    for _ in range(8):
        _duplicates_round(sync_clients)


def _duplicates_round(clients: Any) -> None:
    gate = threading.Event()
    runner = CountingRunner(gate=gate)
    services = clients(runner=runner, inflight_wait_s=240.0)
    counter = _SleepCounter()
    for s in services:
        counter.wrap(s)
    tid = services[0].create(OWNER).id

    def release() -> None:
        counter.wait_for(CLIENTS - 1)  # every duplicate saw the request in flight
        gate.set()

    opener = threading.Thread(target=release)
    opener.start()
    results = run_concurrently(
        (lambda s=s: s.continue_(OWNER, tid, "once", request_id="dup")) for s in services
    )
    opener.join(120)
    assert codes(results) == ["ok"] * CLIENTS
    assert runner.calls == 1
    assert len({value.model_dump_json() for _, value in results}) == 1
    # ... and a later retry still returns it without running anything
    assert services[1].continue_(OWNER, tid, "once", request_id="dup") == results[0][1]
    assert runner.calls == 1
    assert len(services[0].replay(OWNER, tid).records) == 4


def test_in_flight_duplicate_gets_request_in_progress_when_not_waiting(clients: Any) -> None:
    gate = threading.Event()
    runner = CountingRunner(gate=gate)
    first, second = clients(2, runner=runner, inflight_wait_s=0.0)
    tid = first.create(OWNER).id
    holder = threading.Thread(target=lambda: first.continue_(OWNER, tid, "m", request_id="r"))
    holder.start()
    assert runner.entered.wait(60)
    with pytest.raises(ConversationError) as info:
        second.continue_(OWNER, tid, "m", request_id="r")
    assert info.value.code == "request_in_progress" and info.value.http_status == 409
    gate.set()
    holder.join(60)
    assert second.continue_(OWNER, tid, "m", request_id="r").status.value == "completed"
    assert runner.calls == 1


def test_idempotent_continue_across_processes(backend_no_fake: Any) -> None:
    """Separate processes (spawned), one request id: the runner runs once in total."""
    config = backend_no_fake.config()
    service = ConversationService(backend_no_fake.sync_client(), config)
    tid = service.create(OWNER).id
    probe = backend_no_fake.sync_client()
    ns = config.namespace
    n = 4
    with ProcessPoolExecutor(n, mp_context=get_context("spawn")) as pool:
        futures = [
            pool.submit(process_continue, backend_no_fake.url, ns, tid, "xproc") for _ in range(n)
        ]
        # Open the runner's gate once every other process has seen the request in flight.
        import time

        deadline = time.monotonic() + 240
        while probe.scard(f"{{{ns}:test}}:sleepers") < n - 1:
            assert time.monotonic() < deadline, "duplicates never arrived in flight"
            for f in futures:
                if f.done():
                    f.result()  # surface a child's failure
            time.sleep(0.05)
        probe.set(f"{{{ns}:test}}:gate", "1")
        results = [f.result(timeout=240) for f in futures]
    assert int(probe.get(f"{{{ns}:test}}:runner-calls") or 0) == 1
    assert len(set(results)) == 1
