"""Replies read straight from a sync connection's hiredis reader: the lean call path's read.

redis-py's ``Connection.read_response`` formats the connection's address into a string
before every read (for an error message it seldom needs) and goes through two more
layers (``_HiredisParser.read_response``, ``read_from_socket``) per reply: about 150
bytecodes a reply, a quarter of what a context read runs (``python -m bench.icount``,
docs/performance.md).  :func:`read_reply` reads the same bytes with the same hiredis
reader (so the same reply objects) on a connection redis-py reads with hiredis and no
health checks -- what the lean pool gets from a plain client -- and gives every other
connection redis-py's own ``read_response``.  Its checks run once per connection and
connect (kept on the connection with the parser, reader and socket they checked).

Otherwise as ``Connection.read_response``: a RESP3 push notification goes to the parser's
push handler and the next reply is read; an error reply is raised as its
``ResponseError``; a socket timeout is redis-py's ``TimeoutError``, a lost connection or a
timeout the kernel reports (``ETIMEDOUT``: the peer is gone) its ``ConnectionError``.  The
caller disconnects on anything but an error reply, as the lean pool always has.
"""

from __future__ import annotations

import errno
import functools
import select
from collections.abc import Callable
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

try:  # the parser redis-py's sync connections use when hiredis is installed
    from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH_DATA
    from redis._parsers.hiredis import _HiredisParser
except ImportError:  # pragma: no cover - hiredis is a dependency (redis[hiredis])
    _HiredisParser = None  # type: ignore[assignment,misc]
    _NOT_ENOUGH_DATA = object()

__all__ = [
    "checked_once",
    "quiet",
    "read_direct",
    "read_reply",
    "reads_direct",
    "reply_reader",
    "settled",
]

_CLOSED = "Connection closed by server."
# What the sync direct read uses of redis-py's sync hiredis parser (private: checked once
# per connection and connect).
_PARSER_PARTS = ("_reader", "_sock", "_buffer", "_hiredis_PushNotificationType")


def checked_once(conn: Any, parser_class: Any, parts: tuple[str, ...], io: str) -> bool:
    """``conn``'s replies may be read straight from its parser's hiredis reader: the parser
    is ``parser_class`` (redis-py's hiredis parser, sync or asyncio), with ``parts``, a
    reader and its ``io`` (the socket or stream), and no health checks.  Checked once per
    connection and connect: what was checked (parser, reader, ``io``) is kept on the
    connection, and a reconnect (a new reader and ``io``) checks again.  Shared by this
    module and :mod:`memtier.autopipeline`."""
    parser: Any = getattr(conn, "_parser", None)
    checked = getattr(conn, "_memtier_direct_reads", None)
    if (
        checked is not None
        and checked[0] is parser
        and checked[1] is parser._reader
        and checked[2] is getattr(parser, io)
        and not getattr(conn, "health_check_interval", None)
    ):
        return True
    if (
        parser_class is None
        or type(parser) is not parser_class
        or getattr(conn, "health_check_interval", None)
        or not all(hasattr(parser, a) for a in parts)
        # redis-py >= 8.2 sets these to None until on_connect (earlier left them unset).
        or parser._reader is None
        or getattr(parser, io) is None
        # redis-py < 7 keeps a reply its can_read() parsed ahead; its own read gives it.
        # (The lean pool reconnects a connection whose can_read() found one.)
        or getattr(parser, "_next_response", _NOT_ENOUGH_DATA) is not _NOT_ENOUGH_DATA
    ):
        return False
    conn._memtier_direct_reads = (parser, parser._reader, getattr(parser, io))
    return True


def reads_direct(conn: Any) -> bool:
    """``conn``'s replies may be read with :func:`read_direct`."""
    return checked_once(conn, _HiredisParser, _PARSER_PARTS, "_sock")


