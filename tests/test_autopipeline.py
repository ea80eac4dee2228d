"""Auto-pipelining for asyncio (issue 12): script calls of one loop tick share a round trip.

An :class:`~memtier.executor.AsyncExecutor` on a plain standalone ``redis.asyncio.Redis``
queues its script calls in :class:`memtier.autopipeline.AutoPipeline`; these tests hold
it to the generic path and to every promise of a script call:

* it is taken on a real standalone client only (never fakeredis, an asyncio cluster
  client, a subclass, a single-connection client, or with ``auto_pipelining = false``),
  and concurrent calls do share batches;
* Hypothesis: concurrent coroutines running random append / context / pop / retried
  append sequences give the same results as the same sequences one call at a time on the
  generic path, and what Redis holds afterwards is exactly the ledger of acknowledged
  appends (minus pops);
* Hypothesis: a batch of mixed script replies and error replies (NOSCRIPT, ``memtier:``
  rejections, transient errors retried to exhaustion, WRONGTYPE) gives each caller the
  outcome the generic path gives it alone;
* the batch bounds (calls, bytes) hold, and configuration may only lower them;
* faults on a private server: SIGSTOP/SIGCONT past the socket timeout, a restart (AOF on,
  script cache gone), ``CLIENT KILL`` of the pipeline's connections, and callers cancelled
  before and after their batch was written.  After each: every acknowledged append is
  stored exactly once at its receipt's seq, nothing is stored twice, no connection is
  left checked out, and every connection answers with its own reply.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import string
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from hypothesis import example, given, settings
from hypothesis import strategies as st
from servers import RedisServer

from memtier import (
    AsyncConversationStore,
    AvatarMessage,
    ConfigurationError,
    ConversationKey,
    MemtierConfig,
    MemtierError,
    OutcomeUnknownError,
    metrics,
)
from memtier.autopipeline import AutoPipeline, KeptConnections, PipelineBounds, _reply_reader
from memtier.connection import AsyncClientGuard, connect_async, lean_async_pool
from memtier.engine import ScriptCall
from memtier.executor import AsyncExecutor
from memtier.retry import RetryPolicy
from memtier.scripts import ScriptRegistry, load_registry

PROBE_LUA = """#!lua
-- KEYS[1] a list key (for WRONGTYPE); ARGV[1] the kind; returns the reply it names.
local kind = ARGV[1]
if kind == "int" then return tonumber(ARGV[2])
elseif kind == "str" then return ARGV[2]
elseif kind == "nil" then return nil
elseif kind == "arr" then
  local out = {}
  for i = 2, #ARGV do out[#out + 1] = ARGV[i] end
  return out
elseif kind == "status" then return redis.status_reply(ARGV[2])
elseif kind == "err" then return redis.error_reply("ERR " .. ARGV[2])
elseif kind == "memtier" then return redis.error_reply("memtier: bad " .. ARGV[2])
elseif kind == "transient" then return redis.error_reply("TRYAGAIN " .. ARGV[2])
elseif kind == "wrongtype" then return redis.call("INCR", KEYS[1])
end
return redis.error_reply("ERR unknown kind")
"""
LIST_KEY = "{pipe}:list"
# A generous reply deadline: on this shared machine a 0.5 s stall happens, and a timeout
# (retried) would change a call's attempt count.  The fault tests use FAULT_TIMEOUT_S.
SETTINGS: dict[str, Any] = {
    "max_connections": 8,
    "socket_timeout_seconds": 10.0,
    "connect_timeout_seconds": 0.5,
    "pool_timeout_seconds": 5.0,
}
FAULT_TIMEOUT_S = 0.5  # below the 1.2 s SIGSTOP of the fault test, above its 0.4 s pause


def _registry(root: Path) -> ScriptRegistry:
    folder = root / "probe"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "probe-1.lua").write_text(PROBE_LUA, encoding="utf-8")
    return load_registry("probe", root)


def _config(url: str | None = None, **redis_settings: Any) -> MemtierConfig:
    return MemtierConfig.load(
        redis_url=url, namespace="p" + uuid.uuid4().hex[:8], redis={**SETTINGS, **redis_settings}
    )


def _executor(client: Any, scripts: ScriptRegistry, config: MemtierConfig) -> AsyncExecutor:
    return AsyncExecutor(
        client,
        scripts,
        AsyncClientGuard(client, config.redis),
        RetryPolicy(),
        pipeline=PipelineBounds.from_settings(config.redis),
    )


def _in_use(client: Any) -> int:
    """Connections checked out of the pool by a call (not those the direct path keeps
    idle between calls, which stay checked out of the pool)."""
    pool = client.connection_pool
    kept = getattr(pool, "_memtier_kept", None)
    return len(pool._in_use_connections) - (len(kept.idle) if kept is not None else 0)


def _call(kind: str, *payload: str) -> ScriptCall:
    return ScriptCall("probe", (LIST_KEY,), (kind, *payload), attempts=[0])


async def _outcome(executor: AsyncExecutor, call: ScriptCall) -> tuple[Any, ...]:
    try:
        reply = await executor.execute(call)
    except MemtierError as exc:
        return ("error", type(exc), exc.code, call.attempts)
    return ("reply", reply, call.attempts)


# --- which clients take it ---------------------------------------------------------------------
@pytest.mark.real
async def test_the_pipeline_is_taken_on_a_plain_standalone_client_only(
    redis_server: Any, tmp_path: Path
) -> None:
    import fakeredis

    scripts = _registry(tmp_path)
    config = _config(redis_server.url)
    client, _ = connect_async(config)

    class Traced(redis.asyncio.Redis):  # a subclass may hook execute_command
        pass

    fake = fakeredis.FakeAsyncRedis()
    single = redis.asyncio.Redis(
        connection_pool=client.connection_pool, single_connection_client=True
    )
    cluster = redis.asyncio.RedisCluster(host="127.0.0.1", port=1)  # no I/O until used
    try:
        assert lean_async_pool(client) is client.connection_pool
        for other in (fake, single, Traced(connection_pool=client.connection_pool), cluster):
            assert lean_async_pool(other) is None, other
        assert _executor(client, scripts, config).pipeline_for(client) is not None
        off = _config(redis_server.url, auto_pipelining=False)
        executor = _executor(client, scripts, off)
        assert executor.pipeline_for(client) is None
        assert await executor.execute(_call("str", "generic")) == b"generic"
    finally:
        await fake.aclose()
        await client.aclose()


@pytest.mark.real
async def test_concurrent_store_calls_share_round_trips(redis_server: Any) -> None:
    store = AsyncConversationStore.from_config(_config(redis_server.url, max_connections=50))
    async with store:
        keys = [ConversationKey(uuid.uuid4(), "im") for _ in range(64)]
        receipts = await asyncio.gather(
            *(
                store.append(k, AvatarMessage(text=f"t{i}", turn_id=f"a{i}"))
                for i, k in enumerate(keys)
            )
        )
        contexts = await asyncio.gather(*(store.context(k) for k in keys))
        pipeline = store.executor.pipeline_for(store.client)
        assert pipeline is not None
        assert pipeline.calls >= 128 and pipeline.batches < pipeline.calls // 4
        assert [r.seq for r in receipts] == [1] * 64
        for i, context in enumerate(contexts):
            assert [t.turn_id for t in context.turns] == [f"a{i}"]
        assert _in_use(store.client) == 0


async def test_a_plain_clients_batches_are_read_without_redis_pys_read_response(
    redis_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On memtier's own asyncio client (RESP3 by redis-py 8's default) and on a caller's
    plain RESP2 client, appends and context reads answer with redis-py's per-reply
    ``read_response`` forbidden once the connections are open: the batch reader took it."""
    for protocol in (3, 2):
        plain = redis.asyncio.Redis.from_url(redis_server.url, protocol=2)
        if protocol == 2:
            store = AsyncConversationStore(plain, _config(redis_server.url))
        else:
            store = AsyncConversationStore.from_config(_config(redis_server.url))
        async with store:
            key = ConversationKey(uuid.uuid4(), "public")
            # Connects both connections the calls below take (a call written by its
            # caller while the others share a batch): a handshake reads with
            # read_response, which is forbidden below.
            warm = ConversationKey(uuid.uuid4(), "public")
            await asyncio.gather(
                store.append(key, AvatarMessage(text="warm", turn_id="w")),
                *(store.append(warm, AvatarMessage(text=f"w{i}")) for i in range(4)),
            )

            async def forbidden(*args: Any, **kwargs: Any) -> Any:
                raise AssertionError("read_response called on the pipelined path")

            with monkeypatch.context() as patch:
                patch.setattr(redis.asyncio.Connection, "read_response", forbidden)
                receipts = await asyncio.gather(
                    *(
                        store.append(key, AvatarMessage(text=f"t{i}", turn_id=f"t{i}"))
                        for i in range(8)
                    )
                )
                context = await store.context(key)
            assert sorted(r.seq for r in receipts) == list(range(2, 10))
            assert context.turns[0].turn_id == "w" and len(context.turns) == 9
        await plain.aclose()


