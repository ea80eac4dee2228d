"""The lean path's kept connections and its packer (issue 12, "A lean call path").

:class:`~memtier.connection.LeanPool` keeps the connections of its script calls idle
between calls instead of sending each one back through redis-py's pool, and packs with
hiredis.  The promises, and the adversaries that try to break them:

* the packer writes exactly the bytes redis-py's does (a Hypothesis property over every
  argument type a script call can carry);
* a kept connection never answers with another call's reply and never makes another
  command wait: a Hypothesis state machine mixes lean calls, generic calls, connections
  killed by the server, ``pool.disconnect()`` and ``SCRIPT FLUSH`` on a pool of one or two
  connections, against a model where every call answers its own payload in one attempt
  (a killed connection is found before the send, not by a failed attempt), no call holds a
  connection afterwards and the pool never opens more than its bound;
* memtier's pool takes the kept connections back before any other command, and keeps
  none while it has no connection free (another command would otherwise wait out the
  pool timeout and fail), also with two guards on one client (two stores sharing it);
* a caller's own plain pool loses at most a quarter of its bound (at most 16) to kept
  connections, under concurrent callers; a caller's blocking pool, none;
* a forked child never writes on its parent's kept socket.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from servers import held_connections, running_server

from memtier import MemtierConfig
from memtier.connection import (
    KeptAsyncConnectionsPool,
    KeptConnectionsPool,
    LeanPool,
    SyncClientGuard,
    connect_sync,
    idle_to_keep,
    lean_pool,
)
from memtier.engine import ScriptCall
from memtier.executor import SyncExecutor
from memtier.resppack import HIREDIS_PACK
from memtier.retry import RetryPolicy
from memtier.scripts import ScriptRegistry, load_registry

ECHO_LUA = """#!lua
-- KEYS[1] unused (the slot); ARGV[1] a payload; returns ARGV[1].
return ARGV[1]
"""


def _registry(root: Path) -> ScriptRegistry:
    folder = root / "echo"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "echo-1.lua").write_text(ECHO_LUA, encoding="utf-8")
    return load_registry("echo", root)


def _settings(max_connections: int) -> dict[str, Any]:
    return {
        "max_connections": max_connections,
        "socket_timeout_seconds": 2.0,
        "connect_timeout_seconds": 2.0,
        "pool_timeout_seconds": 5.0,
    }


def _executor(client: Any, scripts: ScriptRegistry, max_connections: int, *, lean: bool) -> Any:
    config = MemtierConfig.load(redis=_settings(max_connections))
    return SyncExecutor(client, scripts, SyncClientGuard(config.redis), RetryPolicy(), lean=lean)


def _echo(payload: str) -> ScriptCall:
    return ScriptCall("echo", ("{lean}:k",), (payload,), attempts=[0])


def _kept(client: Any) -> list[Any]:
    lean = lean_pool(client)
    assert lean is not None
    return list(lean._idle or ())


# ------------------------------------------------------------------ the packer

_ARG = st.one_of(
    st.text(max_size=40),
    st.binary(max_size=40),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
)


# The lean path's command names: one word each (redis-py splits a first argument that
# holds a space, "CONFIG GET", into words; no lean call sends one).
_NAME = st.sampled_from(["EVALSHA", "MULTI", "EXEC", "LRANGE", "HMGET", "SCRIPT"])


@settings(max_examples=300, deadline=None)
@given(name=_NAME, args=st.lists(_ARG, max_size=12))
@example(name="EVALSHA", args=["é\u2028\U0001f600", b"\x00\r\n", 2**64, -0.0, 1e300])
@example(name="EXEC", args=[""])
def test_the_hiredis_packer_writes_what_redis_py_writes(name: str, args: list[Any]) -> None:
    assert HIREDIS_PACK is not None  # redis[hiredis] is a dependency
    command = (name, *args)
    assert HIREDIS_PACK(command) == b"".join(redis.Connection().pack_command(*command))


def test_a_pool_with_another_encoding_keeps_redis_pys_packer() -> None:
    latin = redis.ConnectionPool(encoding="latin-1")
    lossy = redis.ConnectionPool(encoding_errors="replace")
    assert LeanPool(latin)._packer is None and LeanPool(lossy)._packer is None
    assert LeanPool(redis.ConnectionPool())._packer is HIREDIS_PACK


def test_how_many_connections_each_kind_of_pool_may_keep_idle() -> None:
    class Custom(redis.ConnectionPool):
        pass

    assert idle_to_keep(KeptConnectionsPool(max_connections=50)) == 50
    assert idle_to_keep(redis.ConnectionPool(max_connections=100)) == 16
    assert idle_to_keep(redis.ConnectionPool(max_connections=8)) == 2
    assert idle_to_keep(redis.ConnectionPool(max_connections=3)) == 0
    assert idle_to_keep(redis.BlockingConnectionPool(max_connections=50)) == 0
    assert idle_to_keep(Custom(max_connections=100)) == 0
    # asyncio pools, the same rule (the auto-pipeline's direct calls keep them)
    assert idle_to_keep(KeptAsyncConnectionsPool(max_connections=50)) == 50
    assert idle_to_keep(redis.asyncio.ConnectionPool(max_connections=100)) == 16
    assert idle_to_keep(redis.asyncio.ConnectionPool(max_connections=3)) == 0
    assert idle_to_keep(redis.asyncio.BlockingConnectionPool(max_connections=50)) == 0
    pool = redis.ConnectionPool(max_connections=3)
    assert LeanPool(pool, keep_idle=idle_to_keep(pool))._idle is None


# ------------------------------------------------------------------ the state machine


class KeptConnectionsMachine(RuleBasedStateMachine):
    """Lean and generic calls, server-side kills and pool resets on a pool of 1 or 2."""

    server: Any = None
    scripts: ScriptRegistry | None = None

    def __init__(self) -> None:
        super().__init__()
        assert self.server is not None and self.scripts is not None
        self.max_connections = 1
        self.client: Any = None
        self._open(1)
        self.calls = 0

    def _open(self, bound: int) -> None:
        if self.client is not None:
            self.client.close()
        self.max_connections = bound
        config = MemtierConfig.load(redis_url=self.server.url, redis=_settings(bound))
        self.client, _ = connect_sync(config)
        assert isinstance(self.client.connection_pool, KeptConnectionsPool)
        self.lean = _executor(self.client, self.scripts, bound, lean=True)
        self.generic = _executor(self.client, self.scripts, bound, lean=False)

    def _call(self, executor: Any, payload: str) -> None:
        call = _echo(payload)
        assert executor.execute(call) == payload.encode()
        assert call.attempts == [1]  # a dead kept connection is found before the send
        self.calls += 1

    @rule(bound=st.sampled_from([1, 2]))
    def reopen(self, bound: int) -> None:
        self._open(bound)

    @rule(payload=st.text(max_size=30))
    def lean_call(self, payload: str) -> None:
        self._call(self.lean, payload)

    @rule(payload=st.text(max_size=30))
    def generic_call(self, payload: str) -> None:
        self._call(self.generic, payload)

    @rule()
    def generic_command_outside_the_executor(self) -> None:
        assert self.client.echo("plain") == b"plain"

    @rule()
    def the_server_kills_every_client_connection(self) -> None:
        with self.server.client() as admin:
            assert admin.info("server")["process_id"] == self.server.pid  # our own server
            admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")

    @rule()
    def the_pool_is_disconnected(self) -> None:
        self.client.connection_pool.disconnect()

    @rule()
    def the_script_cache_is_flushed(self) -> None:
        with self.server.client() as admin:
            admin.script_flush()

    @invariant()
    def no_call_holds_a_connection_and_the_bound_holds(self) -> None:
        pool = self.client.connection_pool
        assert held_connections(self.client) == []
        assert len([c for c in pool._connections if c is not None]) <= self.max_connections
        assert len(_kept(self.client)) <= self.max_connections

    def teardown(self) -> None:
        if self.client is not None:
            self.client.close()


@pytest.mark.real
def test_kept_connections_against_kills_resets_and_generic_commands(tmp_path: Path) -> None:
    with running_server() as server:
        KeptConnectionsMachine.server = server
        KeptConnectionsMachine.scripts = _registry(tmp_path)
        try:
            run_state_machine_as_test(
                KeptConnectionsMachine,
                settings=settings(max_examples=40, stateful_step_count=25, deadline=None),
            )
        finally:
            KeptConnectionsMachine.server = None
            KeptConnectionsMachine.scripts = None


# ------------------------------------------------------------------ pools and threads


@pytest.mark.real
@pytest.mark.parametrize("fault", ["server kills it", "pool.disconnect()", "both"])
def test_a_kept_connection_that_was_closed_is_replaced_before_the_send(
    tmp_path: Path, fault: str
) -> None:
    """The sequence the machine may not draw every run: fault, then a lean call at once."""
    scripts = _registry(tmp_path)
    with running_server() as server:
        client, _ = connect_sync(MemtierConfig.load(redis_url=server.url, redis=_settings(2)))
        try:
            lean = _executor(client, scripts, 2, lean=True)
            for i in range(3):
                assert lean.execute(_echo(f"warm-{i}")) == f"warm-{i}".encode()
                assert len(_kept(client)) == 1
                if fault != "pool.disconnect()":
                    with server.client() as admin:
                        assert admin.info("server")["process_id"] == server.pid
                        killed = admin.execute_command(
                            "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"
                        )
                        assert killed == 1  # the kept connection, and only it
                if fault != "server kills it":
                    client.connection_pool.disconnect()
                call = _echo(f"after-{i}")
                assert lean.execute(call) == f"after-{i}".encode()
                assert call.attempts == [1]  # no failed attempt, no retry
            assert held_connections(client) == []
        finally:
            client.close()


@pytest.mark.real
def test_the_kept_connection_goes_to_a_generic_command_when_none_is_free(
    tmp_path: Path,
) -> None:
    scripts = _registry(tmp_path)
    with running_server() as server:
        settings_ = _settings(2) | {"pool_timeout_seconds": 30.0}
        client, _ = connect_sync(MemtierConfig.load(redis_url=server.url, redis=settings_))
        pool = client.connection_pool
        try:
            lean = _executor(client, scripts, 2, lean=True)
            assert lean.execute(_echo("a")) == b"a"
            assert len(_kept(client)) == 1  # one kept idle, one slot free
            # Another holder takes the free slot (past the give-back, as a caller of a
            # plain BlockingConnectionPool would): none is free now.
            holder = super(KeptConnectionsPool, pool).get_connection()
            assert pool.exhausted()
            # Without the give-back this waits the 30 s pool timeout and raises.
            assert client.echo("generic") == b"generic"
            assert _kept(client) == []
            # A lean call while none is free gives its connection back to the pool.
            assert lean.execute(_echo("b")) == b"b"
            assert _kept(client) == [] and held_connections(client) == [holder]
            pool.release(holder)
            assert lean.execute(_echo("c")) == b"c"
            assert len(_kept(client)) == 1 and held_connections(client) == []
            assert lean.lean_calls == 3
        finally:
            client.close()


@pytest.mark.real
def test_a_pool_of_one_never_keeps_its_connection(tmp_path: Path) -> None:
    scripts = _registry(tmp_path)
    with running_server() as server:
        client, _ = connect_sync(MemtierConfig.load(redis_url=server.url, redis=_settings(1)))
        try:
            lean = _executor(client, scripts, 1, lean=True)
            for i in range(3):
                assert lean.execute(_echo(f"x{i}")) == f"x{i}".encode()
                assert _kept(client) == []  # kept, it would leave no connection free
                assert client.echo("generic") == b"generic"
        finally:
            client.close()


def _hammer(executor: Any, tag: str, start: threading.Barrier, wrong: list[str]) -> None:
    start.wait(timeout=30)
    for i in range(40):
        payload = f"{tag}-{i}"
        reply = executor.execute(_echo(payload))
        if reply != payload.encode():
            wrong.append(f"{payload} got {reply!r}")


@pytest.mark.real
def test_concurrent_calls_on_memtiers_pool_never_wait_on_a_kept_connection(
    tmp_path: Path,
) -> None:
    scripts = _registry(tmp_path)
    with running_server() as server:
        client, _ = connect_sync(MemtierConfig.load(redis_url=server.url, redis=_settings(2)))
        try:
            lean = _executor(client, scripts, 2, lean=True)
            generic = _executor(client, scripts, 2, lean=False)
            wrong: list[str] = []
            start = threading.Barrier(6)
            threads = [
                threading.Thread(target=_hammer, args=(ex, f"{name}{n}", start, wrong))
                for n in range(3)
                for name, ex in (("lean", lean), ("generic", generic))
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=120)
            assert not any(thread.is_alive() for thread in threads)
            assert wrong == []
            assert lean.lean_calls == 120 and generic.lean_calls == 0
            assert len(client.connection_pool._connections) <= 2
            assert held_connections(client) == []
        finally:
            client.close()


@pytest.mark.real
@pytest.mark.parametrize(("kind", "bound", "keep"), [("plain", 8, 2), ("blocking", 8, 0)])
def test_a_callers_pool_keeps_at_most_its_share(
    tmp_path: Path, kind: str, bound: int, keep: int
) -> None:
    scripts = _registry(tmp_path)
    with running_server() as server:
        make = redis.ConnectionPool if kind == "plain" else redis.BlockingConnectionPool
        pool = make(host="127.0.0.1", port=server.port, max_connections=bound)
        client = redis.Redis(connection_pool=pool)
        try:
            lean = _executor(client, scripts, bound, lean=True)
            wrong: list[str] = []
            start = threading.Barrier(6)
            threads = [
                threading.Thread(target=_hammer, args=(lean, f"t{n}", start, wrong))
                for n in range(6)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=120)
            assert not any(thread.is_alive() for thread in threads)
            assert wrong == [] and lean.lean_calls == 240
            kept = lean_pool(client)
            assert kept is not None
            idle = list(kept._idle or ())
            assert len(idle) <= keep
            if kind == "plain":  # every checked-out connection is a kept, idle one
                assert {id(c) for c in pool._in_use_connections} == {id(c) for c in idle}
        finally:
            client.close()
            pool.disconnect()  # the caller's pool: closing the client leaves it open


@pytest.mark.real
def test_a_forked_child_never_writes_on_its_parents_kept_socket(tmp_path: Path) -> None:
    scripts = _registry(tmp_path)
    with running_server() as server:
        client, _ = connect_sync(MemtierConfig.load(redis_url=server.url, redis=_settings(4)))
        try:
            lean = _executor(client, scripts, 4, lean=True)
            assert lean.execute(_echo("parent")) == b"parent"
            (parents,) = _kept(client)
            child = os.fork()
            if child == 0:  # pragma: no cover - runs in the child, reports by exit code
                code = 1
                try:
                    ok = all(
                        lean.execute(_echo(f"child-{i}")) == f"child-{i}".encode()
                        for i in range(30)
                    )
                    code = 0 if ok and all(c is not parents for c in _kept(client)) else 2
                finally:
                    os._exit(code)
            for i in range(30):  # the parent goes on on its socket meanwhile
                assert lean.execute(_echo(f"parent-{i}")) == f"parent-{i}".encode()
            _, status = os.waitpid(child, 0)
            assert os.waitstatus_to_exitcode(status) == 0
            assert _kept(client) == [parents]
        finally:
            client.close()
