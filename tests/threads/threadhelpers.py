"""Helpers shared by the conversation-thread tests (imported by module name)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from asyncadapter import AdapterPool, AsyncAdapter, PrivateLoop
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from memtier.engine import Plan, Request
from memtier.keys import ThreadKeyspace
from memtier.threads import (
    AgentDenied,
    AsyncConversationService,
    ConversationService,
    Ownership,
    RunnerEvent,
    RunnerReply,
    RunnerTurn,
)

OWNER = Ownership("acme", "alice")
OTHER = Ownership("acme", "mallory")  # same tenant, another user
OTHER_TENANT = Ownership("globex", "alice")  # same user id, another tenant


def watch_requests(service: Any, see: Callable[[Request], None]) -> None:
    """Call ``see(request)`` for every request a plan of ``service`` yields, before it is
    performed (Sleep included): wraps the public executor's ``run``."""
    run = service.executor.run

    def watching(plan: Plan[Any]) -> Plan[Any]:
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                request = plan.throw(error) if error is not None else plan.send(reply)
            except StopIteration as stop:
                return stop.value
            see(request)
            try:
                reply, error = (yield request), None
            except Exception as exc:
                reply, error = None, exc

    service.executor.run = lambda plan, operation=None, **kw: run(watching(plan), operation, **kw)


def scan_keys(backend: Any, client: Any, pattern: str) -> list[str]:
    """Every key matching ``pattern`` (on a cluster: on every primary)."""
    if backend.is_cluster:
        found = client.scan_iter(match=pattern, count=1000, target_nodes=client.PRIMARIES)
    else:
        found = client.scan_iter(match=pattern, count=1000)
    return sorted(k.decode() if isinstance(k, bytes) else str(k) for k in found)


def thread_key_names(service: ConversationService, owner: Ownership, thread_id: str) -> list[str]:
    keyspace = ThreadKeyspace(service.config.namespace)
    keys = keyspace.owner(owner.tenant_id, owner.user_id).thread(thread_id)
    return list(keys.all())