@settings(max_examples=12, deadline=None)
@given(
    limit=st.integers(1, 4),
    appends=st.integers(1, 80),
    reads=st.integers(0, 20),
    listings=st.integers(0, 3),
)
@example(limit=1, appends=64, reads=0, listings=0)
@example(limit=2, appends=80, reads=20, listings=3)
def test_max_connections_bounds_connections_not_the_callers_of_a_batch(
    redis_server: Any, limit: int, appends: int, reads: int, listings: int
) -> None:
    """``max_connections`` = k on the pipelined path: any number of concurrent appends
    and context reads (with generic commands mixed in: ``list_metadata`` pages) all
    answer, the pool never has more than k connections out at once, and callers beyond
    k share batches instead of waiting for a slot each (fewer batches than calls)."""

    async def run() -> None:
        config = _config(redis_server.url, max_connections=limit)
        async with AsyncConversationStore.from_config(config) as store:
            pool = store.client.connection_pool
            out = {"now": 0, "max": 0}
            get, give = pool.get_connection, pool.release

            async def counted_get(*args: Any, **kwargs: Any) -> Any:
                conn = await get(*args, **kwargs)
                out["now"] += 1
                out["max"] = max(out["max"], out["now"])
                return conn

            async def counted_release(conn: Any) -> None:
                out["now"] -= 1
                await give(conn)

            pool.get_connection, pool.release = counted_get, counted_release  # type: ignore[method-assign]
            keys = [ConversationKey(uuid.uuid4(), "im") for _ in range(8)]
            work = [
                *(
                    store.append(keys[i % 8], AvatarMessage(text=f"t{i}", turn_id=f"t{i}"))
                    for i in range(appends)
                ),
                *(store.context(keys[i % 8]) for i in range(reads)),
                *(store.list_metadata(limit=10) for _ in range(listings)),
            ]
            results = await asyncio.gather(*work)
            receipts = results[:appends]
            assert not any(r.duplicate for r in receipts)
            stored = {k.member: await store.context(k) for k in keys}
            assert sorted(t.turn_id for c in stored.values() for t in c.turns) == sorted(
                f"t{i}" for i in range(appends)
            )
            for c in stored.values():  # gapless per session
                assert [t.seq for t in c.turns] == list(range(1, len(c.turns) + 1))
            # Kept idle connections count as out: with them the bound still holds, and
            # every other connection came back.
            kept = pool._memtier_kept.idle  # type: ignore[attr-defined]
            assert out["max"] <= limit and out["now"] == len(kept) <= 1
            pipeline = store.executor.pipeline_for(store.client)
            assert pipeline is not None
            if appends + reads > 2 * limit:  # more callers than slots: they share batches
                assert pipeline.batches < pipeline.calls

    asyncio.run(run())


async def _evalsha_calls(client: Any) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_a_batch_that_gets_no_slot_in_time_fails_its_calls_busy(
    redis_server: Any, tmp_path: Path
) -> None:
    """With every slot held elsewhere for longer than ``pool_timeout_seconds``, a
    pipelined call fails as ``backend_busy`` (retryable) having sent nothing; once a slot
    is free it answers, and the slot comes back."""
    config = _config(redis_server.url, max_connections=1, pool_timeout_seconds=0.2)
    client = redis.asyncio.Redis.from_url(redis_server.url)
    guard = AsyncClientGuard(client, config.redis)
    executor = AsyncExecutor(
        client,
        _registry(tmp_path),
        guard,
        RetryPolicy(horizon_s=0.0, max_attempts=1),
        pipeline=PipelineBounds.from_settings(config.redis),
    )
    try:
        assert await _outcome(executor, _call("str", "warm")) == ("reply", b"warm", [1])
        sent = await _evalsha_calls(client)
        await guard.acquire()  # the only slot, held by "someone else"
        outcome = await _outcome(executor, _call("str", "first"))
        assert outcome[0] == "error" and outcome[2] == "backend_busy"
        assert await _evalsha_calls(client) == sent  # nothing was sent
        guard.release()
        assert await _outcome(executor, _call("str", "second")) == ("reply", b"second", [1])
        assert not guard._slots.locked()
    finally:
        await client.aclose()


async def test_standalone_pipelines_and_cluster_keeps_the_generic_path(
    backend_no_fake: Any,
) -> None:
    """On the real cluster the asyncio client is a RedisCluster: no auto-pipeline (the
    generic path routes each call by slot); the same concurrent calls give the same results."""
    config = _config(backend_no_fake.url, max_connections=50)
    store = AsyncConversationStore.from_config(config)
    async with store:
        keys = [ConversationKey(uuid.uuid4(), "im") for _ in range(32)]
        receipts = await asyncio.gather(
            *(
                store.append(k, AvatarMessage(text=f"c{i}", turn_id=f"c{i}"))
                for i, k in enumerate(keys)
            )
        )
        contexts = await asyncio.gather(*(store.context(k) for k in keys))
        assert [r.seq for r in receipts] == [1] * 32
        assert [[t.turn_id for t in c.turns] for c in contexts] == [[f"c{i}"] for i in range(32)]
        pipeline = store.executor.pipeline_for(store.client)
        if backend_no_fake.is_cluster:
            assert pipeline is None
        else:
            assert pipeline is not None and pipeline.batches < pipeline.calls


