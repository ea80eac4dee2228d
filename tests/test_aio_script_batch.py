"""A script batch on a standalone asyncio client: one coroutine, one write, one retry.

On an auto-pipelined standalone ``redis.asyncio.Redis``, ``AsyncExecutor`` sends a
``ScriptBatch`` (the restore's batches of ``restore_session`` calls) as one attempt:
every call packed once and queued at once in the pipeline's batch, awaited together
(:func:`memtier.scriptbatch.run_script_batch_pipelined`), retried whole as the sync
lean batch is.  Before, each call was a task of its own, with its own retries and
guard.  Held here on Redis and Valkey 9:

* a Hypothesis property over batches of pushes and script replies (error replies among
  them): the asyncio batch gives what the sync batch gives on the same server (the
  reference: one pipeline there), the same replies or the same error, and leaves every
  list as it does; it is one write, no call takes the per-call path, every call's hook
  and attempt count are as one by one, and no connection or guard slot is left taken;
* NOSCRIPT (the script cache flushed): every call is loaded and re-sent once, and runs
  once;
* a connection lost while the batch's replies are read: the whole batch is re-sent
  (create-only calls give the replies of a batch with no fault, each key written once),
  the lost connection never serves again; with no retry left the error is raised and
  the next batch answers in step;
* the caller cancelled after the batch was written: nothing is left taken, and the next
  batch gets its own replies;
* a store's restore sends its batches this way and restores every session.
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from redis.exceptions import ConnectionError as RedisConnectionError
from test_autopipeline import _in_use
from test_lean_call import PROBE_LUA
from test_lean_cluster_batch import _CALL, PUSH_LUA, TAGS, _fresh_lists, _list_key, _lists

from memtier import (
    AsyncConversationStore,
    AvatarMessage,
    ConversationKey,
    ConversationStore,
    MemtierConfig,
    MemtierError,
)
from memtier import autopipeline as autopipeline_module
from memtier.autopipeline import PipelineBounds
from memtier.connection import AsyncClientGuard, SyncClientGuard, connect_async, connect_sync
from memtier.engine import ScriptBatch, ScriptCall
from memtier.executor import AsyncExecutor, SyncExecutor
from memtier.memory.persistence.shared import snapshot_dir_for
from memtier.retry import RetryPolicy
from memtier.scripts import ScriptRegistry, load_registry

pytestmark = pytest.mark.real

CLAIM_LUA = """#!lua
-- KEYS[1] a key; ARGV[1] a value: set if the key is new (create-only); returns its value.
redis.call("SET", KEYS[1], ARGV[1], "NX")
return redis.call("GET", KEYS[1])
"""
# A reply deadline well past any stall of this shared machine: a timeout (retried) would
# change the attempt counts the property checks.
SETTINGS: dict[str, Any] = {
    "max_connections": 2,
    "socket_timeout_seconds": 10.0,
    "connect_timeout_seconds": 0.5,
    "pool_timeout_seconds": 5.0,
}


def _registry(root: Path) -> ScriptRegistry:
    folder = root / "aiobatch"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "probe-1.lua").write_text(PROBE_LUA, encoding="utf-8")
    (folder / "push-1.lua").write_text(PUSH_LUA, encoding="utf-8")
    (folder / "claim-1.lua").write_text(CLAIM_LUA, encoding="utf-8")
    return load_registry("aiobatch", root)


def _config(url: str) -> MemtierConfig:
    return MemtierConfig.load(redis_url=url, redis=SETTINGS)


def _executor(client: Any, scripts: ScriptRegistry, url: str, **policy: Any) -> AsyncExecutor:
    config = _config(url)
    return AsyncExecutor(
        client,
        scripts,
        AsyncClientGuard(client, config.redis),
        RetryPolicy(**policy),
        pipeline=PipelineBounds.from_settings(config.redis),
    )


def _calls(spec: list[tuple[Any, ...]]) -> tuple[ScriptCall, ...]:
    out = []
    for kind, tag, rest in spec:
        args = (rest,) if kind == "push" else rest
        out.append(ScriptCall(kind, (_list_key(tag),), args, attempts=[0]))
    return tuple(out)


def _slots_free(executor: AsyncExecutor) -> bool:
    guard = executor.guard
    return guard._slots._value == guard.limit  # type: ignore[attr-defined]


class PerCallPath:
    """The scripts of the calls that took the per-call path (``AsyncExecutor._script``)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._original = AsyncExecutor._script

    def __enter__(self) -> PerCallPath:
        original = self._original

        def counted(executor: AsyncExecutor, call: ScriptCall) -> Any:
            self.names.append(call.script)
            return original(executor, call)

        self._patch = mock.patch.object(AsyncExecutor, "_script", counted)
        self._patch.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._patch.stop()