def quiet(conn: Any) -> bool:
    """``conn`` is open with nothing unread, by one ``poll(0)`` of its socket: its reader
    holds no bytes and the socket reports nothing (no reply left behind, no push, not
    closed by the server: a closed socket polls readable).  What redis-py's
    ``can_read`` answers for a kept connection, without its per-call poller, address
    string and three layers (the lean pool asks it before each use of a kept
    connection).  Only on a plain socket of a connection whose replies are read direct
    (:func:`reads_direct`: hiredis, no health checks), checked when the poller is made:
    once per connect, kept on the connection with the socket and reader it watches.
    False means "ask redis-py's ``can_read``", which also decides every other case."""
    kept = getattr(conn, "_memtier_quiet", None)
    sock = getattr(conn, "_sock", None)
    if kept is None or kept[0] is not sock:
        # (an SSL socket may hold decrypted bytes above the socket: pending())
        if sock is None or hasattr(sock, "pending") or not reads_direct(conn):
            return False
        has_data = getattr(conn._parser._reader, "has_data", None)
        if has_data is None or not hasattr(select, "poll"):
            return False
        poller = select.poll()
        poller.register(sock, select.POLLIN)  # POLLHUP / POLLERR come whatever the mask
        kept = conn._memtier_quiet = (sock, conn._parser._reader, has_data, poller.poll)
    parser = conn._parser
    return (
        kept[1] is parser._reader
        # redis-py < 7: a reply its can_read() parsed ahead (then it is not quiet)
        and getattr(parser, "_next_response", _NOT_ENOUGH_DATA) is _NOT_ENOUGH_DATA
        and not kept[2]()
        and not kept[3](0)
    )


def settled(reply: Any) -> Any:
    """A parsed reply as redis-py's ``read_response`` gives it: an error reply raised as
    its exception (a lost connection too, also as an array's first element), anything
    else returned."""
    if isinstance(reply, (ResponseError, RedisConnectionError)):
        raise reply
    if isinstance(reply, list) and reply and isinstance(reply[0], RedisConnectionError):
        raise reply[0]
    return reply


def read_direct(conn: Any) -> Any:
    """``conn``'s next reply, read from its hiredis reader (:func:`reads_direct` said so)."""
    parser = conn._parser
    reader = parser._reader
    while True:
        reply = reader.gets()
        while reply is _NOT_ENOUGH_DATA:
            try:
                size = parser._sock.recv_into(parser._buffer)
            except TimeoutError as exc:  # socket.timeout (3.10+), or the kernel's ETIMEDOUT
                if exc.errno == errno.ETIMEDOUT:
                    raise RedisConnectionError(
                        f"Error while reading from {conn._host_error()} : {exc.args}"
                    ) from exc
                raise RedisTimeoutError(f"Timeout reading from {conn._host_error()}") from None
            except OSError as exc:
                raise RedisConnectionError(
                    f"Error while reading from {conn._host_error()} : {exc.args}"
                ) from exc
            except AttributeError:  # disconnected meanwhile (by another thread): no socket
                raise RedisConnectionError(_CLOSED) from None
            if not size:
                raise RedisConnectionError(_CLOSED)
            reader.feed(parser._buffer, 0, size)
            reply = reader.gets()
        kind = type(reply)
        if kind is bytes or kind is int:  # the common replies first
            return reply
        if kind is list:
            if reply and isinstance(reply[0], RedisConnectionError):
                raise reply[0]
            return reply
        push_type = parser._hiredis_PushNotificationType
        if push_type is not None and isinstance(reply, push_type):
            parser.handle_push_response(reply)
            continue  # not our reply: the next one is
        return settled(reply)


def reply_reader(conn: Any) -> Callable[[], Any]:
    """What reads ``conn``'s replies, checked once for several: :func:`read_direct` on it
    where it may, else redis-py's own read."""
    if reads_direct(conn):
        return functools.partial(read_direct, conn)
    return conn.read_response  # type: ignore[no-any-return]


def read_reply(conn: Any) -> Any:
    """``conn``'s next reply: :func:`read_direct` where it may, else redis-py's own read."""
    if reads_direct(conn):
        return read_direct(conn)
    return conn.read_response()
