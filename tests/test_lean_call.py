"""The lean call path for script calls (issue 12, "A lean call path").

A :class:`~memtier.executor.SyncExecutor` on a plain standalone redis-py client sends its
EVALSHA packed once on a pooled connection (:class:`memtier.connection.LeanPool`),
bypassing redis-py's command machinery.  These tests hold it to the generic path:

* it is taken on a real standalone client (counted), never on fakeredis, a subclass or
  a single-connection client (a cluster client has its own lean path:
  ``tests/test_lean_cluster.py``);
* a Hypothesis property over script replies and error replies (values, nested arrays,
  status and error replies, ``memtier:`` rejections, WRONGTYPE inside the script, a
  transient error that is retried to exhaustion, NOSCRIPT after ``SCRIPT FLUSH``) gives
  the same reply or the same memtier error, attempt count and retry behaviour on both
  paths, on a real redis-server;
* connection faults: a private server restarted under concurrent callers, and a stall
  past the socket timeout, leave the pool with no connection checked out and no
  connection that answers with another call's reply.
"""

from __future__ import annotations

import string
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import example, given, settings
from hypothesis import strategies as st
from servers import held_connections, running_server

from memtier import BackendError, MemtierConfig, MemtierError, OutcomeUnknownError
from memtier.connection import SyncClientGuard, connect_sync, lean_pool
from memtier.engine import ScriptCall
from memtier.executor import SyncExecutor
from memtier.retry import RetryPolicy
from memtier.scripts import ScriptRegistry, load_registry

