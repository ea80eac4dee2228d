"""Concurrency bursts on a *fresh* store or service (issue 16): 20, 200, 2,000 calls at once.

On fakeredis, a real redis-server and a real Redis Cluster; conversation memory and
threads; from many threads (sync API) and from one event loop (asyncio API); and the same
bursts while the cluster shard that holds the keys fails over (``CLUSTER FAILOVER`` on
its replica; the cluster is healthy and settled afterwards, with the roles swapped).  The
failover bursts send calls in three phases, so that calls are in flight across it: the
first tenth at once (their completions start the failover), then one call per 10 ms while
it runs, then the rest (at least a quarter) once both nodes agree on the new roles.

Each burst checks: every call returns or raises a *typed* memtier error (nothing else);
a healthy burst succeeds entirely; during a failover, every retryable failure retried
with the same id ends stored exactly once, and each session's sequence is gapless.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from bursthelpers import (
    FAILOVER_TIMEOUT_S,
    FailoverAfter,
    quiet_shard,
    settled,
    settled_topology,
    wait_for,
)
from servers import RedisClusterServers, require_real_redis

from memtier import (
    AsyncConversationService,
    AsyncConversationStore,
    AvatarMessage,
    ConversationKey,
    ConversationService,
    ConversationStore,
    MemtierConfig,
    MemtierError,
    Ownership,
    create_async_conversation_service,
    create_conversation_service,
    retry,
)
from memtier.keys import MemoryKeyspace, ThreadKeyspace

SIZES = [20, 200, 2000]
TURNS_PER_KEY = 100  # below max_turns_per_session: no compaction in the middle of a burst
SYNC_WORKERS = 64  # threads sharing one sync store (more than its max_connections)
RETRY_ROUNDS = 3  # the caller's own retries of retryable failures, same turn ids
OWNER = Ownership("acme", "burst")


def keys_for(n: int) -> list[ConversationKey]:
    return [ConversationKey(str(uuid.uuid4()), "im") for _ in range(max(1, n // TURNS_PER_KEY))]


def plan(n: int) -> list[tuple[ConversationKey, str]]:
    """(key, turn id) of each of the ``n`` appends; the text is the turn id."""
    keys = keys_for(n)
    return [(keys[i % len(keys)], f"turn-{i}") for i in range(n)]


def typed(outcome: Any) -> None:
    """The promise: a result, or a memtier error -- never a bare client-library exception."""
    if isinstance(outcome, BaseException) and not isinstance(outcome, MemtierError):
        raise AssertionError(f"untyped error escaped: {outcome!r}") from outcome


def run_sync(calls: list[Callable[[], Any]]) -> list[Any]:
    def guarded(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(SYNC_WORKERS) as pool:
        return list(pool.map(guarded, calls, timeout=600))


async def run_async(calls: list[Callable[[], Any]]) -> list[Any]:
    async def guarded(call: Callable[[], Any]) -> Any:
        try:
            return await call()
        except Exception as exc:
            return exc

    return list(await asyncio.gather(*(guarded(c) for c in calls)))


# A failover burst's calls in three phases, so that calls are in flight across the
# failover however long Redis takes (0.1 s to over 10 s here): the first ``after`` at once
# (their completions start the failover); then the middle ones one per PACE_S while it runs;
# the rest (at least a quarter) once it has ended.  A failover that must be asked again
# stops the middle phase first (``FailoverAfter.quiet``; see ``failover_to``): the promise
# under test is that of one coordinated failover.
PACE_S = 0.01


@dataclass
class Phases:
    """How many calls were sent once the failover had begun, and after it had ended."""

    during: int = 0
    after: int = 0

    def next_during(self, middle: list[Any], failover: FailoverAfter) -> Any | None:
        """The next middle-phase call, already counted in flight (send it now), or None:
        that phase is over.  At least one goes as the failover begins (it polls the nodes
        before it asks); none once the writers were stopped for a retried failover."""
        if not middle or (self.during > 0 and failover.finished.is_set()):
            return None
        if not failover.enter_unless_quiet():
            return None
        self.during += 1
        return middle.pop(0)

    def check(self) -> None:
        assert self.during > 0, "no call was sent while the failover ran"
        assert self.after > 0, "no call was sent after the failover"


def _split(calls: list[Any], failover: FailoverAfter) -> tuple[list[Any], list[Any], list[Any]]:
    reserve = max(1, len(calls) // 4)
    assert failover.after < len(calls) - reserve, "too few calls for three phases"
    return calls[: failover.after], calls[failover.after : -reserve], calls[-reserve:]


def run_sync_across(calls: list[Callable[[], Any]], failover: FailoverAfter) -> list[Any]:
    """:func:`run_sync` in the three phases above (the failover started by the first)."""
    first, middle, last = _split(calls, failover)
    phases = Phases()

    def guarded(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception as exc:
            return exc
        finally:
            failover.done()

    def send(call: Callable[[], Any], entered: bool = False) -> Any:
        if not entered:
            failover.enter()
        return pool.submit(guarded, call)

    with ThreadPoolExecutor(SYNC_WORKERS) as pool:
        futures = [send(call) for call in first]
        assert failover.started.wait(FAILOVER_TIMEOUT_S), "the failover never started"
        while (call := phases.next_during(middle, failover)) is not None:
            futures.append(send(call, entered=True))
            time.sleep(PACE_S)
        assert failover.finished.wait(FAILOVER_TIMEOUT_S * 3), "the failover never ended"
        phases.after += len(middle) + len(last)
        futures += [send(call) for call in middle + last]
        outcomes = [future.result(timeout=600) for future in futures]
    phases.check()
    return outcomes


async def run_async_across(calls: list[Callable[[], Any]], failover: FailoverAfter) -> list[Any]:
    """:func:`run_async` in the three phases above (the failover started by the first)."""
    first, middle, last = _split(calls, failover)
    phases = Phases()

    async def guarded(call: Callable[[], Any]) -> Any:
        try:
            return await call()
        except Exception as exc:
            return exc
        finally:
            failover.done()

    def send(call: Callable[[], Any], entered: bool = False) -> Any:
        if not entered:
            failover.enter()
        return asyncio.ensure_future(guarded(call))

    tasks = [send(call) for call in first]
    started = await asyncio.to_thread(failover.started.wait, FAILOVER_TIMEOUT_S)
    assert started, "the failover never started"
    while (call := phases.next_during(middle, failover)) is not None:
        tasks.append(send(call, entered=True))
        await asyncio.sleep(PACE_S)
    ended = await asyncio.to_thread(failover.finished.wait, FAILOVER_TIMEOUT_S * 3)
    assert ended, "the failover never ended"
    phases.after += len(middle) + len(last)
    tasks += [send(call) for call in middle + last]
    outcomes = list(await asyncio.gather(*tasks))
    phases.check()
    return outcomes


def check_memory(
    config: MemtierConfig,
    turns: list[tuple[ConversationKey, str]],
    outcomes: list[Any],
    *,
    all_succeed: bool,
) -> None:
    """Typed outcomes; retried with the same ids, every turn is stored once, gapless."""
    for outcome in outcomes:
        typed(outcome)
    failed = [(k, t) for (k, t), o in zip(turns, outcomes, strict=True) if isinstance(o, Exception)]
    if all_succeed:
        assert not failed, [o for o in outcomes if isinstance(o, Exception)][:3]
    receipts = {
        t: o for (_, t), o in zip(turns, outcomes, strict=True) if not isinstance(o, Exception)
    }
    with ConversationStore.from_config(config) as store:
        for _ in range(RETRY_ROUNDS):  # the documented contract: retry retryable, same id
            still = []
            for k, t in failed:
                try:
                    receipts[t] = store.append(k, AvatarMessage(text=t, turn_id=t))
                except MemtierError as exc:
                    assert exc.retryable, f"{t}: non-retryable {exc!r}"
                    still.append((k, t))
            failed = still
        assert not failed, f"{len(failed)} turns still failing after {RETRY_ROUNDS} retries"
        by_key: dict[str, list[str]] = {}
        for k, t in turns:
            by_key.setdefault(str(k.avatar), []).append(t)
        for k in {k for k, _ in turns}:
            ctx = store.context(k)
            seqs = [turn.seq for turn in ctx.turns]
            texts = [turn.fields["text"] for turn in ctx.turns]
            expected = by_key[str(k.avatar)]
            assert seqs == list(range(1, len(expected) + 1)), "sequence not gapless"
            assert sorted(texts) == sorted(expected), "a turn lost or stored twice"
            for turn in ctx.turns:
                assert receipts[turn.fields["text"]].seq == turn.seq


def memory_calls_sync(store: ConversationStore, turns: list[Any]) -> list[Callable[[], Any]]:
    return [lambda k=k, t=t: store.append(k, AvatarMessage(text=t, turn_id=t)) for k, t in turns]


def memory_calls_async(store: AsyncConversationStore, turns: list[Any]) -> list[Callable[[], Any]]:
    return [lambda k=k, t=t: store.append(k, AvatarMessage(text=t, turn_id=t)) for k, t in turns]


# --- conversation memory -----------------------------------------------------------------------


@pytest.mark.parametrize("n", SIZES)
def test_memory_sync_burst_on_a_fresh_store(backend: Any, n: int) -> None:
    turns = plan(n)
    config = backend.config()
    with ConversationStore.from_config(config) as store:  # fresh: nothing warmed it
        outcomes = run_sync(memory_calls_sync(store, turns))
    check_memory(config, turns, outcomes, all_succeed=True)


@pytest.mark.parametrize("n", SIZES)
async def test_memory_async_burst_on_a_fresh_store(backend: Any, n: int) -> None:
    turns = plan(n)
    config = backend.config()
    store = AsyncConversationStore.from_config(config)  # fresh: not opened, not warmed
    try:
        outcomes = await run_async(memory_calls_async(store, turns))
        assert store.guard.opens == 1  # one initialisation, shared by every first call
    finally:
        await store.close()
    await asyncio.to_thread(check_memory, config, turns, outcomes, all_succeed=True)


async def test_issue_snippet_passes_on_a_fresh_store(backend: Any) -> None:
    """The issue's snippet, verbatim but for the URL: 20 concurrent appends, cold store."""
    st = AsyncConversationStore.from_config(
        MemtierConfig(redis_url=backend.url, namespace=backend.namespace)
    )
    k = ConversationKey(str(uuid.uuid4()), "im")
    try:
        receipts = await asyncio.gather(
            *[st.append(k, AvatarMessage(text=f"a{i}")) for i in range(20)]
        )
        assert sorted(r.seq for r in receipts) == list(range(1, 21))
    finally:
        await st.close()


