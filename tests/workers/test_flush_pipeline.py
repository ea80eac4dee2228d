"""The pipelined flush and the batched restore keep the snapshot promise.

* A flush of generated sessions (every turn kind, summaries, tiny pages so the work
  bound and the resume of a page's rest are hit, many HSCAN rounds) then a restore in
  batches of every size gives back the same sessions, exact accounting, and a progress
  report that only grows and ends at the generation's totals.  Fakeredis, real Redis and
  the real cluster (where batches run one by one).
* A server killed while a pipelined flush has a page in flight (killed from inside the
  page work, the next page call written and not yet read): the flush fails, no partial
  file is published, no temp stays, and the last good generation is intact and restores.
* The executors: ``ScriptBatch`` on the pipeline path gives exactly the replies of the
  one-by-one path (NOSCRIPT inside a batch included, every hook called per call);
  ``Overlap`` returns the request's reply, and the work's error wins, with nothing left
  in flight (``Overlap`` of a ``ScriptBatch``: ``test_restore_read_ahead.py``).
* ``page_last_member`` agrees with ``page_lines`` on every generated reply.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path
from typing import Any
from unittest import mock

import orjson
import pytest
import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from servers import RedisServer
from workhelpers import (
    Clock,
    InFlight,
    assert_exact_accounting,
    key,
    persistent_store,
    scraped,
    snaps,
    turn_for,
    wipe_store,
)

from memtier import ConversationKey, ConversationStore
from memtier import connection as memtier_connection
from memtier.config import MemtierConfig
from memtier.connection import LeanPool
from memtier.engine import Command, Overlap, ScriptBatch, ScriptCall
from memtier.errors import BackendError, MemtierError, ScriptError
from memtier.memory import persistence
from memtier.memory.persistence import RestoreProgress, flush_plan
from memtier.memory.snapshot import VerifiedGeneration, verify_generation
from memtier.memory.snapshot.fileformat import page_last_member, page_lines
from memtier.retry import RetryPolicy

# ----------------------------------------------------------------------------- round trip


# (turns, channel): past max_turns_per_session=6 the store compacts (a summary).
_SESSION = st.tuples(st.integers(1, 8), st.sampled_from(["public", "im"]))


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    sessions=st.lists(_SESSION, min_size=0, max_size=24),
    page_sessions=st.integers(1, 6),
    page_bytes=st.sampled_from([1, 200, 4096, 32 * 1024]),
    batch_sessions=st.integers(1, 5),
    batch_bytes=st.sampled_from([1, 300, 48 * 1024]),
    batch_records=st.sampled_from([1, 7, 4096]),
)
@example(
    sessions=[], page_sessions=1, page_bytes=1, batch_sessions=1, batch_bytes=1, batch_records=1
)
@example(
    sessions=[(7, "public")] * 20,
    page_sessions=6,
    page_bytes=32 * 1024,
    batch_sessions=5,
    batch_bytes=48 * 1024,
    batch_records=4096,
)
def test_flush_then_restore_gives_the_same_sessions(
    backend: Any,
    tmp_path: Path,
    sessions: list[tuple[int, str]],
    page_sessions: int,
    page_bytes: int,
    batch_sessions: int,
    batch_bytes: int,
    batch_records: int,
) -> None:
    run = tmp_path / os.urandom(4).hex()
    store = persistent_store(backend, run, Clock(), max_turns_per_session=6)
    try:
        wipe_store(backend, store)
        contexts = {}
        for n, (turns, channel) in enumerate(sessions):
            k = key(n + 1, channel)
            for j in range(turns):
                store.append(k, turn_for(n + j).model_copy(update={"turn_id": f"s{n}-t{j}"}))
            contexts[k] = store.context(k)
        result = store.executor.run(
            flush_plan(store.core, snaps(store), page_sessions=page_sessions, page_bytes=page_bytes)
        )
        assert result.sessions == len(contexts) and result.skipped == {}
        wipe_store(backend, store)
        seen: list[RestoreProgress] = []
        batches: list[int] = []
        overlapped: list[Any] = []
        execute = store.executor.execute

        def counting(request: Any, operation: str | None = None) -> Any:
            if isinstance(request, Overlap):  # a batch restored while the next is read
                overlapped.append(request.request)
                request_ = request.request
            else:
                request_ = request
            if isinstance(request_, ScriptBatch):
                batches.append(len(request_.calls))
            return execute(request, operation)

        with (
            mock.patch.object(persistence.restorebatch, "RESTORE_BATCH_SESSIONS", batch_sessions),
            mock.patch.object(persistence.restorebatch, "RESTORE_BATCH_BYTES", batch_bytes),
            mock.patch.object(persistence.restorebatch, "RESTORE_BATCH_RECORDS", batch_records),
            mock.patch.object(store.executor, "execute", counting),
        ):
            report = store.recover(force=True, progress=seen.append)
        assert sum(batches) == len(contexts) and all(1 <= n <= batch_sessions for n in batches)
        # Every batch but the last is restored while the next one is read (the last one
        # too when the reading had not yet seen the end).
        assert len(batches) - 1 <= len(overlapped) <= len(batches)
        assert all(isinstance(r, ScriptBatch) for r in overlapped)
        if batch_bytes == 1 or batch_records == 1:
            assert set(batches) <= {1}  # every session passes the bound alone
        assert report.outcome == "restored", report.message
        assert report.restored == len(contexts)
        for k, ctx in contexts.items():
            again = store.context(k)
            assert again.messages == ctx.messages and again.turns == ctx.turns
            assert again.summary == ctx.summary
        assert_exact_accounting(store)
        _check_progress(seen, result.sessions, result.bytes)
    finally:
        wipe_store(backend, store)
        store.close()


def _check_progress(seen: list[RestoreProgress], sessions: int, file_bytes: int) -> None:
    from memtier.memory.snapshot import HEADER_BLOCK

    assert seen, "no progress reported"
    assert seen[0].sessions_done == 0 and seen[0].bytes_done == 0
    for a, b in itertools.pairwise(seen):
        assert a.sessions_done <= b.sessions_done and a.bytes_done <= b.bytes_done
        assert a.restored <= b.restored and a.elapsed_s <= b.elapsed_s
    last = seen[-1]
    assert last.finished and last.sessions_done == last.sessions_total == sessions
    assert last.bytes_done == last.bytes_total == file_bytes - HEADER_BLOCK
    assert last.restored == sessions


@pytest.mark.parametrize(("interval_s", "expected_calls"), [(3600.0, 2), (0.0, 42)])
def test_progress_is_rate_limited_and_a_failing_callback_never_stops_a_restore(
    backend: Any, tmp_path: Path, interval_s: float, expected_calls: int
) -> None:
    store = persistent_store(backend, tmp_path, Clock())
    try:
        for n in range(40):
            store.append(key(n + 1), turn_for(n))
        flushed = store.flush()
        wipe_store(backend, store)
        calls: list[RestoreProgress] = []

        def boom(progress: RestoreProgress) -> None:
            calls.append(progress)
            raise RuntimeError("a broken progress bar")

        plan = persistence.recover_plan(
            store.core, snaps(store), force=True, progress=boom, progress_interval_s=interval_s
        )
        with mock.patch.object(persistence.restorebatch, "RESTORE_BATCH_SESSIONS", 1):
            report = store.executor.run(plan)
        assert report.outcome == "restored" and report.restored == 40
        # An hour apart: the start and the end only.  No bound: the start, one per batch
        # of one session, the end.
        assert len(calls) == expected_calls
        assert calls[-1].finished and calls[-1].sessions_done == flushed.sessions
        _check_progress(calls, flushed.sessions, flushed.bytes)
    finally:
        wipe_store(backend, store)
        store.close()


def test_restore_metrics_count_every_session_and_byte(backend: Any, tmp_path: Path) -> None:
    from memtier import metrics
    from memtier.memory.snapshot import HEADER_BLOCK

    store = persistent_store(backend, tmp_path, Clock())
    try:
        for n in range(7):
            store.append(key(n + 1, "im"), turn_for(n))
        flushed = store.flush()
        wipe_store(backend, store)
        sessions_before = metrics.SNAPSHOT_RESTORE_SESSIONS._value.get()
        bytes_before = metrics.SNAPSHOT_RESTORE_BYTES._value.get()
        assert store.recover(force=True).restored == 7
        assert metrics.SNAPSHOT_RESTORE_SESSIONS._value.get() - sessions_before == 7
        assert metrics.SNAPSHOT_RESTORE_BYTES._value.get() - bytes_before == (
            flushed.bytes - HEADER_BLOCK
        )
    finally:
        wipe_store(backend, store)
        store.close()


# ----------------------------------------------------------------------------- a killed server


def test_server_killed_with_a_page_in_flight_keeps_the_last_good_generation(
    tmp_path: Path,
) -> None:
    with RedisServer() as server:
        namespace = "pipe" + os.urandom(4).hex()
        config = MemtierConfig.load(
            redis_url=server.url,
            namespace=namespace,
            conversation={"persistence_enabled": True, "storage_path": str(tmp_path)},
        )
        store = ConversationStore.from_config(config, recover=False)
        contexts = {}
        for n in range(120):
            k = key(n + 1, "im" if n % 2 else "public")
            store.append(k, turn_for(n))
            contexts[k] = store.context(k)
        good = store.flush()
        pid = server.pid
        assert pid is not None
        assert int(store.client.info("server")["process_id"]) == pid  # our own server
        writes = {"n": 0}
        killed_in_flight: list[bool] = []
        in_flight = InFlight()
        write_page = persistence.flush._PageWriter.write

        def write_then_kill(self: Any, reply: Any) -> None:
            write_page(self, reply)  # the held page is written whole...
            writes["n"] += 1
            if writes["n"] == 3:
                killed_in_flight.append(in_flight.on)
                server.stop()  # ...then SIGTERM and wait: the request in flight is lost

        with (
            mock.patch.object(LeanPool, "execute", in_flight.execute()),
            mock.patch.object(persistence.flush._PageWriter, "write", write_then_kill),
            pytest.raises(MemtierError),
        ):
            store.executor.run(flush_plan(store.core, snaps(store), page_sessions=4))
        # The kill landed while a page was being written with the next page call written
        # and not yet read (the work between a lean script call's write and its read).
        assert killed_in_flight == [True]
        directory = tmp_path / "conversations"
        assert not [n for n in os.listdir(directory) if n.startswith(".tmp")]
        gens = snaps(store).generations()
        assert [g.generation for g in gens] == [good.generation]
        verdict = verify_generation(gens[0], namespace, store.core.conv, 1 << 40)
        assert isinstance(verdict, VerifiedGeneration)
        store.close()
        server.start()  # an empty server (on a new port): the last good generation comes back
        config = config.model_copy(update={"redis_url": server.url})
        again = ConversationStore.from_config(config, recover=False)
        try:
            report = again.recover()
            assert report.outcome == "restored" and report.restored == len(contexts)
            for k, ctx in contexts.items():
                assert again.context(k).messages == ctx.messages
        finally:
            again.close()


# ----------------------------------------------------------------------------- executors


def _calls(store: ConversationStore, keys: list[Any]) -> list[ScriptCall]:
    return [
        persistence.snapshot_page_call(store.core, store.core.partition_for(k), [k.member])
        for k in keys
    ]


def test_script_batch_equals_one_by_one_with_noscript_and_hooks(
    redis_server: Any, tmp_path: Path
) -> None:
    namespace = "batch" + os.urandom(4).hex()
    config = MemtierConfig.load(redis_url=redis_server.url, namespace=namespace)
    store = ConversationStore.from_config(config, recover=False)
    try:
        keys = []
        for n in range(5):
            k = key(n + 1)
            store.append(k, turn_for(n))
            keys.append(k)
        keys.append(key(99))  # not a session: an empty page
        calls = _calls(store, keys)
        one_by_one = [store.executor.execute(c) for c in calls]
        seen: list[tuple[str, Any]] = []
        store.on_script = lambda script, args, reply: seen.append((script, reply))
        store.client.script_flush()  # every call of the batch answers NOSCRIPT first
        batched = store.executor.execute(ScriptBatch(tuple(calls)))

        def strip_clock(reply: Any) -> Any:
            return reply[2:]  # the server clock moves between the two runs

        assert [strip_clock(r) for r in batched] == [strip_clock(r) for r in one_by_one]
        assert [r[2] for r in batched] == [1, 1, 1, 1, 1, 0]
        assert [s for s, _ in seen] == ["snapshot_page"] * len(calls)
        assert [r for _, r in seen] == batched
        assert store.executor.execute(ScriptBatch(())) == []
    finally:
        store.client.delete(*store.client.keys("*" + namespace + "*") or ["-"])
        store.close()


def test_script_batch_raises_a_script_error_like_a_single_call(redis_server: Any) -> None:
    namespace = "batcherr" + os.urandom(4).hex()
    config = MemtierConfig.load(redis_url=redis_server.url, namespace=namespace)
    store = ConversationStore.from_config(config, recover=False)
    try:
        part = store.core.keyspace.partition(0)
        good = persistence.snapshot_page_call(store.core, part, [])
        bad = persistence.snapshot_page_call(store.core, part, [f"m{i}" for i in range(257)])
        with pytest.raises(MemtierError) as single:
            store.executor.execute(bad)
        with pytest.raises(MemtierError) as batched:
            store.executor.execute(ScriptBatch((good, bad, good)))
        assert type(batched.value) is type(single.value)
    finally:
        store.close()


def _page_call(store: ConversationStore, k: Any) -> ScriptCall:
    return persistence.snapshot_page_call(store.core, store.core.partition_for(k), [k.member])


def _one_session(url: str, n: int) -> tuple[ConversationStore, ConversationKey, Any]:
    """A store on ``url`` (a namespace of its own) with one session, its key, and the
    reply of that session's page call alone."""
    config = MemtierConfig.load(redis_url=url, namespace="overlap" + os.urandom(4).hex())
    store = ConversationStore.from_config(config, recover=False)
    k = key(n)
    store.append(k, turn_for(n))
    return store, k, store.executor.execute(_page_call(store, k))