# --- the model property ------------------------------------------------------------------------
_OP = st.one_of(
    st.tuples(st.just("append"), st.text(string.ascii_letters + " ", min_size=1, max_size=40)),
    st.tuples(st.just("retry"), st.integers(0, 7)),  # re-send an earlier append's turn id
    st.just(("context",)),
    st.just(("pop",)),
)
_SESSIONS = st.lists(st.lists(_OP, min_size=1, max_size=8), min_size=1, max_size=12)


def _norm_context(context: Any) -> tuple[Any, ...]:
    return tuple((t.seq, t.turn_id, t.fields) for t in context.turns) + tuple(
        m.content for m in context.messages
    )


async def _run_session(
    store: AsyncConversationStore, key: ConversationKey, ops: Sequence[tuple[Any, ...]]
) -> list[Any]:
    """``ops`` in order on one key; each result normalised (no ids, no clocks)."""
    out: list[Any] = []
    sent: list[tuple[str, str]] = []  # (turn id, text) of every append sent, in order
    for op in ops:
        if op[0] in ("append", "retry"):
            if op[0] == "retry" and sent:
                turn_id, text = sent[op[1] % len(sent)]
            else:
                turn_id, text = f"t{len(sent)}", op[-1] if op[0] == "append" else "r"
                sent.append((turn_id, text))
            r = await store.append(key, AvatarMessage(text=text, turn_id=turn_id))
            out.append(("append", turn_id, r.seq, r.duplicate, r.turn_count, r.session_bytes))
        elif op[0] == "context":
            out.append(("context", _norm_context(await store.context(key))))
        else:
            record = await store.pop(key)
            out.append(("pop", None if record is None else (record.seq, record.turn_id)))
    return out


def _ledger(results: list[Any]) -> list[tuple[int, str]]:
    """What one session must hold after its results: acknowledged appends minus pops."""
    held: list[tuple[int, str]] = []
    for result in results:
        if result[0] == "append" and not result[3]:
            held.append((result[2], result[1]))
        elif result[0] == "pop" and result[1] is not None:
            assert held and held[-1] == result[1]  # pop took the newest acknowledged turn
            held.pop()
    return held


async def _model_run(url: str, sessions: list[list[tuple[Any, ...]]]) -> None:
    piped = AsyncConversationStore.from_config(_config(url, max_connections=50))
    generic = AsyncConversationStore.from_config(_config(url, auto_pipelining=False))
    async with piped, generic:
        keys = [ConversationKey(uuid.uuid4(), "im") for _ in sessions]
        together = await asyncio.gather(
            *(_run_session(piped, k, ops) for k, ops in zip(keys, sessions, strict=True))
        )
        alone = [await _run_session(generic, k, ops) for k, ops in zip(keys, sessions, strict=True)]
        assert together == alone
        for key, results in zip(keys, together, strict=True):  # Redis holds the ledger exactly
            stored = [(t.seq, t.turn_id) for t in (await piped.context(key)).turns]
            assert stored == _ledger(results)
        pipeline = piped.executor.pipeline_for(piped.client)
        assert pipeline is not None and pipeline.calls >= sum(map(len, sessions))
        if len(sessions) > 4:
            assert pipeline.batches < pipeline.calls  # concurrent calls did share round trips
        assert _in_use(piped.client) == 0


@pytest.mark.real
@settings(max_examples=25, deadline=None)
@given(sessions=_SESSIONS)
@example(sessions=[[("append", "a"), ("pop",), ("retry", 0), ("context",)]] * 6)
@example(sessions=[[("pop",), ("context",)], [("append", "x"), ("retry", 0), ("retry", 0)]])
def test_concurrent_coroutines_give_the_results_of_one_call_at_a_time(
    redis_server: Any, sessions: list[list[tuple[Any, ...]]]
) -> None:
    asyncio.run(_model_run(redis_server.url, sessions))


async def _same_key_run(url: str, turn_ids: list[int]) -> None:
    store = AsyncConversationStore.from_config(_config(url, max_connections=50))
    async with store:
        key = ConversationKey(uuid.uuid4(), "im")
        receipts = await asyncio.gather(
            *(store.append(key, AvatarMessage(text=f"x{t}", turn_id=f"t{t}")) for t in turn_ids)
        )
        first: dict[int, int] = {}
        for t, receipt in zip(turn_ids, receipts, strict=True):
            assert first.setdefault(t, receipt.seq) == receipt.seq  # a repeat: the first seq
        # Unique turns got the gapless seqs 1..n; exactly one append of each id stored it.
        assert sorted(first.values()) == list(range(1, len(first) + 1))
        assert sum(not r.duplicate for r in receipts) == len(first)
        stored = {t.turn_id: t.seq for t in (await store.context(key)).turns}
        assert stored == {f"t{t}": seq for t, seq in first.items()}
        assert _in_use(store.client) == 0


@pytest.mark.real
@settings(max_examples=20, deadline=None)
@given(turn_ids=st.lists(st.integers(0, 15), min_size=1, max_size=40))
@example(turn_ids=[0] * 20)
@example(turn_ids=list(range(16)) * 2)
def test_concurrent_appends_to_one_key_are_gapless_and_stored_once(
    redis_server: Any, turn_ids: list[int]
) -> None:
    """Same-key calls in one batch run in batch order: every unique turn id once."""
    asyncio.run(_same_key_run(redis_server.url, turn_ids))


# --- replies and errors in one batch ---------------------------------------------------------
_TEXT = st.text(string.ascii_letters + string.digits + " _-", min_size=1, max_size=24)
_CALLS = st.one_of(
    st.tuples(st.just("int"), st.integers(-(2**53), 2**53).map(str)),
    st.tuples(st.sampled_from(["str", "status", "err", "memtier", "transient"]), _TEXT),
    st.tuples(st.just("nil")),
    st.lists(_TEXT, max_size=6).map(lambda items: ("arr", *items)),
    st.tuples(st.just("wrongtype")),
)


def _retries_by_type() -> dict[str, float]:
    """``memtier_retries_total`` of this process, by error type (all operations)."""
    totals: dict[str, float] = {}
    for family in metrics.RETRIES.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                kind = sample.labels["error_type"]
                totals[kind] = totals.get(kind, 0.0) + sample.value
    return totals


async def _batch_run(url: str, root: Path, calls: list[tuple[str, ...]], flush: bool) -> None:
    scripts = _registry(root)
    config = _config(url)
    client, _ = connect_async(config)
    try:
        await client.delete(LIST_KEY)
        await client.rpush(LIST_KEY, "x")
        generic = _executor(client, scripts, _config(url, auto_pipelining=False))
        alone = [await _outcome(generic, _call(*c)) for c in calls]
        piped = _executor(client, scripts, config)
        if flush:  # every call of the batch gets NOSCRIPT first: each reloads and re-sends
            await client.script_flush()
        retried = _retries_by_type()
        together = await asyncio.gather(*(_outcome(piped, _call(*c)) for c in calls))
        # A call retried more often than alone names why (one CI run of the pinned flush
        # example saw every non-transient call take 2 attempts; not reproduced since).
        now = _retries_by_type()
        why = {
            kind: n - retried.get(kind, 0.0) for kind, n in now.items() if n != retried.get(kind)
        }
        assert list(together) == alone, f"retries during the batch, by error type: {why}"
        pipeline = piped.pipeline_for(client)
        assert pipeline is not None and pipeline.calls >= len(calls)
        assert _in_use(client) == 0
    finally:
        await client.aclose()


