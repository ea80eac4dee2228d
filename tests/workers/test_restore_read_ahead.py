"""The restore reads its next batch while Redis restores the last one.

* The executors: an ``Overlap`` of a ``ScriptBatch`` on the lean pipeline runs the work
  between the batch's write and its read (the same replies as the batch alone, the work
  once, the connection in step after a work error, the work's time left out of the
  scripts' latency metric); a batch sent call by call runs it beside its first call; the
  generic path runs it first; the asyncio executor returns the batch's replies.
* The restore against a model: sessions that today's bounds refuse, anywhere in the
  file and in runs longer than a batch, are skipped with one event each while the rest
  are restored in batches of every bound, on every backend; the reading ahead stops at
  a batch's bounds and never loses the session it read past them.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from workhelpers import (
    Clock,
    InFlight,
    assert_exact_accounting,
    key,
    persistent_store,
    scraped,
    wipe_store,
)

from memtier import AvatarMessage, ConversationKey, ConversationStore, ReasonCode
from memtier.config import MemtierConfig
from memtier.connection import LeanPool
from memtier.engine import Command, Overlap, ScriptBatch, ScriptCall
from memtier.memory import persistence
from memtier.memory.persistence import RestoreProgress

# ----------------------------------------------------------------------------- executors


def _store_with_sessions(url: str, n: int) -> tuple[ConversationStore, list[ScriptCall]]:
    """A store in a namespace of its own with ``n`` sessions, and their page calls."""
    config = MemtierConfig.load(redis_url=url, namespace="rahead" + os.urandom(4).hex())
    store = ConversationStore.from_config(config, recover=False)
    calls = []
    for i in range(n):
        k = key(i + 1)
        store.append(k, AvatarMessage(text=f"hello {i}"))
        calls.append(
            persistence.snapshot_page_call(store.core, store.core.partition_for(k), [k.member])
        )
    return store, calls


def _unclocked(replies: list[Any]) -> list[Any]:
    return [r[2:] for r in replies]  # the server clock moves between two runs


def test_overlap_of_a_script_batch_runs_the_work_between_write_and_read(
    redis_server: Any,
) -> None:
    store, calls = _store_with_sessions(redis_server.url, 3)
    total = "memtier_script_duration_seconds_sum{script=snapshot_page}"
    try:
        alone = store.executor.execute(ScriptBatch(tuple(calls)))
        spy = InFlight()
        seen: list[bool] = []
        with mock.patch.object(LeanPool, "pipeline", spy.pipeline()):
            replies = store.executor.execute(
                Overlap(ScriptBatch(tuple(calls)), lambda: seen.append(spy.on))
            )
            assert _unclocked(replies) == _unclocked(alone)
            assert seen == [True] and spy.with_work == 1

            def fail() -> None:
                seen.append(spy.on)
                raise ValueError("the next batch did not read")

            with pytest.raises(ValueError):
                store.executor.execute(Overlap(ScriptBatch(tuple(calls)), fail))
            assert seen == [True, True]  # raised after the batch's replies were read:
            assert _unclocked(store.executor.execute(ScriptBatch(tuple(calls)))) == _unclocked(
                alone
            )  # the kept connection answers in step
            assert store.executor.execute(Command("ping")) is True
            before = scraped(total)
            store.executor.execute(Overlap(ScriptBatch(tuple(calls)), lambda: time.sleep(0.3)))
            # Three calls' shares of one round trip, without the 0.3 s of work.
            assert 0 < scraped(total) - before < 0.3
    finally:
        store.close()


def test_overlap_of_a_batch_sent_call_by_call_runs_the_work_beside_its_first_call(
    redis_server: Any,
) -> None:
    store, calls = _store_with_sessions(redis_server.url, 2)
    try:
        alone = [store.executor.execute(c) for c in calls]
        in_execute: list[bool] = []
        original = LeanPool.execute

        def execute(pool: Any, args: Any, packed: Any, during: Any = None) -> Any:
            in_execute.append(during is not None)
            return original(pool, args, packed, during)

        seen: list[str] = []
        with mock.patch.object(LeanPool, "execute", execute):
            # One call: not a pipeline; the work rides on the call's own write.
            reply = store.executor.execute(
                Overlap(ScriptBatch((calls[0],)), lambda: seen.append("one"))
            )
        assert _unclocked(reply) == _unclocked(alone[:1])
        assert seen == ["one"] and in_execute == [True]
        # The generic path (a wrapped client, fakeredis): the work first, then the calls.
        store.executor.lean = False
        order: list[str] = []
        hooked = store.executor.on_script
        hooked.append(lambda script, args, reply: order.append(script))
        replies = store.executor.execute(
            Overlap(ScriptBatch(tuple(calls)), lambda: order.append("work"))
        )
        assert _unclocked(replies) == _unclocked(alone)
        assert order == ["work", "snapshot_page", "snapshot_page"]
        assert store.executor.execute(Overlap(ScriptBatch(()), lambda: order.append("w"))) == []
        assert order[-1] == "w"
    finally:
        store.close()


async def test_async_overlap_of_a_script_batch(redis_server: Any) -> None:
    from memtier import AsyncConversationStore

    sync_store, calls = _store_with_sessions(redis_server.url, 2)
    config = MemtierConfig.load(redis_url=redis_server.url, namespace=sync_store.config.namespace)
    store = AsyncConversationStore.from_config(config)
    try:
        alone = await store.executor.execute(ScriptBatch(tuple(calls)))
        done: list[str] = []
        replies = await store.executor.execute(
            Overlap(ScriptBatch(tuple(calls)), lambda: done.append("w"))
        )
        assert _unclocked(replies) == _unclocked(alone) and done == ["w"]

        def fail() -> None:
            raise ValueError("boom")

        with pytest.raises(ValueError):
            await store.executor.execute(Overlap(ScriptBatch(tuple(calls)), fail))
        assert _unclocked(await store.executor.execute(ScriptBatch(tuple(calls)))) == _unclocked(
            alone
        )
    finally:
        await store.aclose()
        sync_store.close()


# ----------------------------------------------------------------------------- the model

# Restored under max_turn_bytes=1000: a session of one 1,500-byte turn (no summary) has
# no turn that fits today's bounds and is skipped alone with a restore_skipped event.
_TODAY = {"max_turn_bytes": 1000}
_SKIPPED_TEXT = "x" * 1500


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    fits=st.lists(st.booleans(), max_size=30),
    batch_sessions=st.integers(1, 3),
    batch_bytes=st.sampled_from([1, 250, 48 * 1024]),
)
@example(fits=[False] * 7 + [True] * 3 + [False] * 5, batch_sessions=2, batch_bytes=48 * 1024)
@example(fits=[True] * 9, batch_sessions=3, batch_bytes=48 * 1024)  # batches end on the last
@example(fits=[False] * 4, batch_sessions=1, batch_bytes=1)
@example(fits=[], batch_sessions=1, batch_bytes=1)
def test_restore_skips_and_restores_as_the_model_says(
    backend: Any, fits: list[bool], batch_sessions: int, batch_bytes: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = persistent_store(backend, Path(tmp), Clock())
        wipe_store(backend, store)
        contexts: dict[ConversationKey, Any] = {}
        skipped: set[ConversationKey] = set()
        for i, fit in enumerate(fits):
            k = key(i + 1, "im" if i % 3 else "public")
            store.append(k, AvatarMessage(text=f"short turn {i}" if fit else _SKIPPED_TEXT))
            if fit:
                contexts[k] = store.context(k)
            else:
                skipped.add(k)
        flushed = store.flush()
        wipe_store(backend, store)
        store.close()
        today = persistent_store(backend, Path(tmp), Clock(), **_TODAY)
        batches: list[int] = []
        execute = today.executor.execute

        def counting(request: Any, operation: str | None = None) -> Any:
            inner = request.request if isinstance(request, Overlap) else request
            if isinstance(inner, ScriptBatch):
                assert inner.calls, "an empty batch was sent"
                batches.append(len(inner.calls))
            return execute(request, operation)

        batches_module = persistence.restorebatch
        fill = batches_module.BatchReader.fill

        def bounded_fill(reader: Any) -> Any:
            batch = fill(reader)
            assert len(reader.skipped) <= batch_sessions  # the skipped wait, bounded too
            return batch

        seen: list[RestoreProgress] = []
        try:
            with (
                mock.patch.object(batches_module, "RESTORE_BATCH_SESSIONS", batch_sessions),
                mock.patch.object(batches_module, "RESTORE_BATCH_BYTES", batch_bytes),
                mock.patch.object(today.executor, "execute", counting),
                mock.patch.object(batches_module.BatchReader, "fill", bounded_fill),
            ):
                report = today.recover(force=True, progress=seen.append)
            assert report.outcome == "restored", report.message
            assert (report.restored, report.skipped) == (len(contexts), len(skipped))
            assert sum(batches) == len(contexts)
            assert all(1 <= n <= batch_sessions for n in batches)
            if batch_bytes == 1:
                assert set(batches) <= {1}
            events = [e for e in today.events(limit=1000) if e.reason is ReasonCode.RESTORE_SKIPPED]
            assert sorted((e.avatar, e.channel) for e in events) == sorted(
                (k.avatar, k.channel) for k in skipped
            )
            for k, ctx in contexts.items():
                again = today.context(k)
                assert again.messages == ctx.messages and again.turns == ctx.turns
            for k in skipped:
                assert today.context(k).session_id is None
            assert_exact_accounting(today)
            last = seen[-1]
            assert last.finished and last.sessions_done == flushed.sessions == len(fits)
            assert last.restored == len(contexts)
        finally:
            wipe_store(backend, today)
            today.close()