def test_overlap_of_a_command_runs_the_work_first_and_its_error_wins(redis_server: Any) -> None:
    namespace = "overlap" + os.urandom(4).hex()
    config = MemtierConfig.load(redis_url=redis_server.url, namespace=namespace)
    store = ConversationStore.from_config(config, recover=False)
    try:
        done: list[str] = []
        ping = Command("ping")
        assert store.executor.execute(Overlap(ping, lambda: done.append("work"))) is True
        assert done == ["work"]

        def fail() -> None:
            raise ValueError("the page did not decode")

        with (
            mock.patch.object(store.client, "ping", side_effect=AssertionError("sent")) as sent,
            pytest.raises(ValueError),
        ):
            store.executor.execute(Overlap(ping, fail))
        assert not sent.called  # nothing was in flight when the error surfaced
    finally:
        store.close()


def test_overlap_of_a_lean_script_runs_the_work_between_write_and_read(
    redis_server: Any,
) -> None:
    """The page call is written, the work runs while Redis runs it, the reply is read:
    the same reply as the call alone, the work once, the connection in step after a
    work error (the next call on the kept connection gets its own reply)."""
    store, k, alone = _one_session(redis_server.url, 7)
    try:
        flag = InFlight()
        seen: list[bool] = []
        with mock.patch.object(LeanPool, "execute", flag.execute()):
            reply = store.executor.execute(
                Overlap(_page_call(store, k), lambda: seen.append(flag.on))
            )
            assert reply[2:] == alone[2:] and seen == [True]

            def fail() -> None:
                seen.append(flag.on)
                raise ValueError("the page did not decode")

            with pytest.raises(ValueError):
                store.executor.execute(Overlap(_page_call(store, k), fail))
            assert seen == [True, True]
            assert store.executor.execute(_page_call(store, k))[2:] == alone[2:]
            assert store.executor.execute(Command("ping")) is True
    finally:
        store.close()