@pytest.mark.real
@settings(max_examples=30, deadline=None)
@given(calls=st.lists(_CALLS, min_size=1, max_size=20), flush=st.booleans())
@example(calls=[("str", "a"), ("err", "b"), ("str", "c"), ("transient", "d"), ("nil",)], flush=True)
@example(calls=[("memtier", "x"), ("wrongtype",), ("int", "7")], flush=False)
def test_each_caller_of_a_batch_gets_its_own_reply_or_error(
    redis_server: Any,
    tmp_path_factory: pytest.TempPathFactory,
    calls: list[tuple[str, ...]],
    flush: bool,
) -> None:
    root = tmp_path_factory.mktemp("pipe")
    asyncio.run(_batch_run(redis_server.url, root, calls, flush))


# --- bounds ------------------------------------------------------------------------------------
# A wave: calls started together; each is (echo payload, None or the loop iterations
# after which its caller is cancelled).  A wave of one finds the pipeline idle: its caller
# writes it at once (the direct path); bigger waves share batches behind it.
_WAVES = st.lists(
    st.lists(st.one_of(st.none(), st.integers(0, 4)), min_size=1, max_size=6),
    min_size=1,
    max_size=8,
)


async def _waves_run(url: str, root: Path, waves: list[list[int | None]]) -> None:
    """Run ``waves`` of echo calls, cancelling the callers they name; then every pooled
    connection must answer each caller with its own reply (none left a reply unread)."""
    config = _config(url)
    client, _ = connect_async(config)
    executor = _executor(client, _registry(root), config)
    try:
        n = 0
        for wave in waves:
            tasks = []
            for cancel_after in wave:
                n += 1
                tasks.append(
                    (
                        f"w{n}",
                        cancel_after,
                        asyncio.create_task(executor.execute(_call("str", f"w{n}"))),
                    )
                )

            async def cancel(task: asyncio.Task[Any], after: int) -> None:
                for _ in range(after):
                    await asyncio.sleep(0)
                task.cancel()

            cancellers = [
                asyncio.create_task(cancel(task, after))
                for _, after, task in tasks
                if after is not None
            ]
            results = await asyncio.gather(*(t for _, _, t in tasks), return_exceptions=True)
            await asyncio.gather(*cancellers)
            for (payload, after, _), result in zip(tasks, results, strict=True):
                if after is None or not isinstance(result, asyncio.CancelledError):
                    assert result == payload.encode()  # its own reply, never another's
        # Afterwards: one call at a time, then concurrent ones, each gets its own echo.
        for i in range(4):
            assert await executor.execute(_call("str", f"after{i}")) == f"after{i}".encode()
        replies = await asyncio.gather(
            *(executor.execute(_call("str", f"c{i}")) for i in range(12))
        )
        assert replies == [f"c{i}".encode() for i in range(12)]
        pipeline = executor.pipeline_for(client)
        assert pipeline is not None and pipeline.direct_calls >= 1
        assert _in_use(client) == 0
    finally:
        await client.aclose()


@pytest.mark.real
@settings(max_examples=25, deadline=None)
@given(waves=_WAVES)
@example(waves=[[0], [None], [1, None, 2], [None]])
@example(waves=[[2], [3], [None, None], [4, 0]])
def test_callers_cancelled_on_either_path_leave_no_reply_for_another(
    redis_server: Any, tmp_path_factory: pytest.TempPathFactory, waves: list[list[int | None]]
) -> None:
    """The direct path (an idle pipeline: the caller writes and reads its own call) and
    batches, with callers cancelled before, during and after their write: a caller that
    was not cancelled gets exactly its own reply, and afterwards no pooled connection
    holds a reply meant for someone else (a direct caller cancelled after its write
    drops its connection's socket instead of handing it back out of step)."""
    root = tmp_path_factory.mktemp("waves")
    asyncio.run(_waves_run(redis_server.url, root, waves))


@pytest.mark.real
async def test_one_caller_at_a_time_is_written_by_the_caller_itself(
    redis_server: Any, tmp_path: Path
) -> None:
    """A caller alone on an idle pipeline takes no send task: its call is written and
    read in its own coroutine (one loop iteration less); concurrent callers still share
    batches behind it."""
    config = _config(redis_server.url)
    client, _ = connect_async(config)
    executor = _executor(client, _registry(tmp_path), config)
    try:
        for i in range(5):
            assert await executor.execute(_call("str", f"s{i}")) == f"s{i}".encode()
        pipeline = executor.pipeline_for(client)
        assert pipeline is not None
        assert (pipeline.direct_calls, pipeline.calls, pipeline.batches) == (5, 5, 5)
        replies = await asyncio.gather(
            *(executor.execute(_call("str", f"g{i}")) for i in range(20))
        )
        assert replies == [f"g{i}".encode() for i in range(20)]
        assert pipeline.direct_calls == 6  # the first of the 20; the 19 others batched
        assert pipeline.batches < 5 + 1 + 19
        assert _in_use(client) == 0
    finally:
        await client.aclose()


def test_the_bounds_have_hard_ceilings() -> None:
    with pytest.raises(ValueError):
        PipelineBounds(max_calls=1_025)
    with pytest.raises(ValueError):
        PipelineBounds(max_bytes=16 * 1024 * 1024 + 1)
    with pytest.raises(ValueError):
        PipelineBounds(max_calls=0)
    with pytest.raises(ConfigurationError):
        MemtierConfig.load(redis={"pipeline_max_calls": 2_000})
    with pytest.raises(ConfigurationError):
        MemtierConfig.load(redis={"pipeline_max_bytes": 17 * 1024 * 1024})
    assert (
        PipelineBounds.from_settings(MemtierConfig.load(redis={"auto_pipelining": False}).redis)
        is None
    )


@pytest.mark.real
@settings(max_examples=15, deadline=None)
@given(
    max_calls=st.integers(1, 6),
    max_bytes=st.integers(1024, 4096),
    sizes=st.lists(st.integers(1, 3000), min_size=1, max_size=24),
)
@example(max_calls=1, max_bytes=1024, sizes=[3000, 1, 3000])
def test_no_batch_passes_its_bounds(
    redis_server: Any,
    tmp_path_factory: pytest.TempPathFactory,
    max_calls: int,
    max_bytes: int,
    sizes: list[int],
) -> None:
    root = tmp_path_factory.mktemp("bounds")

    async def run() -> None:
        config = _config(
            redis_server.url, pipeline_max_calls=max_calls, pipeline_max_bytes=max_bytes
        )
        client, _ = connect_async(config)
        executor = _executor(client, _registry(root), config)
        seen: list[tuple[int, int]] = []

        class Watched(AutoPipeline):
            async def _send(self, batch: Any) -> None:
                seen.append((len(batch.calls), batch.size))
                await super()._send(batch)

            async def _direct_call(self, packed: Any, replies: int) -> Any:
                seen.append((1, sum(len(chunk) for chunk in packed)))  # a batch of one
                return await super()._direct_call(packed, replies)

        bounds = PipelineBounds.from_settings(config.redis)
        assert bounds is not None
        executor._pipeline = Watched(client.connection_pool, bounds)
        executor._pipeline_client = client
        try:
            payloads = ["x" * n for n in sizes]
            replies = await asyncio.gather(*(executor.execute(_call("str", p)) for p in payloads))
            assert replies == [p.encode() for p in payloads]
            assert sum(n for n, _ in seen) == len(sizes)
            for calls, size in seen:
                assert 1 <= calls <= max_calls
                assert calls == 1 or size <= max_bytes  # one call over the bound goes alone
        finally:
            await client.aclose()

    asyncio.run(run())