async def test_async_store_life_cycle_open_close_reopen(backend: Any) -> None:
    store = AsyncConversationStore.from_config(backend.config())
    assert await store.open() is store
    assert await store.open() is store and store.guard.opens == 1  # idempotent
    k = ConversationKey(str(uuid.uuid4()), "im")
    assert (await store.append(k, AvatarMessage(text="one"))).seq == 1
    await store.close()
    assert (await store.append(k, AvatarMessage(text="two"))).seq == 2  # reopens lazily
    await store.close()
    async with AsyncConversationStore.from_config(backend.config()) as entered:
        assert (await entered.append(k, AvatarMessage(text="three"))).seq == 3
    opened = await AsyncConversationStore.open(backend.config())
    try:
        assert [t.seq for t in (await opened.context(k)).turns] == [1, 2, 3]
    finally:
        await opened.close()


NAMESPACES_TRIED = 12  # namespaces under the test's own, to find a quiet shard (of 3)


def failover_config(backend: Any, slot_key: Callable[[str], str]) -> tuple[MemtierConfig, str]:
    """A config whose ``slot_key(namespace)`` is on the shard :func:`quiet_shard` picks, and
    that key.  The namespace extends the fixture's, so the fixture still deletes its keys."""
    namespaces = [f"{backend.namespace}-{i}" for i in range(NAMESPACES_TRIED)]
    keys = [slot_key(namespace) for namespace in namespaces]
    chosen = quiet_shard(backend.server, keys)
    return MemtierConfig.load(redis_url=backend.url, namespace=namespaces[chosen]), keys[chosen]


