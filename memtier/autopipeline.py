"""Auto-pipelining for asyncio: script calls issued in one event-loop tick share a round trip.

What ioredis's ``enableAutoPipelining`` does, for memtier's script calls on a standalone
``redis.asyncio.Redis``: :meth:`AutoPipeline.submit` queues one pre-packed ``EVALSHA`` in
the batch of the current loop tick and returns a future; the batch's send task (started
by the first call of the tick, run after every coroutine that was ready in that tick)
takes one connection from the client's own pool, writes every call of the batch in one
``send_packed_command`` and reads the replies in order (hiredis when installed), handing
each caller its own reply or error.

**One caller at a time** (the common case of an agent awaiting each call) pays for none
of that: when the pipeline is idle -- no batch open, none being sent, no other direct
call in flight -- :meth:`AutoPipeline.call` writes the call and reads its reply in the
caller's own coroutine (no send task, no future, one event-loop iteration less), on a
connection kept idle between such calls (:class:`KeptConnections`: redis-py's asyncio
``get_connection`` / ``release`` pair is a lock, a readiness check, observability records
and an event dispatch per call).  A kept connection is checked as the pool checks one
(connected, nothing unread, not at EOF) before each use; memtier's own pool
(:class:`~memtier.connection.KeptAsyncConnectionsPool`) takes kept connections back
before any caller would wait for one, and a caller's plain pool lends at most a quarter
of its bound (at most 16).  Calls that arrive while a direct call is in flight form a
batch as below.  A direct caller cancelled (or failed) after its write drops the
connection's socket: its reply may be unread.

What each caller keeps (the executor wraps every call in its own retry, as without
pipelining; nothing here retries):

* an error reply (NOSCRIPT, BUSY, a ``memtier:`` rejection, OOM) fails only its own
  call: the connection is in step after a whole error reply;
* a connection error or a timeout while writing or reading fails the call it hit and
  every later call of the batch with that error (an unknown outcome: each is retried by
  its own policy, replay-safe as every memtier script call is); replies read before it
  were delivered.  The connection is disconnected before it goes back to the pool, so no
  later batch can read a stale reply;
* a caller cancelled before the batch is written is never sent; one cancelled after it
  is written does not stop the read: the send task reads every reply of the batch
  (the cancelled caller's is dropped), so the others get theirs and the connection goes
  back to the pool in step;
* a batch holds at most :attr:`PipelineBounds.max_calls` calls and
  :attr:`PipelineBounds.max_bytes` packed bytes (hard ceilings in :mod:`memtier.limits`;
  configuration may only lower them); a bigger tick becomes several batches, each on its
  own connection.

A send task that is itself cancelled (the loop shutting down) fails the calls it had not
answered with an unknown-outcome ``ConnectionError`` (written) or a
:class:`~memtier.errors.TransientBackendError` (not written), and disconnects.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from memtier import limits
from memtier.connection import idle_to_keep
from memtier.directread import checked_once, settled
from memtier.errors import TransientBackendError
from memtier.readdeadline import read_within
from memtier.resppack import HIREDIS_PACK, packs_alike

try:  # the parser redis-py's asyncio connections use when hiredis is installed
    from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH_DATA
    from redis._parsers.hiredis import _AsyncHiredisParser
except ImportError:  # pragma: no cover - another redis-py layout: its read_response is used
    _AsyncHiredisParser = None  # type: ignore[assignment, misc]
    _NOT_ENOUGH_DATA = None

__all__ = ["AutoPipeline", "KeptConnections", "Packer", "PipelineBounds", "Slots", "call_on"]


# What _reply_reader uses of redis-py's asyncio hiredis parser (private: checked once per
# connection and connect).
_PARSER_PARTS = ("_reader", "_stream", "_read_size", "_connected", "_hiredis_PushNotificationType")

# Argument types hiredis packs exactly as redis-py's encoder does (str as UTF-8, int by
# its decimal repr); anything else (float, bool, memoryview...) goes through redis-py.
_PLAIN_ARGS = frozenset({str, bytes, int})


class Packer:
    """Packs a command as connections made with ``kwargs`` (their encoding) would send it:
    hiredis in C where it encodes alike (UTF-8, strict; plain argument types), else the
    packer of a connection made from ``kwargs`` by ``connection_class`` (never connected:
    only its encoder is used).  The auto-pipeline and the asyncio cluster path pack each
    call once with it, before the attempts that re-send the same bytes."""

    __slots__ = ("_connection_class", "_fast", "_kwargs", "_slow", "packs_alike")

    def __init__(self, connection_class: Any, kwargs: dict[str, Any]) -> None:
        self._connection_class = connection_class
        self._kwargs = kwargs
        # (hiredis packs as the encoder does: a bound call's wire plan may be used too)
        self.packs_alike = packs_alike(
            kwargs.get("encoding", "utf-8"), kwargs.get("encoding_errors", "strict")
        )
        # (hiredis packs a command in C; redis-py's asyncio connection packs in Python)
        self._fast: Any = HIREDIS_PACK if self.packs_alike else None
        self._slow: Any = None

    def __call__(self, args: Sequence[Any]) -> list[bytes]:
        if self._fast is not None and _PLAIN_ARGS.issuperset(map(type, args)):
            return [self._fast(args if type(args) is tuple else tuple(args))]
        if self._slow is None:
            self._slow = self._connection_class(**self._kwargs)
        return list(self._slow.pack_command(*args))


@dataclass(frozen=True, slots=True)
class PipelineBounds:
    """How big one auto-pipelined batch may be: calls and packed bytes."""

    max_calls: int = int(limits.REDIS_PIPELINE_MAX_CALLS.default)
    max_bytes: int = int(limits.REDIS_PIPELINE_MAX_BYTES.default)

    def __post_init__(self) -> None:
        # Hard ceilings in code (the config checks them too; this covers direct use).
        calls, size = limits.REDIS_PIPELINE_MAX_CALLS, limits.REDIS_PIPELINE_MAX_BYTES
        if not calls.minimum <= self.max_calls <= calls.ceiling:
            raise ValueError(f"pipeline max_calls {self.max_calls} is outside its bounds")
        if not size.minimum <= self.max_bytes <= size.ceiling:
            raise ValueError(f"pipeline max_bytes {self.max_bytes} is outside its bounds")

    @classmethod
    def from_settings(cls, settings: Any) -> PipelineBounds | None:
        """The bounds of a :class:`~memtier.config.RedisConfig`; None when its
        ``auto_pipelining`` is off."""
        if not settings.auto_pipelining:
            return None
        return cls(int(settings.pipeline_max_calls), int(settings.pipeline_max_bytes))


class Slots(Protocol):
    """What bounds the connections the pipeline holds at once (the client's guard,
    :class:`~memtier.connection.AsyncClientGuard`): a batch holds one slot while it holds
    its connection; ``acquire`` waits bounded and raises (``backend_busy``)."""

    async def acquire(self) -> None: ...

    def release(self) -> None: ...


class _Call:
    __slots__ = ("future", "packed", "replies")

    def __init__(self, packed: Sequence[bytes], future: asyncio.Future[Any], replies: int) -> None:
        self.packed = packed
        self.future = future
        self.replies = replies  # 1, or MULTI ... EXEC: +OK, +QUEUED per command, the EXEC


class _Batch:
    __slots__ = ("calls", "loop", "size")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.calls: list[_Call] = []
        self.size = 0


def _settle(call: _Call, reply: Any = None, error: BaseException | None = None) -> None:
    if call.future.done():  # its caller was cancelled: the reply is read and dropped
        return
    if error is None:
        call.future.set_result(reply)
    else:
        call.future.set_exception(error)


async def _write(conn: Any, chunks: list[bytes]) -> None:
    """``conn.send_packed_command(chunks)`` without its ``asyncio.wait_for`` around every
    write (a task and a timer per batch, ~20 us): the chunks go to the transport at once,
    and only a write the transport could not take whole waits -- for the buffer to drain,
    under the socket timeout.  Failures as redis-py raises them (the connection dropped,
    then ``ConnectionError`` / ``TimeoutError``).  A connection not yet connected, or with
    a health-check interval, takes redis-py's own path."""
    writer = getattr(conn, "_writer", None)
    checks_health = bool(getattr(conn, "health_check_interval", None))
    if writer is None or not conn.is_connected or checks_health:
        await conn.send_packed_command(chunks)
        return
    try:
        writer.writelines(chunks)
        if writer.transport.get_write_buffer_size() == 0:
            return  # all of it is in the kernel already: drain() would return at once
        timeout = conn.socket_timeout
        async with asyncio.timeout(timeout if timeout else None):
            await writer.drain()
    except TimeoutError:  # asyncio's timeout (TimeoutError in 3.11): redis-py's type
        await conn.disconnect(nowait=True)
        raise RedisTimeoutError("Timeout writing to socket") from None
    except OSError as exc:
        await conn.disconnect(nowait=True)
        raise RedisConnectionError(f"Error while writing to socket. {exc}.") from exc
    except BaseException:
        await conn.disconnect(nowait=True)
        raise