# --- faults on a private server --------------------------------------------------------------
class _Ledger:
    """Appends of a fault run: what was acknowledged, and what ended in doubt."""

    def __init__(self) -> None:
        self.acked: dict[tuple[int, str], int] = {}  # (session, turn id) -> receipt seq
        self.unknown: set[tuple[int, str]] = set()
        self.failed: list[str] = []
        self.duplicates = 0  # acknowledged by a retry after a lost reply

    async def writer(
        self, store: AsyncConversationStore, keys: list[Any], n: int, turns: int
    ) -> None:
        for i in range(turns):  # bounded
            turn_id = f"w{n}-{i}"
            try:
                receipt = await store.append(keys[n], AvatarMessage(text=f"x{i}", turn_id=turn_id))
            except OutcomeUnknownError:
                self.unknown.add((n, turn_id))
                continue
            except MemtierError as exc:  # not applied (backend unavailable, busy)
                self.failed.append(exc.code.value)
                continue
            # duplicate: an earlier attempt of this call ran (its reply was lost); the
            # retry got its receipt back -- acknowledged all the same.
            self.duplicates += receipt.duplicate
            self.acked[(n, turn_id)] = receipt.seq

    async def check(self, store: AsyncConversationStore, keys: list[Any]) -> None:
        for n, key in enumerate(keys):
            turns = (await store.context(key)).turns
            ids = [t.turn_id for t in turns]
            assert len(ids) == len(set(ids)), f"a turn stored twice: {ids}"
            assert [t.seq for t in turns] == sorted(t.seq for t in turns)
            stored = {t.turn_id: t.seq for t in turns}
            for (m, turn_id), seq in self.acked.items():
                if m == n:
                    assert stored.get(turn_id) == seq, (turn_id, seq, stored)
            for turn_id in stored:
                assert (n, turn_id) in self.acked or (n, turn_id) in self.unknown, turn_id


def _retries() -> float:
    """Attempts retried so far in this process (every operation, every error type)."""
    return sum(_retries_by_type().values())


async def _healthy(store: AsyncConversationStore) -> None:
    """Every pooled connection answers with its own reply; none is left checked out."""
    assert _in_use(store.client) == 0
    keys = [ConversationKey(uuid.uuid4(), "im") for _ in range(32)]
    receipts = await asyncio.gather(
        *(
            store.append(k, AvatarMessage(text=f"after {i}", turn_id=f"h{i}"))
            for i, k in enumerate(keys)
        )
    )
    contexts = await asyncio.gather(*(store.context(k) for k in keys))
    for i, (receipt, context) in enumerate(zip(receipts, contexts, strict=True)):
        assert receipt.seq == 1 and [t.turn_id for t in context.turns] == [f"h{i}"]
    assert _in_use(store.client) == 0


def _aof_server() -> RedisServer:
    # AOF fsynced on every write: a restart keeps every acknowledged append.
    return RedisServer(extra_config={"appendonly": "yes", "appendfsync": "always"})


async def _own(server: RedisServer) -> redis.asyncio.Redis:
    admin = redis.asyncio.Redis(host="127.0.0.1", port=server.port)
    assert (await admin.info("server"))["process_id"] == server.pid  # our own server
    return admin


@pytest.mark.real
async def test_a_kept_connection_never_makes_a_caller_wait(redis_server: Any) -> None:
    """memtier's own pool at ``max_connections`` = 1: the direct path keeps the one
    connection idle after each call, and every other user of the pool -- a batch, the
    client's own commands, a metadata page -- gets it back at once instead of waiting out
    ``pool_timeout_seconds`` (0.5 s here) and failing busy."""
    config = _config(redis_server.url, max_connections=1, pool_timeout_seconds=0.5)
    async with AsyncConversationStore.from_config(config) as store:
        pool = store.client.connection_pool
        key = ConversationKey(uuid.uuid4(), "im")
        for i in range(3):
            started = asyncio.get_running_loop().time()
            await store.append(key, AvatarMessage(text=f"t{i}"))
            assert len(pool._memtier_kept.idle) == 1  # kept between calls
            assert await store.client.ping()  # redis-py's own command: the pool takes it back
            page = await store.list_metadata(limit=10)
            assert [m.turn_count for m in page.sessions] == [i + 1]
            both = await asyncio.gather(store.context(key), store.context(key))
            assert [len(c.turns) for c in both] == [i + 1, i + 1]
            assert asyncio.get_running_loop().time() - started < 0.4  # nobody waited
        assert _in_use(store.client) == 0


@pytest.mark.real
async def test_a_kept_connection_the_server_closed_is_not_reused(tmp_path: Path) -> None:
    """``CLIENT KILL`` of the connection the direct path keeps idle: the next call sees
    the closed socket before it writes (as redis-py's pool checks a connection), takes a
    fresh one and succeeds on its first attempt -- no error, no retry."""
    with _aof_server() as server:
        config = _config(server.url)
        client, _ = connect_async(config)
        executor = _executor(client, _registry(tmp_path), config)
        admin = await _own(server)
        try:
            assert await executor.execute(_call("str", "first")) == b"first"
            kept = client.connection_pool._memtier_kept.idle
            assert len(kept) == 1
            ((conn, _),) = kept
            await admin.client_kill_filter(_id=await _client_id(conn))
            await asyncio.sleep(0.2)  # the loop reads the EOF of the killed socket
            call = _call("str", "second")
            assert await executor.execute(call) == b"second"
            assert call.attempts == [1]
            assert _in_use(client) == 0
        finally:
            await admin.aclose()
            await client.aclose()


async def _client_id(conn: Any) -> int:
    """The server's id of ``conn`` (sent on it, read back in step)."""
    await conn.send_command("CLIENT", "ID")
    return int(await conn.read_response())


