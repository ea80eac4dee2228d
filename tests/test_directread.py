"""The lean sync path's reply read (memtier.directread): redis-py's results, read direct.

The same byte streams the asyncio reader is held to (tests/test_autopipeline.py: RESP2
replies, errors, nested arrays, RESP3 types, cut anywhere, then closed or stalled past the
socket timeout) are read by :func:`read_reply` on one connection and by redis-py's own
``read_response`` on another: the same replies, the same error replies, the same end.
"""

from __future__ import annotations

import asyncio
import errno
import select
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_autopipeline import _replier, assert_same_reads, quiet_connection_kwargs, stream_cases

from memtier.directread import quiet, read_direct, read_reply, reads_direct


class _Served:
    """``_replier`` on an event loop of its own thread, for sync connections."""

    def __init__(self, stream: bytes, cuts: list[int], end: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        future = asyncio.run_coroutine_threadsafe(_replier(stream, cuts, end), self.loop)
        self.server, self.port = future.result(timeout=30)

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()
            for task in asyncio.all_tasks():  # the stalled handlers
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()


def _read_all(read: Callable[[], Any], count: int) -> list[Any]:
    out: list[Any] = []
    for _ in range(count):
        try:
            out.append(read())
        except redis.ResponseError as exc:  # an error reply: the connection is in step
            out.append(exc)
        except (redis.ConnectionError, redis.TimeoutError) as exc:  # the end of it
            out.append(exc)
            break
    return out


@stream_cases
def test_the_direct_read_gives_what_redis_pys_read_response_gives(
    replies: list[bytes], cuts: list[int], extra: int, end: str, protocol: int
) -> None:
    hello = b"%2\r\n$6\r\nserver\r\n$5\r\nredis\r\n$5\r\nproto\r\n:3\r\n" if protocol == 3 else b""
    resp3 = [b"_\r\n", b"#t\r\n", b",3.5\r\n", b"%1\r\n+a\r\n:1\r\n"] if protocol == 3 else []
    replies = [*replies, *resp3]
    served = _Served(hello + b"".join(replies), cuts, end)
    try:
        results = []
        for direct in (True, False):
            conn = redis.Connection(
                host="127.0.0.1",
                port=served.port,
                socket_timeout=0.2,
                socket_connect_timeout=30,  # (a loaded CI machine: see the asyncio test)
                protocol=protocol,
                **quiet_connection_kwargs(),
            )
            conn.connect()
            try:
                if direct:
                    assert reads_direct(conn)
                    results.append(_read_all(lambda c=conn: read_reply(c), len(replies) + extra))
                else:
                    results.append(_read_all(conn.read_response, len(replies) + extra))
            finally:
                conn.disconnect()
    finally:
        served.close()
    assert_same_reads(*results, extra, end)


@pytest.fixture
def conn(redis_server: Any) -> Iterator[redis.Connection]:
    c = redis.Connection(host="127.0.0.1", port=redis_server.port, **quiet_connection_kwargs())
    c.connect()
    try:
        yield c
    finally:
        c.disconnect()


@pytest.mark.real
def test_the_checks_run_again_after_a_reconnect_and_on_a_health_check(
    conn: redis.Connection,
) -> None:
    for _ in range(2):
        assert reads_direct(conn)
        parser: Any = conn._parser
        assert conn._memtier_direct_reads == (parser, parser._reader, parser._sock)  # type: ignore[attr-defined]
        conn.send_command("ECHO", "x")
        assert read_reply(conn) == b"x"
        before = parser._reader
        conn.disconnect()
        conn.connect()
        assert conn._parser._reader is not before  # type: ignore[attr-defined]
    assert reads_direct(conn)
    conn.health_check_interval = 5
    assert not reads_direct(conn)
    conn.send_command("ECHO", "y")
    assert read_reply(conn) == b"y"  # redis-py's own read, with its health-check clock


@pytest.mark.real
def test_other_parsers_and_unconnected_connections_keep_redis_pys_read(redis_server: Any) -> None:
    from redis._parsers import _RESP2Parser

    python_parser = redis.Connection(
        host="127.0.0.1",
        port=redis_server.port,
        parser_class=_RESP2Parser,
        **quiet_connection_kwargs(),
    )
    python_parser.connect()
    try:
        assert not reads_direct(python_parser)
        python_parser.send_command("ECHO", "z")
        assert read_reply(python_parser) == b"z"
    finally:
        python_parser.disconnect()
    assert not reads_direct(redis.Connection(host="127.0.0.1", port=redis_server.port))


class _FailingSocket:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def recv_into(self, buffer: bytearray) -> int:
        raise self.exc


@pytest.mark.real
@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (TimeoutError("timed out"), redis.TimeoutError),
        (TimeoutError(errno.ETIMEDOUT, "Connection timed out"), redis.ConnectionError),
        (ConnectionResetError(errno.ECONNRESET, "reset"), redis.ConnectionError),
        (OSError(errno.EBADF, "Bad file descriptor"), redis.ConnectionError),
    ],
)
def test_socket_failures_are_redis_pys_errors(
    conn: redis.Connection, raised: BaseException, expected: type[Exception]
) -> None:
    """A socket timeout is a timeout; the kernel's ETIMEDOUT (the peer is gone), a reset
    or any other socket error a lost connection -- as redis-py's read_response says."""
    assert reads_direct(conn)
    conn._parser._sock = _FailingSocket(raised)  # type: ignore[attr-defined]
    with pytest.raises(expected) as caught:
        read_direct(conn)
    assert not isinstance(caught.value, redis.TimeoutError) or expected is redis.TimeoutError