def _reply_reader(conn: Any) -> Callable[[], Awaitable[Any]]:
    """What reads one reply of a batch: ``conn.read_response`` as redis-py would, or, on
    a connection redis-py reads with hiredis and no health checks (what the pipeline gets
    from a plain client), the same replies straight from its hiredis reader.

    redis-py's ``read_response`` puts every reply under its own ``asyncio.timeout`` (a
    timer, ~4 us) and three layers of calls; a batch's replies mostly arrive in one
    socket read, so here only a socket read waits, under the connection's socket timeout
    read at that moment (so a timeout relaxed by a maintenance notification applies),
    enforced by its loop's one read timer (:mod:`memtier.readdeadline`), not a timer of
    its own.
    The timeout is per read that makes no progress, where redis-py's is per reply.
    Otherwise as ``_AsyncHiredisParser.read_response`` and ``Connection.read_response``:
    a RESP3 push notification goes to the parser's push handler and the next reply is
    read; an error reply is raised as its ``ResponseError``; a lost connection, a timeout
    or a protocol error is raised as redis-py raises it (the caller disconnects).
    """
    if not checked_once(conn, _AsyncHiredisParser, _PARSER_PARTS, "_stream"):
        return cast("Callable[[], Awaitable[Any]]", conn.read_response)
    parser: Any = conn._parser
    reader: Any = parser._reader
    stream: Any = parser._stream
    size: int = parser._read_size
    push_type: Any = parser._hiredis_PushNotificationType
    # Any: redis-py types this method from 8.2 on only.
    handle_push: Any = parser.handle_push_response

    async def read() -> Any:
        while True:
            reply = reader.gets()
            while reply is _NOT_ENOUGH_DATA:
                if not parser._connected:
                    raise RedisConnectionError("Connection closed by server.")
                timeout = conn.socket_timeout
                try:
                    if timeout is None:
                        data = await stream.read(size)
                    else:
                        data = await read_within(stream.read(size), timeout)
                except TimeoutError:  # asyncio's (3.11): redis-py's type
                    raise RedisTimeoutError(f"Timeout reading from {conn._host_error()}") from None
                except OSError as exc:
                    raise RedisConnectionError(
                        f"Error while reading from {conn._host_error()} : {exc.args}"
                    ) from exc
                if not data:
                    raise RedisConnectionError("Connection closed by server.")
                reader.feed(data)
                reply = reader.gets()
            if push_type is not None and isinstance(reply, push_type):
                await handle_push(reply)
                continue  # not our reply: the next one is
            return settled(reply)

    return read