@pytest.mark.real
@pytest.mark.parametrize("fault", ["stop-cont", "restart", "client-kill"])
async def test_a_fault_mid_batch_loses_no_acknowledged_append_and_stores_none_twice(
    fault: str,
) -> None:
    with _aof_server() as server:
        store = AsyncConversationStore.from_config(
            _config(server.url, max_connections=16, socket_timeout_seconds=FAULT_TIMEOUT_S)
        )
        async with store:
            admin = await _own(server)
            keys = [ConversationKey(uuid.uuid4(), "im") for _ in range(24)]
            ledger, retried = _Ledger(), _retries()
            writers = [
                asyncio.create_task(ledger.writer(store, keys, n, 150)) for n in range(len(keys))
            ]
            await asyncio.sleep(0.05)
            assert not any(w.done() for w in writers)  # the fault comes mid-run
            if fault == "stop-cont":
                assert server.pid is not None
                os.kill(server.pid, signal.SIGSTOP)  # past the 0.5 s socket timeout
                await asyncio.sleep(1.2)
                os.kill(server.pid, signal.SIGCONT)
            elif fault == "restart":
                await asyncio.to_thread(server.restart)  # script cache gone: NOSCRIPT per call
                await admin.aclose()
                admin = await _own(server)
            else:
                for _ in range(10):  # bounded: kill every connection but our own, repeatedly
                    await admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
                    await asyncio.sleep(0.02)
            async with asyncio.timeout(60):
                await asyncio.gather(*writers)
            await admin.aclose()
            assert ledger.acked, "no append was acknowledged at all"
            # The fault hit calls in flight: some were retried (a lost reply, a refused
            # connect, NOSCRIPT does not count), or ended unknown or failed unapplied.
            hit = _retries() - retried + len(ledger.unknown) + len(ledger.failed)
            assert hit > 0, (fault, ledger.duplicates)
            await ledger.check(store, keys)
            await _healthy(store)


@pytest.mark.real
async def test_cancelled_waiters_break_neither_the_others_nor_the_connection() -> None:
    with _aof_server() as server:
        store = AsyncConversationStore.from_config(
            _config(server.url, max_connections=16, socket_timeout_seconds=FAULT_TIMEOUT_S)
        )
        async with store:
            admin = await _own(server)
            warm = ConversationKey(uuid.uuid4(), "im")
            await store.append(warm, AvatarMessage(text="warm"))  # the guard is open
            pipeline = store.executor.pipeline_for(store.client)
            assert pipeline is not None
            keys = [ConversationKey(uuid.uuid4(), "im") for _ in range(16)]

            def start() -> list[asyncio.Task[Any]]:
                return [
                    asyncio.create_task(store.append(k, AvatarMessage(text="c", turn_id="c")))
                    for k in keys
                ]

            # 1. Cancelled after queueing, before the batch is written: never sent.  The
            # first task found the pipeline idle: its caller writes it at once (the
            # direct path), so it may have been written before the cancel; it counts as
            # case 2 (at most once, and a retry with the same id stores it once).
            tasks = start()
            await asyncio.sleep(0)  # every task queued its call; the send task has not run
            for task in tasks[::2]:
                task.cancel()
            done = await asyncio.gather(*tasks, return_exceptions=True)
            for i, (key, result) in enumerate(zip(keys, done, strict=True)):
                turns = (await store.context(key)).turns
                if i == 0:
                    assert isinstance(result, asyncio.CancelledError)
                    assert [t.turn_id for t in turns] in ([], ["c"])
                    again = await store.append(key, AvatarMessage(text="c", turn_id="c"))
                    assert again.seq == 1
                elif i % 2 == 0:
                    assert isinstance(result, asyncio.CancelledError)
                    assert turns == ()  # the cancelled append was never sent
                else:
                    assert not isinstance(result, BaseException) and result.seq == 1
                    assert [t.turn_id for t in turns] == ["c"]
            # 2. Cancelled after the batch was written, while its replies are unread.
            keys = [ConversationKey(uuid.uuid4(), "im") for _ in range(16)]
            await admin.execute_command("CLIENT", "PAUSE", 400, "ALL")
            tasks = start()
            await asyncio.sleep(0.1)  # written; Redis holds the replies back
            for task in tasks[::2]:
                task.cancel()
            async with asyncio.timeout(30):
                done = await asyncio.gather(*tasks, return_exceptions=True)
            for i, (key, result) in enumerate(zip(keys, done, strict=True)):
                if i % 2:
                    assert not isinstance(result, BaseException) and result.seq == 1
                else:
                    assert isinstance(result, asyncio.CancelledError)
                # Applied or not, at most once; a retry with the same id stores it once.
                again = await store.append(key, AvatarMessage(text="c", turn_id="c"))
                assert again.seq == 1
                assert [t.turn_id for t in (await store.context(key)).turns] == ["c"]
            await admin.aclose()
            await _healthy(store)


@pytest.mark.real
async def test_a_refused_connect_fails_every_caller_as_not_applied(tmp_path: Path) -> None:
    """No connection: nothing was sent, so each caller gets backend_unavailable after its
    own retries (never outcome_unknown), and none waits forever."""
    with RedisServer() as server:
        url = server.url
    config = _config(url)  # the server is gone: its port refuses connections
    client, _ = connect_async(config)
    try:
        executor = _executor(client, _registry(tmp_path), config)
        assert executor.pipeline_for(client) is not None
        calls = [_call("str", f"c{i}") for i in range(8)]
        async with asyncio.timeout(30):
            outcomes = await asyncio.gather(*(_outcome(executor, c) for c in calls))
        for outcome, call in zip(outcomes, calls, strict=True):
            assert outcome[0] == "error" and outcome[2].value == "backend_unavailable", outcome
            assert call.attempts is not None and call.attempts[0] >= 2  # retried on its own
        assert _in_use(client) == 0
    finally:
        await client.aclose()


# --- packing -----------------------------------------------------------------------------------
_ARG = st.one_of(
    st.text(max_size=40),
    st.binary(max_size=40),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
)


@settings(max_examples=200, deadline=None)
@given(args=st.lists(_ARG, max_size=12), encoding=st.sampled_from(["utf-8", "latin-1"]))
@example(args=["\u00e9", -1, b"\x00", 0.1], encoding="latin-1")
@example(args=["\u00e9\U0001f600", 2**63 - 1, 1e300], encoding="utf-8")
@example(args=["\ud800"], encoding="utf-8")  # a lone surrogate: refused by both
def test_a_call_is_packed_as_the_pools_connections_would_pack_it(
    args: list[Any], encoding: str
) -> None:
    """hiredis (UTF-8 str, ints) or redis-py's packer: the same bytes as the connection's."""
    pool = redis.asyncio.ConnectionPool(host="127.0.0.1", port=1, encoding=encoding)
    connection = pool.connection_class(**pool.connection_kwargs)
    command = ("EVALSHA", *args)
    try:
        want: Any = b"".join(connection.pack_command(*command))
    except UnicodeEncodeError:
        want = UnicodeEncodeError
    pipeline = AutoPipeline(pool, PipelineBounds())
    try:
        got: Any = b"".join(pipeline.pack(command))
    except UnicodeEncodeError:
        got = UnicodeEncodeError
    assert got == want