class Clock:
    """A test clock (epoch ms) that advances 1 ms per reading, so timestamps are distinct."""

    def __init__(self, start: int = 1_700_000_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        self.now += 1
        return self.now


@dataclass
class CountingRunner:
    """A sync runner that counts its calls; optionally blocks on ``gate`` and emits events."""

    reply: Callable[[RunnerTurn], str] = lambda turn: f"reply to {turn.message}"
    events: Sequence[RunnerEvent] = ()
    gate: threading.Event | None = None
    entered: threading.Event = field(default_factory=threading.Event)
    calls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    fail: BaseException | None = None

    def __call__(self, turn: RunnerTurn) -> RunnerReply:
        with self.lock:
            self.calls += 1
        self.entered.set()
        for event in self.events:
            turn.emit(event)
        if self.gate is not None:
            # the gate, or the turn's cancellation signal (a cancelled turn stops early)
            deadline = time.monotonic() + 120
            while not self.gate.wait(0.02) and not turn.cancelled.is_set():
                assert time.monotonic() < deadline, "test gate never opened"
        if self.fail is not None:
            raise self.fail
        return RunnerReply(self.reply(turn))


class ModelRunner:
    """A sync runner for the generated adversaries: records the history ids each turn
    saw, emits one event, and fails or denies when ``outcome`` says so."""

    def __init__(self) -> None:
        self.outcome = "ok"  # "ok", "fail" (the runner raises) or "deny" (AgentDenied)
        self.seen: list[tuple[str, ...]] = []

    def __call__(self, turn: RunnerTurn) -> RunnerReply:
        self.seen.append(tuple(e.id for e in turn.history))
        turn.emit(RunnerEvent("model.step", {"n": len(turn.history)}))
        if self.outcome == "fail":
            raise RuntimeError("model exploded")
        if self.outcome == "deny":
            raise AgentDenied("no")
        return RunnerReply(f"reply to {turn.message}")


def run_concurrently(
    functions: Iterable[Callable[[], Any]], *, timeout: float = 240.0
) -> list[tuple[str, Any]]:
    """Start every function in its own thread at once (a barrier); ("ok", value) or ("err", exc)."""
    fns = list(functions)
    barrier = threading.Barrier(len(fns))
    results: list[tuple[str, Any]] = [("err", RuntimeError("did not finish"))] * len(fns)

    def worker(i: int, fn: Callable[[], Any]) -> None:
        barrier.wait()
        try:
            results[i] = ("ok", fn())
        except BaseException as exc:
            results[i] = ("err", exc)

    threads = [threading.Thread(target=worker, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a concurrent client hung"
    return results


def codes(results: Sequence[tuple[str, Any]]) -> list[str]:
    """'ok' or the error code of each result."""
    return [
        "ok" if kind == "ok" else getattr(value, "code", repr(value)) for kind, value in results
    ]


def process_continue(url: str | None, namespace: str, thread_id: str, request_id: str) -> str:
    """Run in a spawned process: one continue whose runner counts its calls in Redis.

    The runner blocks until the test sets ``{ns:test}:gate``; a duplicate that waits for
    the in-flight request adds its pid to ``{ns:test}:sleepers``.
    """
    import os
    import time

    from memtier.config import MemtierConfig
    from memtier.engine import Sleep
    from memtier.threads import create_conversation_service

    tag = "{" + namespace + ":test}"
    config = MemtierConfig.load(redis_url=url, namespace=namespace)
    service = create_conversation_service(config, inflight_wait_s=240.0)
    probe = service.client

    def runner(turn: RunnerTurn) -> RunnerReply:
        probe.incr(f"{tag}:runner-calls")
        deadline = time.monotonic() + 240
        while not probe.exists(f"{tag}:gate"):
            assert time.monotonic() < deadline, "gate never opened"
            time.sleep(0.02)
        return RunnerReply(f"ran in {os.getpid()}")

    service.runner = runner

    def see(request: Any) -> None:
        if isinstance(request, Sleep):
            probe.sadd(f"{tag}:sleepers", os.getpid())

    watch_requests(service, see)
    try:
        result = service.continue_(OWNER, thread_id, "cross-process", request_id=request_id)
        return result.model_dump_json()
    finally:
        service.close()


def process_limited_continue(
    url: str | None, namespace: str, thread_id: str, request_id: str, tokens: int, cap: int
) -> str:
    """Run in a spawned process: one continue under ``RunLimits(per_thread={"tokens": cap})``
    whose runner reports ``tokens``; returns "ok" or the error code."""
    from memtier.config import MemtierConfig
    from memtier.errors import ConversationError
    from memtier.threads import RunLimits, create_conversation_service

    config = MemtierConfig.load(redis_url=url, namespace=namespace)

    def runner(turn: RunnerTurn) -> RunnerReply:
        turn.emit(RunnerEvent("usage", {"tokens": tokens}))
        return RunnerReply("spent")

    service = create_conversation_service(
        config,
        runner=runner,
        run_limits=RunLimits(per_thread={"tokens": cap}),
        busy_wait_s=240.0,
    )
    try:
        service.continue_(OWNER, thread_id, "spend", request_id=request_id)
        return "ok"
    except ConversationError as exc:
        return exc.code
    finally:
        service.close()


SERVICE_APIS = ("sync", "async")


class AsyncServiceAdapter(AsyncAdapter):
    """An :class:`AsyncConversationService` behind :class:`ConversationService`'s method
    names (tests/asyncadapter.py: awaited on a private loop; private names refused).
    ``close`` is the async service's ``aclose``."""

    def __init__(self, service: AsyncConversationService, loop: PrivateLoop) -> None:
        super().__init__(service, loop)
        self.async_service = service

    def close(self, *, cancel_wait_s: float = 10.0) -> None:
        self.loop.run(self.async_service.aclose(cancel_wait_s=cancel_wait_s))


# A service of either API: the sync one, or the asyncio one behind its adapter.
Service = ConversationService | AsyncServiceAdapter


class ServiceMaker:
    """``make_service(threads={...}, **service_options)`` on either API.

    ``api="sync"`` builds a :class:`ConversationService` on a sync client of the backend;
    ``api="async"`` an :class:`AsyncConversationService` on an asyncio client (as users
    build it), behind an :class:`AsyncServiceAdapter` on one private loop per test.  Sync
    runners work on both (the async service runs them in a worker thread).
    """

    def __init__(self, api: str, backend: Any) -> None:
        assert api in SERVICE_APIS, api
        self.api = api
        self.backend = backend
        self._pool = AdapterPool()

    def __call__(self, threads: dict[str, Any] | None = None, **options: Any) -> Service:
        config = self.backend.config(threads=threads) if threads else self.backend.config()
        if self.api == "sync":
            return ConversationService(self.backend.sync_client(), config, **options)
        service = self._pool.build(
            lambda: AsyncConversationService(self.backend.async_client(), config, **options)
        )
        adapter = AsyncServiceAdapter(service, self._pool.loop)
        self._pool.on_shutdown(adapter.close)
        return adapter

    def shutdown(self) -> None:
        self._pool.shutdown()


def counter_by_label(name: str, label: str) -> dict[str, float]:
    """The counter ``<name>_total`` by the value of ``label``, scraped from the default
    registry the way Prometheus reads it."""
    text = generate_latest(REGISTRY).decode()
    return {
        sample.labels[label]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == name
        for sample in family.samples
        if sample.name == f"{name}_total"
    }