def _lost(written: bool, exc: BaseException) -> Exception:
    """What a call learns when its batch's send task stopped on ``exc``."""
    if isinstance(exc, Exception):
        return exc
    if written:  # the script may have run: an unknown outcome (retried, replay-safe)
        return RedisConnectionError(f"auto-pipelined batch interrupted ({type(exc).__name__})")
    return TransientBackendError(
        f"auto-pipelined batch stopped before it was sent ({type(exc).__name__})"
    )


async def call_on(conn: Any, packed: Sequence[bytes], replies: int = 1) -> Any:
    """Write ``packed`` (one command, or a whole ``MULTI`` ... ``EXEC`` of ``replies``
    replies) on ``conn`` and read its (the ``EXEC``'s) reply.  An error reply is raised
    whole (the connection stays in step; a transaction raises the first command refused
    while queueing); on any other failure, a cancellation included, the connection is
    dropped: a reply may be unread.  The caller owns ``conn`` and gives it back."""
    try:
        await _write(conn, list(packed))
        return await _read_call(_reply_reader(conn), replies)
    except ResponseError:
        raise
    except BaseException:
        await conn.disconnect(nowait=True)
        raise


async def _read_call(read: Callable[[], Awaitable[Any]], replies: int) -> Any:
    """One call's reply (the ``EXEC``'s, after a transaction's queueing replies): a refused
    command (its whole error read) aborts the ``EXEC``, and that first refusal is the
    call's error; an error reply is raised whole (the connection is in step)."""
    refused: ResponseError | None = None
    for _ in range(replies - 1):
        try:
            await read()
        except ResponseError as exc:
            refused = refused or exc
    try:
        reply = await read()
    except ResponseError as exc:
        raise refused or exc from None
    if refused is not None:  # pragma: no cover - EXEC aborts after a refusal
        raise refused
    return reply