@pytest.mark.real
def test_a_socket_dropped_meanwhile_is_a_lost_connection(conn: redis.Connection) -> None:
    assert reads_direct(conn)
    conn._parser._sock = None  # type: ignore[attr-defined]  # (what on_disconnect leaves)
    with pytest.raises(redis.ConnectionError):
        read_direct(conn)


# --- quiet(): a kept connection's "nothing unread" in one poll, against redis-py's can_read


def _wait_readable(conn: redis.Connection) -> None:
    sock: Any = conn._sock  # type: ignore[attr-defined]
    select.select([sock], [], [], 5)


def _dirty(conn: redis.Connection) -> bool:
    """redis-py's answer: something unread, or the socket closed by the server."""
    try:
        return bool(conn.can_read())
    except (redis.ConnectionError, OSError):
        return True


_STEPS = st.lists(
    st.sampled_from(["roundtrip", "leave", "kill", "feed", "reconnect"]), min_size=1, max_size=8
)


@pytest.mark.real
@settings(max_examples=25, deadline=None)
@given(steps=_STEPS)
@example(steps=["roundtrip", "leave", "roundtrip"])
@example(steps=["kill", "reconnect", "roundtrip"])
@example(steps=["feed"])
@example(steps=["reconnect", "leave"])
def test_quiet_agrees_with_redis_pys_can_read(redis_server: Any, steps: list[str]) -> None:
    conn = redis.Connection(host="127.0.0.1", port=redis_server.port, **quiet_connection_kwargs())
    other = redis.Redis(host="127.0.0.1", port=redis_server.port)
    conn.connect()
    try:
        for step in steps:
            if step == "roundtrip":
                conn.send_command("ECHO", "x")
                assert read_reply(conn) == b"x"
            elif step == "leave":  # a reply nobody reads
                conn.send_command("PING")
                _wait_readable(conn)
            elif step == "kill":  # closed by the server
                conn.send_command("CLIENT", "ID")
                other.client_kill_filter(_id=read_reply(conn))
                _wait_readable(conn)
            elif step == "feed":  # bytes already in the reader
                conn._parser._reader.feed(b"+OK\r\n")  # type: ignore[attr-defined]
            else:
                conn.disconnect()
                conn.connect()
            was_quiet = quiet(conn)
            dirty = _dirty(conn)
            # Quiet only when redis-py finds nothing; on a clean direct connection, quiet.
            assert was_quiet == (not dirty), step
            if dirty:  # as the lean pool does
                conn.disconnect()
                conn.connect()
    finally:
        conn.disconnect()
        other.close()


@pytest.mark.real
def test_quiet_leaves_other_connections_to_redis_py(
    conn: redis.Connection, redis_server: Any
) -> None:
    assert quiet(conn)
    conn.disconnect()
    assert not quiet(conn)  # no socket
    checked = redis.Connection(host="127.0.0.1", port=redis_server.port, health_check_interval=5)
    checked.connect()
    try:
        assert not quiet(checked)  # health checks: redis-py's own path
    finally:
        checked.disconnect()
    from redis._parsers import _RESP2Parser

    python_parser = redis.Connection(
        host="127.0.0.1", port=redis_server.port, parser_class=_RESP2Parser
    )
    python_parser.connect()
    try:
        assert not quiet(python_parser)
    finally:
        python_parser.disconnect()


@pytest.mark.real
def test_the_lean_pool_asks_redis_py_only_when_quiet_cannot_tell(
    redis_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memtier.connection import LeanPool

    asked: list[int] = []
    can_read = redis.Connection.can_read

    def counted(self: redis.Connection, timeout: float = 0) -> bool:
        asked.append(1)
        return can_read(self, timeout)

    monkeypatch.setattr(redis.Connection, "can_read", counted)
    client = redis.Redis(host="127.0.0.1", port=redis_server.port)
    other = redis.Redis(host="127.0.0.1", port=redis_server.port)
    try:
        lean = LeanPool(client.connection_pool, keep_idle=1)
        assert lean.execute(("ECHO", "first"), []) == b"first"  # through the pool
        from_pool = len(asked)  # (redis-py's pool checks what it hands out)
        for i in range(5):
            assert lean.execute(("ECHO", f"v{i}"), []) == f"v{i}".encode()
        assert len(asked) == from_pool  # a kept, quiet connection: one poll, no can_read
        kept_id = lean.execute(("CLIENT", "ID"), [])
        other.client_kill_filter(_id=kept_id)
        time.sleep(0.2)
        assert lean.execute(("ECHO", "after"), []) == b"after"  # reconnected
        assert len(asked) > from_pool  # the killed socket polled readable: redis-py decided
    finally:
        client.close()
        other.close()