@pytest.mark.real
async def test_a_send_task_cancelled_before_it_ran_leaves_no_caller_waiting(
    redis_server: Any,
) -> None:
    client, _ = connect_async(_config(redis_server.url))
    try:
        pipeline = AutoPipeline(client.connection_pool, PipelineBounds())
        futures = [pipeline.submit(pipeline.pack(("PING",))) for _ in range(3)]
        (task,) = pipeline._sending
        task.cancel()  # e.g. the loop shutting down: the batch is never written
        async with asyncio.timeout(10):
            done = await asyncio.gather(*futures, return_exceptions=True)
        assert all(isinstance(d, redis.ConnectionError) for d in done), done
        assert pipeline.batches == 0 and pipeline._sending == set()
        after = pipeline.submit(pipeline.pack(("PING",)))  # the next tick's batch works
        assert await after == b"PONG"  # the raw reply: no response callback on this path
        assert _in_use(client) == 0
    finally:
        await client.aclose()


# --- the batch write: no wait_for per write, redis-py's failures ---------------------


class _Conn:
    """The parts of a redis-py asyncio connection :func:`memtier.autopipeline._write`
    uses, on a real loopback socket (a server that reads, or one that never reads)."""

    def __init__(self, writer: asyncio.StreamWriter, timeout: float | None) -> None:
        self._writer = writer
        self.is_connected = True
        self.health_check_interval = 0
        self.socket_timeout = timeout
        self.disconnects = 0

    async def disconnect(self, nowait: bool = False) -> None:
        self.disconnects += 1
        self._writer.close()

    async def send_packed_command(self, chunks: list[bytes]) -> None:  # pragma: no cover
        raise AssertionError("the connected path must not fall back to redis-py's write")


async def _sink(reads: bool) -> tuple[asyncio.Server, int, list[bytes]]:
    received: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if not reads:
                await asyncio.sleep(30)  # never reads: the sender's buffers fill up
                return
            while chunk := await reader.read(1 << 16):
                received.append(chunk)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, port, received


@settings(max_examples=25, deadline=None)
@given(
    chunks=st.lists(
        st.one_of(st.binary(max_size=64), st.integers(0, 3 << 20).map(lambda n: b"x" * n)),
        min_size=1,
        max_size=6,
    )
)
@example(chunks=[b"*1\r\n$4\r\nPING\r\n"])
@example(chunks=[b"a" * (3 << 20), b"", b"b"])  # more than the transport takes at once
def test_a_batch_write_delivers_exactly_its_bytes(chunks: list[bytes]) -> None:
    from memtier.autopipeline import _write

    async def run() -> bytes:
        server, port, received = await _sink(reads=True)
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            conn = _Conn(writer, timeout=10.0)
            await _write(conn, list(chunks))
            writer.close()
            await writer.wait_closed()
            expected = sum(len(c) for c in chunks)
            for _ in range(2000):  # bounded: until the server read it all (or 20 s)
                if sum(len(c) for c in received) >= expected:
                    break
                await asyncio.sleep(0.01)
            assert conn.disconnects == 0
            return b"".join(received)
        finally:
            server.close()

    assert asyncio.run(run()) == b"".join(chunks)


def test_a_batch_write_the_server_never_reads_times_out_as_redis_py_does() -> None:
    from memtier.autopipeline import _write

    async def run() -> _Conn:
        server, port, _ = await _sink(reads=False)
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            conn = _Conn(writer, timeout=0.5)
            with pytest.raises(redis.TimeoutError):
                await _write(conn, [b"x" * (64 << 20)])  # far past the socket buffers
            return conn
        finally:
            server.close()

    conn = asyncio.run(run())
    assert conn.disconnects == 1  # dropped: part of the batch may be on the wire


# --- the batch read: replies straight from hiredis, redis-py's results -----------------

# RESP2 replies as Redis writes them, each with what redis-py's read_response makes of it.
_REPLY = st.recursive(
    st.one_of(
        st.binary(max_size=40).map(lambda b: b"$%d\r\n%s\r\n" % (len(b), b)),
        st.integers(-(2**63), 2**63 - 1).map(lambda i: b":%d\r\n" % i),
        st.sampled_from([b"+OK\r\n", b"+QUEUED\r\n", b"$-1\r\n", b"*-1\r\n", b"*0\r\n"]),
        st.sampled_from(
            [
                b"-ERR unknown command\r\n",
                b"-NOSCRIPT No matching script. Please use EVAL.\r\n",
                b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
                b"-BUSY Redis is busy running a script.\r\n",
                b"-ERR memtier:session_full bounds reached\r\n",
                b"-EXECABORT Transaction discarded because of previous errors.\r\n",
            ]
        ),
    ),
    lambda inner: st.lists(inner, max_size=4).map(
        lambda items: b"*%d\r\n%s" % (len(items), b"".join(items))
    ),
    max_leaves=8,
)