def test_overlap_work_is_not_the_page_calls_latency(redis_server: Any) -> None:
    """memtier_script_duration_seconds times the round trip of the page call, not the
    page work run while it was in flight."""
    store, k, _ = _one_session(redis_server.url, 10)
    total = "memtier_script_duration_seconds_sum{script=snapshot_page}"
    count = "memtier_script_duration_seconds_count{script=snapshot_page}"
    try:
        before_total, before_count = scraped(total), scraped(count)
        store.executor.execute(Overlap(_page_call(store, k), lambda: time.sleep(0.3)))
        assert scraped(count) == before_count + 1
        assert 0 < scraped(total) - before_total < 0.3  # the call alone: well under 0.3 s
    finally:
        store.close()


def test_overlap_work_runs_once_across_noscript_and_a_dropped_connection() -> None:
    """A NOSCRIPT re-send and a retry after the connection dropped between the write and
    the read (the script may have run: the page call is replay-safe) send the call
    again; the work ran with the first write only."""
    with RedisServer() as server:
        store, k, alone = _one_session(server.url, 8)
        try:
            flag = InFlight()
            runs: list[str] = []
            with mock.patch.object(LeanPool, "execute", flag.execute()):
                store.client.script_flush()  # the first write answers NOSCRIPT
                reply = store.executor.execute(
                    Overlap(_page_call(store, k), lambda: runs.append("noscript"))
                )
                assert reply[2:] == alone[2:] and runs == ["noscript"]
                assert flag.sends == 2  # the same bytes again, after SCRIPT LOAD

                read_reply = memtier_connection.read_reply
                drops: list[int] = []

                def dropped_once(conn: Any) -> Any:
                    if not drops:  # the reply of the first write is lost with its socket
                        drops.append(1)
                        conn.disconnect()
                        raise redis.ConnectionError("dropped between write and read")
                    return read_reply(conn)

                flag.sends = 0
                with mock.patch.object(memtier_connection, "read_reply", dropped_once):
                    reply = store.executor.execute(
                        Overlap(_page_call(store, k), lambda: runs.append("dropped"))
                    )
                assert reply[2:] == alone[2:] and drops == [1]
                assert runs == ["noscript", "dropped"] and flag.sends == 2
        finally:
            store.close()