def _partition_key(namespace: str) -> str:
    return MemoryKeyspace(namespace).partition(0).meta


def _owner_slot_key(namespace: str) -> str:
    return ThreadKeyspace(namespace).owner(OWNER.tenant_id, OWNER.user_id).index


ON_CLUSTER = pytest.mark.parametrize(
    "backend", [pytest.param("cluster", marks=pytest.mark.cluster)], indirect=True
)


@ON_CLUSTER
@pytest.mark.parametrize("n", SIZES)
def test_memory_sync_burst_during_a_failover(backend: Any, n: int) -> None:
    retry.set_testing(False)  # real backoff: the retry horizon must cover the failover
    turns = plan(n)
    config, partition = failover_config(backend, _partition_key)
    with settled_topology(backend.server), ConversationStore.from_config(config) as store:
        failover = FailoverAfter(backend.server, partition, after=max(1, n // 10))
        outcomes = run_sync_across(memory_calls_sync(store, turns), failover)
        failover.join()
    with failover.explained():
        check_memory(config, turns, outcomes, all_succeed=False)


@ON_CLUSTER
@pytest.mark.parametrize("n", SIZES)
async def test_memory_async_burst_during_a_failover(backend: Any, n: int) -> None:
    retry.set_testing(False)
    turns = plan(n)
    config, partition = failover_config(backend, _partition_key)
    store = AsyncConversationStore.from_config(config)
    with settled_topology(backend.server):
        try:
            failover = FailoverAfter(backend.server, partition, after=max(1, n // 10))
            outcomes = await run_async_across(memory_calls_async(store, turns), failover)
            await asyncio.to_thread(failover.join)
        finally:
            await store.close()
    with failover.explained():
        await asyncio.to_thread(check_memory, config, turns, outcomes, all_succeed=False)


# --- conversation threads ----------------------------------------------------------------------


def check_threads(
    service: ConversationService, outcomes: list[Any], request_ids: list[str], *, all_succeed: bool
) -> None:
    """Typed outcomes; retried with the same request ids, exactly one thread per request."""
    for outcome in outcomes:
        typed(outcome)
    failed = [r for r, o in zip(request_ids, outcomes, strict=True) if isinstance(o, Exception)]
    if all_succeed:
        assert not failed, [o for o in outcomes if isinstance(o, Exception)][:3]
    for _ in range(RETRY_ROUNDS):
        still = []
        for rid in failed:
            try:
                service.create(OWNER, request_id=rid, title=rid)
            except MemtierError as exc:
                assert exc.retryable, f"{rid}: non-retryable {exc!r}"
                still.append(rid)
        failed = still
    assert not failed
    titles: list[str] = []
    cursor = None
    for _ in range(len(request_ids) // 50 + 2):  # bounded paging
        page = service.list(OWNER, cursor=cursor)
        titles += [t.title or "" for t in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert cursor is None
    assert sorted(titles) == sorted(request_ids), "a thread lost or created twice"


def create_calls(service: Any, request_ids: list[str]) -> list[Callable[[], Any]]:
    return [lambda r=r: service.create(OWNER, request_id=r, title=r) for r in request_ids]


@pytest.mark.parametrize("n", SIZES)
def test_threads_sync_burst_on_a_fresh_service(backend: Any, n: int) -> None:
    request_ids = [f"req-{i}" for i in range(n)]

    with create_conversation_service(backend.config()) as service:
        outcomes = run_sync(create_calls(service, request_ids))
        check_threads(service, outcomes, request_ids, all_succeed=True)
        # continue on 20 of them at once: one turn each, a gapless two-entry transcript
        threads = [t for t in service.list(OWNER, limit=20).items]
        results = run_sync(
            [lambda t=t: service.continue_(OWNER, t.id, "hi", request_id="c1") for t in threads]
        )
        for result in results:
            typed(result)
            assert not isinstance(result, Exception), result
            assert result.status == "completed" and len(result.entries) == 2


@pytest.mark.parametrize("n", SIZES)
async def test_threads_async_burst_on_a_fresh_service(backend: Any, n: int) -> None:
    request_ids = [f"req-{i}" for i in range(n)]

    service = create_async_conversation_service(backend.config())
    try:
        outcomes = await run_async(create_calls(service, request_ids))
        assert service.guard.opens == 1
        page = await service.list(OWNER, limit=20)
        results = await run_async(
            [lambda t=t: service.continue_(OWNER, t.id, "hi", request_id="c1") for t in page.items]
        )
        for result in results:
            typed(result)
            assert not isinstance(result, Exception), result
            assert result.status == "completed" and len(result.entries) == 2
    finally:
        await service.aclose()
    with create_conversation_service(backend.config()) as checker:  # same Redis, fresh
        await asyncio.to_thread(check_threads, checker, outcomes, request_ids, all_succeed=True)


@ON_CLUSTER
@pytest.mark.parametrize("n", SIZES)
def test_threads_sync_burst_during_a_failover(backend: Any, n: int) -> None:
    retry.set_testing(False)
    request_ids = [f"req-{i}" for i in range(n)]
    config, owner_key = failover_config(backend, _owner_slot_key)
    with (
        settled_topology(backend.server),
        ConversationService(backend.sync_client(), config) as service,
    ):
        failover = FailoverAfter(backend.server, owner_key, after=max(1, n // 10))
        outcomes = run_sync_across(create_calls(service, request_ids), failover)
        failover.join()
    with failover.explained(), ConversationService(backend.sync_client(), config) as checker:
        check_threads(checker, outcomes, request_ids, all_succeed=False)


@ON_CLUSTER
@pytest.mark.parametrize("n", SIZES)
async def test_threads_async_burst_during_a_failover(backend: Any, n: int) -> None:
    retry.set_testing(False)
    request_ids = [f"req-{i}" for i in range(n)]
    config, owner_key = failover_config(backend, _owner_slot_key)
    service = AsyncConversationService(backend.async_client(), config)
    with settled_topology(backend.server):
        try:
            failover = FailoverAfter(backend.server, owner_key, after=max(1, n // 10))
            outcomes = await run_async_across(create_calls(service, request_ids), failover)
            await asyncio.to_thread(failover.join)
        finally:
            await service.aclose()
    with failover.explained(), ConversationService(backend.sync_client(), config) as checker:
        await asyncio.to_thread(check_threads, checker, outcomes, request_ids, all_succeed=False)


PAUSE_S = 7.0  # the primary's stop: past Redis's 5 s manual-failover limit, below 15 s


class _PausableCluster(RedisClusterServers):
    """A private cluster whose node processes the test may stop and continue."""

    def pid(self, port: int) -> int:
        for node in self._nodes:
            if node.port == port and node.pid is not None:
                return node.pid
        raise KeyError(port)


@pytest.mark.cluster
def test_a_failover_given_up_is_asked_again_with_the_writers_stopped() -> None:
    """The helper's retry path, which the bursts meet only when Redis gives a failover
    up: the primary is stopped (SIGSTOP) as the failover is asked, so the handshake
    cannot finish and Redis gives it up after 5 s; it is continued after 7 s, well inside
    the node timeout (15 s: no automatic failover).  The writers must be stopped before
    the failover is asked again, and it ends with both nodes agreeing on the new roles.
    On a private cluster, so the shared one's shards keep their vote windows."""
    require_real_redis("redis-server")
    with _PausableCluster() as cluster:
        wait_for("a healthy, settled cluster", lambda: settled(cluster))
        failover = FailoverAfter(cluster, "{retry}:k", after=1)
        primary = cluster.pid(failover.primary)
        os.kill(primary, signal.SIGSTOP)
        resume = threading.Timer(PAUSE_S, os.kill, (primary, signal.SIGCONT))
        resume.start()
        try:
            failover.enter()
            failover.done()  # starts it
            writes = 0
            while not failover.finished.is_set() and failover.enter_unless_quiet():
                time.sleep(0.01)  # a write in flight while the failover runs, as in bursts
                failover.done()
                writes += 1
            failover.join()
        finally:
            resume.join()
            os.kill(primary, signal.SIGCONT)  # (a no-op once the timer has run)
    with failover.explained():
        assert failover.quiet.is_set(), "no retry stopped the writers"
        asked = [event for event in failover.events if "CLUSTER FAILOVER" in event]
        assert len(asked) >= 2 and failover.in_flight == 0 and writes > 0