def _idle_and_clean(conn: Any) -> bool:
    """``conn`` may be used again at once: connected, nothing unread or at EOF (what
    redis-py's pool checks before it hands a connection out), read by hiredis, and no
    reconnect asked for.  Anything else goes back through the pool."""
    parser = getattr(conn, "_parser", None)
    if _AsyncHiredisParser is None or type(parser) is not _AsyncHiredisParser:
        return False
    try:
        stream: Any = parser._stream
        reader: Any = parser._reader
        # redis-py < 7.0 has no maintenance notifications, so nothing asks a connection
        # to reconnect (the sync lean pool reads it the same way).
        should_reconnect = getattr(conn, "should_reconnect", None)
        return bool(
            conn.is_connected
            and parser._connected
            and stream is not None
            and reader is not None
            and not reader.has_data()
            and not stream.at_eof()
            and not stream._buffer
            and not (should_reconnect is not None and should_reconnect())
        )
    except AttributeError:  # another redis-py layout: the pool decides
        return False


class KeptConnections:
    """The connections one pool's direct calls keep idle between calls (one stack per
    pool, shared by every pipeline on it): redis-py's asyncio ``get_connection`` /
    ``release`` pair (a lock, a readiness check, observability records, an event
    dispatch) is a tenth of the client's work per call.  A kept connection stays
    checked out of the pool; each is checked as the pool would check it before reuse,
    and one kept on another event loop goes back to the pool."""

    __slots__ = ("idle", "keep", "pool")

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.keep = idle_to_keep(pool)
        self.idle: list[tuple[Any, asyncio.AbstractEventLoop]] = []

    @classmethod
    def of(cls, pool: Any) -> KeptConnections:
        kept: KeptConnections | None = getattr(pool, "_memtier_kept", None)
        if kept is None:  # one per pool: the connections it keeps are the pool's
            kept = cls(pool)
            setattr(pool, "_memtier_kept", kept)  # noqa: B010 - a redis-py object
        return kept

    async def take(self, loop: asyncio.AbstractEventLoop) -> Any | None:
        """A kept connection ready for a call on ``loop``, or None (none kept)."""
        while self.idle:
            conn, kept_on = self.idle.pop()
            if kept_on is loop:
                if _idle_and_clean(conn):
                    return conn
                # Closed by the server, or out of step: dropped here, so the pool
                # reconnects it when it hands it out (redis-py's pool skips its own
                # check with maintenance notifications on).
                await conn.disconnect(nowait=True)
            await self.pool.release(conn)
        return None

    def put(self, conn: Any, loop: asyncio.AbstractEventLoop) -> bool:
        """Keep ``conn`` (in step, its call answered) if there is room; False: the caller
        gives it back to the pool.  It is checked when taken (:meth:`take`), not here: one
        found unclean then goes back to the pool from there."""
        if len(self.idle) < self.keep:
            self.idle.append((conn, loop))
            return True
        return False

    async def give_back(self) -> None:
        """Every kept connection back to the pool (bounded by the stack's size)."""
        while self.idle:
            conn, _ = self.idle.pop()
            await self.pool.release(conn)