def test_overlap_work_runs_and_wins_when_no_attempt_was_written() -> None:
    with RedisServer() as server:
        store, k, _ = _one_session(server.url, 9)
        store.executor.policy = RetryPolicy(horizon_s=0.5, max_attempts=2)
        try:
            store.client.connection_pool.disconnect()
            server.stop()  # every attempt finds no server: nothing is written
            runs: list[str] = []
            with pytest.raises(BackendError):
                store.executor.execute(Overlap(_page_call(store, k), lambda: runs.append("w")))
            assert runs == ["w"]  # the work still ran, once

            def fail() -> None:
                raise ValueError("disk full")

            with pytest.raises(ValueError):
                store.executor.execute(Overlap(_page_call(store, k), fail))
        finally:
            store.close()


async def test_async_overlap_and_batch(redis_server: Any) -> None:
    from memtier import AsyncConversationStore

    namespace = "aoverlap" + os.urandom(4).hex()
    config = MemtierConfig.load(redis_url=redis_server.url, namespace=namespace)
    store = AsyncConversationStore.from_config(config)
    try:
        done: list[str] = []
        reply = await store.executor.execute(Overlap(Command("ping"), lambda: done.append("w")))
        assert reply is True and done == ["w"]
        part = store.core.keyspace.partition(0)
        call = persistence.snapshot_page_call(store.core, part, [])
        replies = await store.executor.execute(ScriptBatch((call, call)))
        assert [r[2:] for r in replies] == [[0], [0]]

        def fail() -> None:
            raise ValueError("boom")

        with pytest.raises(ValueError):
            await store.executor.execute(Overlap(Command("ping"), fail))
    finally:
        await store.aclose()