@pytest.fixture(scope="module", params=["redis_server", "valkey_server"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> ScriptRegistry:
    return _registry(tmp_path_factory.mktemp("aiobatch"))


@pytest.fixture(scope="module")
def reference(server: Any, scripts: ScriptRegistry) -> Iterator[tuple[Any, SyncExecutor]]:
    """The sync client and executor on the same server: the sync lean batch."""
    client, _ = connect_sync(_config(server.url))
    guard = SyncClientGuard(_config(server.url).redis)
    yield client, SyncExecutor(client, scripts, guard, RetryPolicy())
    for tag in range(TAGS):
        client.delete(_list_key(tag))
    client.close()


def _load(client: Any, scripts: ScriptRegistry) -> None:
    """Every script loaded: no NOSCRIPT re-sends in a test's counts."""
    for script in scripts:
        client.script_load(script.source)


def _sync_outcome(executor: SyncExecutor, batch: ScriptBatch) -> tuple[Any, ...]:
    try:
        return ("replies", executor.execute(batch))
    except Exception as exc:  # the same class and message on both paths
        return ("error", type(exc).__name__, str(exc))


async def _async_outcome(executor: AsyncExecutor, batch: ScriptBatch) -> tuple[Any, ...]:
    try:
        return ("replies", await executor.execute(batch))
    except Exception as exc:
        return ("error", type(exc).__name__, str(exc))


async def _run_batch(
    url: str, scripts: ScriptRegistry, batch: ScriptBatch
) -> tuple[tuple[Any, ...], int, int, int, list[tuple[str, Any]], bool]:
    """(outcome, writes, calls written, calls through the per-call path, hooks seen, nothing
    left taken) of ``batch`` on a new asyncio executor."""
    client, _ = connect_async(_config(url))
    executor = _executor(client, scripts, url)
    seen: list[tuple[str, Any]] = []
    executor.on_script.append(lambda name, args, reply: seen.append((name, reply)))
    pipeline = executor.pipeline_for(client)
    assert pipeline is not None
    try:
        with PerCallPath() as per_call:
            outcome = await _async_outcome(executor, batch)
        clean = _in_use(client) == 0 and _slots_free(executor)
        return outcome, pipeline.batches, pipeline.calls, len(per_call.names), seen, clean
    finally:
        await client.aclose()


@settings(max_examples=40, deadline=None)
@given(spec=st.lists(_CALL, min_size=2, max_size=24))
@example(spec=[("push", t, str(t)) for t in range(TAGS)] * 2)
@example(spec=[("push", 0, "a"), ("probe", 5, ("memtier", "m")), ("push", 0, "b")])
@example(spec=[("probe", 3, ("err", "e")), ("push", 3, "a"), ("probe", 9, ("memtier", "m"))])
@example(spec=[("probe", 1, ("nil",)), ("probe", 2, ("arr", "a", "b")), ("push", 4, "")])
def test_an_asyncio_batch_is_the_sync_batch_in_one_write(
    server: Any, scripts: ScriptRegistry, reference: Any, spec: list[tuple[Any, ...]]
) -> None:
    sync_client, sync_executor = reference
    _fresh_lists(sync_client)
    _load(sync_client, scripts)
    batch = _calls(spec)
    outcome, writes, written, per_call, seen, clean = asyncio.run(
        _run_batch(server.url, scripts, ScriptBatch(batch))
    )
    lists = _lists(sync_client)
    _fresh_lists(sync_client)
    assert outcome == _sync_outcome(sync_executor, ScriptBatch(_calls(spec)))
    assert lists == _lists(sync_client)
    assert (writes, written, per_call) == (1, len(batch), 0)
    assert [c.attempts for c in batch] == [[1]] * len(batch)
    if outcome[0] == "replies":  # a failed batch raises before any hook, as sync does
        assert seen == [(c.script, r) for c, r in zip(batch, outcome[1], strict=True)]
    else:
        assert seen == []
    assert clean


def test_noscript_loads_and_resends_each_call_once(
    server: Any, scripts: ScriptRegistry, reference: Any
) -> None:
    sync_client, _ = reference
    _fresh_lists(sync_client)
    spec = [("push", t, "v") for t in range(TAGS)]

    async def run() -> tuple[list[Any], list[Any]]:
        client, _ = connect_async(_config(server.url))
        executor = _executor(client, scripts, server.url)
        try:
            first = await executor.execute(ScriptBatch(_calls(spec)))  # loaded
            sync_client.script_flush()
            second = await executor.execute(ScriptBatch(_calls(spec)))
            assert _in_use(client) == 0 and _slots_free(executor)
            return first, second
        finally:
            await client.aclose()

    first, second = asyncio.run(run())
    assert (first, second) == ([2] * TAGS, [3] * TAGS)  # each ran once per batch
    assert _lists(sync_client) == [[b"x", b"v", b"v"]] * TAGS


def _losing_read(after: int) -> Callable[..., Any]:
    """A ``_read_call`` that raises at its read number ``after`` + 1 (once), as a lost
    socket does (the pipeline then drops the connection)."""
    original = autopipeline_module._read_call
    reads = [0]

    async def read_call(read: Any, replies: int) -> Any:
        reads[0] += 1
        if reads[0] == after + 1:
            raise RedisConnectionError("Connection closed by server.")
        return await original(read, replies)

    return read_call


def test_a_connection_lost_mid_batch_resends_the_whole_batch(
    server: Any, scripts: ScriptRegistry, reference: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sync_client, _ = reference
    _load(sync_client, scripts)
    keys = [f"{{claim{n}}}:" + uuid.uuid4().hex for n in range(6)]

    def batch() -> tuple[ScriptCall, ...]:
        return tuple(
            ScriptCall("claim", (k,), (f"v{n}",), attempts=[0]) for n, k in enumerate(keys)
        )

    read_call = _losing_read(after=3)
    monkeypatch.setattr(autopipeline_module, "_read_call", read_call)

    async def run() -> tuple[list[Any], tuple[ScriptCall, ...]]:
        client, _ = connect_async(_config(server.url))
        executor = _executor(client, scripts, server.url, max_attempts=3)
        pipeline = executor.pipeline_for(client)
        assert pipeline is not None
        try:
            calls = batch()
            replies = await executor.execute(ScriptBatch(calls))
            assert pipeline.batches == 2  # the batch, then the batch again
            assert _in_use(client) == 0 and _slots_free(executor)
            return replies, calls
        finally:
            await client.aclose()

    replies, calls = asyncio.run(run())
    assert replies == [f"v{n}".encode() for n in range(len(keys))]
    assert [c.attempts for c in calls] == [[2]] * len(keys)
    assert [sync_client.get(k) for k in keys] == [f"v{n}".encode() for n in range(len(keys))]
    sync_client.delete(*keys)


def test_with_no_retry_left_the_error_is_raised_and_the_next_batch_is_in_step(
    server: Any, scripts: ScriptRegistry, reference: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sync_client, _ = reference
    _fresh_lists(sync_client)
    _load(sync_client, scripts)
    read_call = _losing_read(after=2)
    monkeypatch.setattr(autopipeline_module, "_read_call", read_call)

    async def run() -> list[Any]:
        client, _ = connect_async(_config(server.url))
        executor = _executor(client, scripts, server.url, max_attempts=1)
        try:
            with pytest.raises(MemtierError):
                await executor.execute(ScriptBatch(_calls([("push", 0, "a")] * 5)))
            assert _in_use(client) == 0 and _slots_free(executor)
            probes = [("probe", 1, ("str", f"s{n}")) for n in range(4)]
            replies: list[Any] = await executor.execute(ScriptBatch(_calls(probes)))
            return replies
        finally:
            await client.aclose()

    assert asyncio.run(run()) == [f"s{n}".encode() for n in range(4)]  # each its own reply
    # The lost batch's calls were all written: all of them ran, none twice.
    assert _lists(sync_client)[0] == [b"x"] + [b"a"] * 5


def test_a_caller_cancelled_after_the_write_leaves_nothing_taken(
    server: Any, scripts: ScriptRegistry, reference: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch's calls were written when its caller is cancelled: they run, their
    replies are read and dropped by the send task, and the connection goes back in step."""
    sync_client, _ = reference
    _fresh_lists(sync_client)
    _load(sync_client, scripts)
    original = autopipeline_module._read_call
    events: dict[str, asyncio.Event] = {}

    async def read_call(read: Any, replies: int) -> Any:
        if not events["reading"].is_set():
            events["reading"].set()
            await events["go_on"].wait()  # the caller is cancelled meanwhile
        return await original(read, replies)

    monkeypatch.setattr(autopipeline_module, "_read_call", read_call)

    async def run() -> list[Any]:
        events.update(reading=asyncio.Event(), go_on=asyncio.Event())  # of this loop
        client, _ = connect_async(_config(server.url))
        executor = _executor(client, scripts, server.url)
        try:
            task = asyncio.ensure_future(
                executor.execute(ScriptBatch(_calls([("push", 0, "a")] * 3)))
            )
            await asyncio.wait_for(events["reading"].wait(), 10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            events["go_on"].set()
            for _ in range(500):  # the send task reads the dropped replies, gives back
                if _in_use(client) == 0 and _slots_free(executor):
                    break
                await asyncio.sleep(0.01)
            assert _in_use(client) == 0 and _slots_free(executor)
            probes = [("probe", 1, ("int", str(n))) for n in range(3)]
            replies: list[Any] = await executor.execute(ScriptBatch(_calls(probes)))
            return replies
        finally:
            await client.aclose()

    assert asyncio.run(run()) == [0, 1, 2]  # its own replies: the connection is in step
    assert _lists(sync_client)[0] == [b"x", b"a", b"a", b"a"]  # written: each ran once


def test_a_stores_restore_sends_its_batches_in_one_coroutine(server: Any) -> None:
    with tempfile.TemporaryDirectory(prefix="memtier-aiobatch-") as storage:
        config = MemtierConfig.load(
            redis_url=server.url,
            namespace="ab" + uuid.uuid4().hex[:8],
            redis=SETTINGS,
            conversation={"persistence_enabled": True, "storage_path": storage},
        )
        own, _ = connect_sync(config)  # the store closes it
        store = ConversationStore(own, config, snapshots=snapshot_dir_for(config))
        keys = [ConversationKey(uuid.UUID(int=i + 1), "im") for i in range(40)]
        try:
            for k in keys:
                store.append(k, AvatarMessage(text=f"restore me {k.avatar}"))
                store.append(k, AvatarMessage(text="and me"))
            contexts = {k: store.context(k).messages for k in keys}
            store.flush()
            _wipe(own, config.namespace)
            report, per_call, batches = asyncio.run(_async_restore(config))
            assert report.outcome == "restored" and report.restored == len(keys)
            # batches of up to 16 sessions (the last may be 1, which goes alone)
            assert batches >= 3 and per_call.count("restore_session") <= 1
            for k in keys:
                assert store.context(k).messages == contexts[k]
        finally:
            _wipe(own, config.namespace)
            store.close()


async def _async_restore(config: MemtierConfig) -> tuple[Any, list[str], int]:
    """An asyncio store's restore, the scripts that took the per-call path, and the
    batches sent in one coroutine."""
    from memtier.scriptbatch import run_script_batch_pipelined

    batches = [0]

    async def counted(*args: Any, **kwargs: Any) -> Any:
        batches[0] += 1
        return await run_script_batch_pipelined(*args, **kwargs)

    store = AsyncConversationStore.from_config(config)
    try:
        with (
            PerCallPath() as per_call,
            mock.patch("memtier.executor.run_script_batch_pipelined", counted),
        ):
            report = await store.recover(force=True)
        return report, per_call.names, batches[0]
    finally:
        await store.aclose()


def _wipe(client: Any, namespace: str) -> None:
    keys = list(client.scan_iter(match=f"*{namespace}*", count=1000))
    if keys:
        client.delete(*keys)