# One probe script: ARGV[1] names the reply kind, ARGV[2..] its payload.
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
elseif kind == "nested" then return {ARGV[2], {tonumber(ARGV[3]), {ARGV[2]}}, 7}
elseif kind == "status" then return redis.status_reply(ARGV[2])
elseif kind == "err" then return redis.error_reply("ERR " .. ARGV[2])
elseif kind == "memtier" then return redis.error_reply("memtier: bad " .. ARGV[2])
elseif kind == "transient" then return redis.error_reply("TRYAGAIN " .. ARGV[2])
elseif kind == "wrongtype" then return redis.call("INCR", KEYS[1])
end
return redis.error_reply("ERR unknown kind")
"""
LIST_KEY = "{lean}:list"
SETTINGS = {
    "max_connections": 2,
    "socket_timeout_seconds": 0.5,
    "connect_timeout_seconds": 0.5,
    "pool_timeout_seconds": 5.0,
}


def _registry(root: Path) -> ScriptRegistry:
    folder = root / "probe"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "probe-1.lua").write_text(PROBE_LUA, encoding="utf-8")
    return load_registry("probe", root)


def _executor(client: Any, scripts: ScriptRegistry, *, lean: bool = True) -> SyncExecutor:
    config = MemtierConfig.load(redis=SETTINGS)
    return SyncExecutor(client, scripts, SyncClientGuard(config.redis), RetryPolicy(), lean=lean)


def _call(kind: str, *payload: str | int) -> ScriptCall:
    return ScriptCall("probe", (LIST_KEY,), (kind, *payload), attempts=[0])


def _outcome(executor: SyncExecutor, call: ScriptCall) -> tuple[Any, ...]:
    try:
        reply = executor.execute(call)
    except MemtierError as exc:
        return ("error", type(exc), str(exc), exc.code, call.attempts)
    return ("reply", reply, call.attempts)


@pytest.fixture(scope="module")
def probe(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    scripts = _registry(tmp_path_factory.mktemp("lean"))
    client, _ = connect_sync(MemtierConfig.load(redis_url=redis_server.url, redis=SETTINGS))
    client.delete(LIST_KEY)
    client.rpush(LIST_KEY, "x")
    yield client, scripts
    client.close()


@pytest.mark.real
def test_the_lean_path_is_taken_on_a_real_client_only(probe: Any, tmp_path: Path) -> None:
    client, scripts = probe
    lean, generic = _executor(client, scripts), _executor(client, scripts, lean=False)
    assert lean.execute(_call("str", "a")) == b"a"
    assert generic.execute(_call("str", "a")) == b"a"
    assert (lean.lean_calls, generic.lean_calls) == (1, 0)
    assert lean_pool(client) is not None

    import fakeredis

    class Traced(redis.Redis):  # a subclass may hook execute_command: keep redis-py's path
        pass

    fake = fakeredis.FakeRedis()
    single = redis.Redis(connection_pool=client.connection_pool, single_connection_client=True)
    try:
        assert lean_pool(fake) is None
        assert lean_pool(Traced(connection_pool=client.connection_pool)) is None
        assert lean_pool(single) is None
    finally:
        single.close()


@pytest.mark.real
def test_a_store_append_on_a_real_client_takes_the_lean_path(redis_server: Any) -> None:
    from memtier import AvatarMessage, ConversationKey, ConversationStore

    client, _ = connect_sync(MemtierConfig.load(redis_url=redis_server.url, redis=SETTINGS))
    try:
        store = ConversationStore(client, MemtierConfig.load(redis=SETTINGS))
        key = ConversationKey(str(uuid.uuid4()), "im")
        store.append(key, AvatarMessage(text="hello lean"))
        appended = store.executor.lean_calls
        assert appended >= 1
        context = store.context(key, limit=5)
        assert store.executor.lean_calls > appended
        assert "hello lean" in context.model_dump_json()
        assert held_connections(client) == []
    finally:
        client.close()


_TEXT = st.text(string.ascii_letters + string.digits + " _-", min_size=1, max_size=24)
_CALLS = st.one_of(
    st.tuples(st.just("int"), st.integers(-(2**53), 2**53).map(str)),
    st.tuples(st.sampled_from(["str", "status", "err", "memtier", "transient"]), _TEXT),
    st.tuples(st.just("nil")),
    st.lists(_TEXT, max_size=6).map(lambda items: ("arr", *items)),
    st.tuples(st.just("nested"), _TEXT, st.integers(-1000, 1000).map(str)),
    st.tuples(st.just("wrongtype")),
)


@pytest.mark.real
@settings(max_examples=60, deadline=None)
@given(call=_CALLS, flush_first=st.booleans())
@example(call=("transient", "x"), flush_first=False)
@example(call=("memtier", "x"), flush_first=True)
@example(call=("nil",), flush_first=True)
def test_lean_and_generic_paths_give_the_same_replies_and_errors(
    probe: Any, call: tuple[str, ...], flush_first: bool
) -> None:
    client, scripts = probe
    outcomes = []
    for lean in (True, False):
        executor = _executor(client, scripts, lean=lean)
        if flush_first:  # NOSCRIPT on the first send: reloaded, re-sent
            client.script_flush()
        outcomes.append(_outcome(executor, _call(*call)))
        assert executor.lean_calls == (outcomes[-1][-1][0] if lean else 0)
    assert outcomes[0] == outcomes[1]
    assert held_connections(client) == []


def _worker(executor: SyncExecutor, tag: str, wrong: list[str], stop: threading.Event) -> None:
    for i in range(400):  # bounded; stops early once the restart is over
        if stop.is_set():
            return
        payload = f"{tag}-{i}"
        try:
            reply = executor.execute(_call("str", payload))
        except (BackendError, OutcomeUnknownError):
            continue  # the server was down for this call: a typed error is allowed
        if reply != payload.encode():
            wrong.append(f"{payload} got {reply!r}")


@pytest.mark.real
def test_the_pool_recovers_after_the_server_is_killed_mid_use(tmp_path: Path) -> None:
    scripts = _registry(tmp_path)
    with running_server() as server:
        client, _ = connect_sync(MemtierConfig.load(redis_url=server.url, redis=SETTINGS))
        try:
            executor = _executor(client, scripts)
            assert executor.execute(_call("str", "before")) == b"before"
            wrong: list[str] = []
            stop = threading.Event()
            workers = [
                threading.Thread(target=_worker, args=(executor, f"w{n}", wrong, stop))
                for n in range(2)
            ]
            for worker in workers:
                worker.start()
            server.restart()  # kills the process under the callers; script cache is empty
            stop.set()
            for worker in workers:
                worker.join(timeout=60)
            assert not any(worker.is_alive() for worker in workers)
            assert wrong == []
            assert held_connections(client) == []
            for i in range(20):  # every pooled connection answers with its own reply
                assert executor.execute(_call("str", f"after-{i}")) == f"after-{i}".encode()
            assert held_connections(client) == []
            assert executor.lean_calls > 20
        finally:
            client.close()


@pytest.mark.real
def test_a_timed_out_call_does_not_poison_its_connection(tmp_path: Path) -> None:
    """A reply that arrives after the socket timeout must never be read by the next call."""
    scripts = _registry(tmp_path)
    with running_server() as server:
        client, _ = connect_sync(MemtierConfig.load(redis_url=server.url, redis=SETTINGS))
        try:
            executor = _executor(client, scripts)
            assert executor.execute(_call("str", "warm")) == b"warm"
            with server.client() as admin:
                assert admin.info("server")["process_id"] == server.pid  # our own server
                assert admin.execute_command("CLIENT", "PAUSE", 1200, "ALL")
            late = _call("str", "late")
            try:
                assert executor.execute(late) == b"late"
            except OutcomeUnknownError:
                pass
            assert late.attempts is not None and late.attempts[0] >= 2  # one timed out
            with server.client() as admin:
                admin.execute_command("CLIENT", "UNPAUSE")
            for i in range(10):
                assert executor.execute(_call("str", f"next-{i}")) == f"next-{i}".encode()
            assert held_connections(client) == []
        finally:
            client.close()