# ----------------------------------------------------------------------------- page walk

_RECORD = b"1|1764500000001|1764500000001|2|0|" + orjson.dumps(
    {"k": "avatar", "id": "t1", "f": {"text": "hi"}}
)


@st.composite
def _reply(draw: st.DrawFn) -> list[Any]:
    n = draw(st.integers(0, 4))
    out: list[Any] = [1, 2, n]
    for i in range(n):
        flat = ["id", "ses_x", "created", "1", "created_wall", "1"]
        flat += ["seq", "1", "turns", "1", "bytes", "2", "tools", "0"]
        out += [draw(st.sampled_from([f"m{i}", f"m{i}".encode()])), len(flat), *flat]
        recs = draw(st.lists(st.just(_RECORD), max_size=2))
        out += [len(recs), *recs]
    cut = draw(st.integers(0, 12))
    if cut == 0 and len(out) > 3:
        out = out[: draw(st.integers(3, len(out) - 1))]  # truncated
    elif cut == 1:
        out.append(b"trailing")
    elif cut == 2 and n:
        out[4] = draw(st.sampled_from([b"x", 10**6, -50]))  # a bad field count
    return out


@given(_reply())
@example([1, 2, 0])
@example([1, 2, 1])
def test_page_last_member_agrees_with_page_lines(reply: list[Any]) -> None:
    """Where the page decodes, the walk names its last session; otherwise the walk
    either names one (the decode fails later, in the flush's work) or raises
    ScriptError -- never another exception."""
    try:
        walked: str | type[ScriptError] | None = page_last_member(reply)
    except ScriptError:
        walked = ScriptError
    try:
        lines = page_lines(reply)
    except (ScriptError, IndexError, ValueError, TypeError):
        return
    assert walked == (lines[-1]["member"] if lines else None)