class AutoPipeline:
    """Batches the script calls of one event-loop tick onto one connection of ``pool``."""

    __slots__ = (
        "_direct",
        "_kept",
        "_open",
        "_sending",
        "batches",
        "bounds",
        "calls",
        "direct_calls",
        "pack",
        "pool",
        "slots",
    )

    def __init__(self, pool: Any, bounds: PipelineBounds, slots: Slots | None = None) -> None:
        self.pool = pool
        self.bounds = bounds
        self.slots = slots
        # ``args`` as the bytes the pool's connections would send (their encoder).
        self.pack = Packer(pool.connection_class, getattr(pool, "connection_kwargs", {}))
        self._open: _Batch | None = None
        self._direct = False  # a call written by its own caller is in flight
        self._kept = KeptConnections.of(pool)
        self._sending: set[asyncio.Task[None]] = set()  # strong references to send tasks
        self.batches = 0  # batches written (tests and the bench read them)
        self.calls = 0  # calls written
        self.direct_calls = 0  # of which written by their own caller (the pipeline idle)

    async def call(self, packed: Sequence[bytes], replies: int = 1) -> Any:
        """``packed``'s reply: written at once by this coroutine when the pipeline is idle
        (no batch open, none being sent, no other call written this way in flight), else
        queued in this tick's batch (:meth:`submit`)."""
        if self._open is None and not self._sending and not self._direct:
            self._direct = True
            try:
                return await self._direct_call(packed, replies)
            finally:
                self._direct = False
        return await self.submit(packed, replies)

    async def _checkout(self, loop: asyncio.AbstractEventLoop | None) -> Any:
        """One slot and one connection (with ``loop``: a kept one first), or neither."""
        slots = self.slots
        if slots is not None:
            await slots.acquire()  # one slot for the one connection
        try:
            conn = None if loop is None else await self._kept.take(loop)
            if conn is None:
                conn = await self.pool.get_connection()
            return conn
        except BaseException:
            if slots is not None:
                slots.release()
            raise

    async def _direct_call(self, packed: Sequence[bytes], replies: int) -> Any:
        """One call on its own connection, written and read by its caller: no send task,
        no future, one loop iteration less than a batch.  A failure (or a cancellation)
        after the write disconnects the connection: its reply may be unread."""
        pool, slots, kept = self.pool, self.slots, self._kept
        loop = asyncio.get_running_loop()
        conn = await self._checkout(loop)
        in_step = False
        try:
            try:
                return await call_on(conn, packed, replies)
            finally:
                # Answered, or a whole error reply read: in step.  call_on dropped the
                # connection on any other failure.
                in_step = conn.is_connected
                if in_step:
                    self.batches += 1
                    self.calls += 1
                    self.direct_calls += 1
        finally:
            try:
                if not (in_step and kept.put(conn, loop)):
                    await pool.release(conn)
            finally:
                if slots is not None:
                    slots.release()

    def submit(self, packed: Sequence[bytes], replies: int = 1) -> asyncio.Future[Any]:
        """Queue ``packed`` (one command, or a whole ``MULTI`` ... ``EXEC`` of ``replies``
        replies) in this tick's batch; the future gets its (the ``EXEC``'s) reply."""
        loop = asyncio.get_running_loop()
        size = sum(len(chunk) for chunk in packed)
        batch, bounds = self._open, self.bounds
        if (
            batch is None
            or batch.loop is not loop
            or len(batch.calls) >= bounds.max_calls
            or batch.size + size > bounds.max_bytes
        ):
            batch = self._open = _Batch(loop)
            task = loop.create_task(self._send(batch))
            self._sending.add(task)
            task.add_done_callback(functools.partial(self._ended, batch))
        future: asyncio.Future[Any] = loop.create_future()
        batch.calls.append(_Call(packed, future, replies))
        batch.size += size
        return future

    def _ended(self, batch: _Batch, task: asyncio.Task[None]) -> None:
        # However the send task ended (even cancelled before it ran), no caller waits forever.
        self._sending.discard(task)
        if self._open is batch:
            self._open = None
        for call in batch.calls:
            _settle(call, error=RedisConnectionError("auto-pipelined batch ended unanswered"))

    async def _send(self, batch: _Batch) -> None:
        if self._open is batch:
            self._open = None  # calls from now on go to the next batch
        await self._write_and_read(batch.calls)

    async def _write_and_read(self, queued: list[_Call]) -> None:
        calls = [call for call in queued if not call.future.done()]
        if not calls:
            return
        pool, slots = self.pool, self.slots
        try:
            conn = await self._checkout(None)
        except BaseException as exc:
            for call in calls:
                _settle(call, error=_lost(False, exc))
            if not isinstance(exc, Exception):
                raise
            return
        answered = 0
        try:
            # A caller cancelled while the pool was busy is still not sent.
            calls = [call for call in calls if not call.future.done()]
            if not calls:
                return
            # From here on any failure may come after Redis read (and ran) some calls.
            await _write(conn, [chunk for call in calls for chunk in call.packed])
            self.batches += 1
            self.calls += len(calls)
            read = _reply_reader(conn)
            for call in calls:
                try:
                    reply = await _read_call(read, call.replies)
                except ResponseError as exc:  # a whole error reply: only this call fails
                    _settle(call, error=exc)
                else:
                    _settle(call, reply)
                answered += 1
        except BaseException as exc:
            # A lost connection or a timeout: replies still unread would answer the next
            # batch on this connection.  It must not go back to the pool usable.
            await conn.disconnect(nowait=True)
            for call in calls[answered:]:
                _settle(call, error=_lost(True, exc))
            if not isinstance(exc, Exception):
                raise
        finally:
            try:
                await pool.release(conn)
            finally:
                if slots is not None:
                    slots.release()