async def _replier(stream: bytes, cuts: list[int], end: str) -> tuple[asyncio.Server, int]:
    """A loopback server that writes ``stream`` to each connection in pieces cut at
    ``cuts`` (each piece its own write, a loop tick apart), then closes (``end`` =
    "close") or stays silent (``end`` = "stall")."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            start = 0
            for cut in [*sorted(c % (len(stream) + 1) for c in cuts), len(stream)]:
                if cut > start:
                    writer.write(stream[start:cut])
                    await writer.drain()
                    await asyncio.sleep(0.001)
                    start = cut
            if end == "stall":
                await asyncio.sleep(30)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def _comparable(reply: Any) -> Any:
    """A reply comparable by value: errors (also those nested in arrays) as type and text."""
    if isinstance(reply, Exception):
        return (type(reply).__name__, str(reply))
    if isinstance(reply, list):
        return [_comparable(r) for r in reply]
    return reply


def _outcomes(replies: list[Any]) -> list[Any]:
    return [_comparable(r) for r in replies]


async def _read_all(read: Any, count: int) -> list[Any]:
    out: list[Any] = []
    for _ in range(count):
        try:
            out.append(await read())
        except redis.ResponseError as exc:  # an error reply: the connection is in step
            out.append(exc)
        except (redis.ConnectionError, redis.TimeoutError) as exc:  # the end of it
            out.append(exc)
            break
    return out


def quiet_connection_kwargs() -> dict[str, Any]:
    """No CLIENT SETINFO on connect (the stream's server only replies), and no request for
    maintenance notifications (redis-py >= 7.0), said as each redis-py release says it:
    the floor run (tests/run.sh) runs these tests on the oldest supported one too.  The
    sync and asyncio connections take the same arguments."""
    quiet: dict[str, Any] = {"lib_name": None, "lib_version": None}
    if (
        "driver_info"
        in inspect.signature(redis.asyncio.connection.AbstractConnection.__init__).parameters
    ):
        quiet = {"driver_info": None}
    try:
        from redis.maint_notifications import MaintNotificationsConfig
    except ImportError:  # redis-py < 7.0 has none
        pass
    else:
        quiet["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)
    return quiet


# The pinned streams every reader of replies is held to (with the generated ones below).
_STREAM_EXAMPLES: list[dict[str, Any]] = [
    {"replies": [b"+OK\r\n"], "cuts": [], "extra": 0, "end": "close", "protocol": 3},
    {
        "replies": [b"$3\r\nabc\r\n", b"-NOSCRIPT x\r\n"],
        "cuts": [1, 2, 3, 9],
        "extra": 1,
        "end": "close",
        "protocol": 2,
    },
    {
        "replies": [b"*2\r\n:1\r\n-ERR in an array\r\n"],
        "cuts": [5],
        "extra": 1,
        "end": "stall",
        "protocol": 3,
    },
    {  # a lost connection as an array's first element, then as a reply of its own
        "replies": [b"*2\r\n-LOADING x\r\n:1\r\n", b"-LOADING Redis is loading\r\n", b"+OK\r\n"],
        "cuts": [],
        "extra": 0,
        "end": "close",
        "protocol": 2,
    },
    {  # a push frame (client tracking) before a reply: handled, then the reply read
        "replies": [b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n", b":7\r\n"],
        "cuts": [3],
        "extra": 0,
        "end": "close",
        "protocol": 3,
    },
]


def stream_cases(test: Any) -> Any:
    """Generated reply streams (RESP2 replies, errors, nested arrays; RESP3 types) cut
    anywhere, then closed or stalled, read for as many replies as there are plus
    ``extra``; and the pinned ones above."""
    for pinned in reversed(_STREAM_EXAMPLES):
        test = example(**pinned)(test)
    return settings(max_examples=60, deadline=None)(
        given(
            replies=st.lists(_REPLY, min_size=1, max_size=12),
            cuts=st.lists(st.integers(0, 10_000), max_size=6),
            extra=st.integers(0, 2),
            end=st.sampled_from(["close", "stall"]),
            protocol=st.sampled_from([2, 3]),
        )(test)
    )


@stream_cases
def test_the_batch_reader_gives_what_redis_pys_read_response_gives(
    replies: list[bytes], cuts: list[int], extra: int, end: str, protocol: int
) -> None:
    """The pipeline's reply reader and redis-py's ``read_response`` on two real
    connections to the same byte stream (cut anywhere, then closed or stalled past the
    socket timeout), reading as many replies as there are plus ``extra``: the same
    replies, the same error replies raised, the same end (ConnectionError / TimeoutError)."""
    from memtier.autopipeline import _reply_reader

    quiet = quiet_connection_kwargs()

    # RESP3: the HELLO on connect reads its reply first (then RESP3's own types); it
    # names the protocol, as Redis's does (redis-py >= 8.2 checks it).
    hello = b"%2\r\n$6\r\nserver\r\n$5\r\nredis\r\n$5\r\nproto\r\n:3\r\n" if protocol == 3 else b""
    resp3 = [b"_\r\n", b"#t\r\n", b",3.5\r\n", b"%1\r\n+a\r\n:1\r\n"] if protocol == 3 else []
    replies = [*replies, *resp3]
    stream = hello + b"".join(replies)

    async def run() -> tuple[list[Any], list[Any], bool]:
        server, port = await _replier(stream, cuts, end)
        try:
            results = []
            for fast in (True, False):
                conn = redis.asyncio.Connection(
                    host="127.0.0.1",
                    port=port,
                    socket_timeout=0.2,
                    # The read timeout is the test's (a stalled stream); the TCP connect
                    # gets its own, generous one: under load a loopback connect once took
                    # over 0.2 s in CI ("Timeout connecting to server").
                    socket_connect_timeout=30,
                    protocol=protocol,
                    **quiet,
                )
                await conn.connect()
                read = _reply_reader(conn) if fast else conn.read_response
                results.append(await _read_all(read, len(replies) + extra))
                took_fast = _reply_reader(conn) != conn.read_response
                await conn.disconnect()
            return results[0], results[1], took_fast
        finally:
            server.close()

    fast, slow, took_fast = asyncio.run(run())
    assert took_fast  # a plain connection reads through hiredis directly
    assert_same_reads(fast, slow, extra, end)


def assert_same_reads(fast: list[Any], slow: list[Any], extra: int, end: str) -> None:
    """What a direct reader read (``fast``) is what redis-py's ``read_response`` read:
    the same replies and error replies (type and text), and the same end, whose message
    may be worded otherwise: a timeout on a stall, a lost connection on a close."""
    assert [type(r) for r in fast] == [type(r) for r in slow]
    ends = (redis.ConnectionError, redis.TimeoutError)
    assert [o for o, r in zip(_outcomes(fast), fast, strict=True) if not isinstance(r, ends)] == [
        o for o, r in zip(_outcomes(slow), slow, strict=True) if not isinstance(r, ends)
    ]
    if extra and end == "stall":
        assert isinstance(fast[-1], redis.TimeoutError)
    elif extra:
        assert isinstance(fast[-1], redis.ConnectionError)


def test_the_batch_reader_falls_back_to_redis_py_where_it_must() -> None:
    """Health checks (redis-py does work per reply for them), a parser that is not
    redis-py's hiredis one, and a connection not connected yet keep redis-py's
    read_response (a connected plain one does not: the test above asserts it)."""
    from redis._parsers import _AsyncRESP3Parser

    from memtier.autopipeline import _reply_reader

    checked = redis.asyncio.Connection(health_check_interval=5)
    assert _reply_reader(checked) == checked.read_response
    python_parser = redis.asyncio.Connection(parser_class=_AsyncRESP3Parser)
    assert _reply_reader(python_parser) == python_parser.read_response
    unconnected = redis.asyncio.Connection()  # its parser has no hiredis reader yet
    assert _reply_reader(unconnected) == unconnected.read_response


@pytest.mark.real
async def test_a_connection_kept_unclean_is_dropped_when_taken(redis_server: Any) -> None:
    """Connections are checked when taken, not when kept: one kept with a reply unread
    is disconnected and goes back to the pool, and the call gets another."""
    client = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        pool = client.connection_pool
        loop = asyncio.get_running_loop()
        kept = KeptConnections.of(pool)
        conn = await pool.get_connection()
        await conn.send_command("PING")  # its +PONG is never read
        await asyncio.sleep(0.2)
        assert kept.put(conn, loop)
        assert await kept.take(loop) is None
        assert not conn.is_connected
        assert _in_use(client) == 0
        clean = await pool.get_connection()  # the pool reconnects it, in step again
        assert kept.put(clean, loop)
        assert await kept.take(loop) is clean
        await clean.send_command("ECHO", "mine")
        assert await clean.read_response() == b"mine"
        await pool.release(clean)
    finally:
        await client.aclose()


@pytest.mark.real
async def test_the_direct_reader_is_checked_again_after_a_reconnect(redis_server: Any) -> None:
    """The reader checks run once per connect: a reconnect (a new hiredis reader and
    stream) checks again, and a health-check interval set later takes redis-py's path."""
    conn = redis.asyncio.Connection(host="127.0.0.1", port=redis_server.port)
    try:
        await conn.connect()
        for _ in range(2):
            read = _reply_reader(conn)
            assert read != conn.read_response
            parser = conn._parser
            assert conn._memtier_direct_reads == (parser, parser._reader, parser._stream)
            await conn.send_command("ECHO", "x")
            assert await read() == b"x"
            before = parser._reader
            await conn.disconnect()
            await conn.connect()
            assert conn._parser._reader is not before
        assert _reply_reader(conn) != conn.read_response  # checked, and kept as checked
        conn.health_check_interval = 5
        assert _reply_reader(conn) == conn.read_response
    finally:
        await conn.disconnect()