def test_backend_error_is_a_memtier_error() -> None:
    assert issubclass(BackendError, MemtierError)  # what the killed-server test catches


# ----------------------------------------------------------------------------- between passes


@pytest.mark.parametrize("mutated_line", [1, 5, 11])
def test_a_line_changed_between_the_passes_is_never_restored(
    backend: Any, tmp_path: Path, mutated_line: int
) -> None:
    """Pass 2 restores a chunk only if its bytes are the ones pass 1 validated: a line
    changed after pass 1 (still valid JSON, still a valid session: a letter of its id)
    stops the restore before any session of its chunk, keeps what earlier chunks
    restored, and quarantines the file."""
    from memtier.memory.snapshot import HEADER_BLOCK, validation

    store = persistent_store(backend, tmp_path, Clock())
    try:
        for n in range(12):
            store.append(key(n + 1, "im" if n % 2 else "public"), turn_for(2 * n))
        flushed = store.flush()
        wipe_store(backend, store)
        path = Path(flushed.path)
        lines = path.read_bytes()[HEADER_BLOCK:].split(b"\n")[:-1]
        members = [orjson.loads(line)["member"] for line in lines]
        real = persistence.restorebatch.iter_generation_sized

        def change_after_pass_1(verified: Any) -> Any:
            raw = bytearray(path.read_bytes())
            start = HEADER_BLOCK + sum(len(x) + 1 for x in lines[:mutated_line])
            at = raw.index(b'"id":"ses_', start) + len(b'"id":"ses_')  # the session id
            assert at < start + len(lines[mutated_line])
            raw[at] = ord("b") if raw[at] != ord("b") else ord("c")  # same length, valid
            path.write_bytes(bytes(raw))
            return real(verified)

        with (
            mock.patch.object(validation, "CHUNK_LINES", 4),
            mock.patch.object(
                persistence.restorebatch, "iter_generation_sized", change_after_pass_1
            ),
        ):
            report = store.recover(force=True)
        assert report.outcome == "error" and "changed" in report.message
        chunk = mutated_line // 4
        assert report.restored == 4 * chunk
        assert [name for name, _ in report.quarantined] == [path.name]
        for i, member in enumerate(members):
            restored = store.context(ConversationKey.from_member(member)).session_id is not None
            assert restored == (i < 4 * chunk), (i, member)
    finally:
        wipe_store(backend, store)
        store.close()


def test_pass_1_steps_at_every_chunk_so_few_large_sessions_keep_the_lock(
    backend: Any, tmp_path: Path
) -> None:
    """verify_steps yields per chunk of bytes too: the restorer extends its lock while a
    file of a few large sessions is read (it yielded only every 256 lines before)."""
    from memtier.memory.snapshot import validation

    store = persistent_store(backend, tmp_path, Clock())
    try:
        for n in range(5):
            store.append(key(n + 1), turn_for(2 * n))
        flushed = store.flush()
        gen = snaps(store).generations()[0]
        with mock.patch.object(validation, "CHUNK_BYTES", 1):  # every line ends a chunk
            steps = validation.verify_steps(gen, snaps(store).namespace, store.core.conv, 1 << 40)
            counts: list[int] = []
            while True:
                try:
                    counts.append(next(steps))
                except StopIteration as stop:
                    verdict = stop.value
                    break
        assert counts == [1, 2, 3, 4, 5] and flushed.sessions == 5
        assert isinstance(verdict, VerifiedGeneration) and len(verdict.chunks) == 5
    finally:
        wipe_store(backend, store)
        store.close()
