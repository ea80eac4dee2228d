"""Builds redis-py clients from a :class:`~memtier.config.MemtierConfig`.

``redis://`` / ``rediss://`` / ``unix://`` give a standalone client,
``redis+cluster://`` / ``rediss+cluster://`` a :class:`redis.cluster.RedisCluster`,
and no URL the embedded in-process Redis (fakeredis with Lua), which is for
the demo and tests: it lives in this process only.

redis-py's own command retries are switched off (``Retry(NoBackoff(), 0)``):
memtier retries once, in :mod:`memtier.retry`.

Every client memtier builds gets memtier's own deadlines and pool bound from the
``[redis]`` section (:class:`~memtier.config.RedisConfig`), whatever redis-py's
defaults are (redis-py < 8 had no socket timeout at all):

* ``socket_timeout_seconds`` / ``connect_timeout_seconds`` -- per reply / per connect;
* ``max_connections`` -- connections per node (standalone: a
  ``BlockingConnectionPool`` that waits ``pool_timeout_seconds`` for a free one).

:class:`SyncClientGuard` / :class:`AsyncClientGuard` sit in front of every command a
store or service sends: at most ``max_connections`` commands in flight (callers wait
up to ``pool_timeout_seconds`` for a slot, then get
:class:`~memtier.errors.BackendBusyError`; never redis-py's ``MaxConnectionsError``),
and the asyncio guard initialises a cluster client exactly once, under an
``asyncio.Lock``, before the first command and again after redis-py marked its slot
map stale (a failover, a topology change).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from redis import BlockingConnectionPool
from redis import ConnectionPool as _PlainPool
from redis import Redis as _SyncRedis
from redis.asyncio import BlockingConnectionPool as _AsyncBlockingPool
from redis.asyncio import ConnectionPool as _AsyncPlainPool
from redis.asyncio import Redis as _AsyncRedis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from memtier.config import MemtierConfig, RedisConfig, parse_redis_url
from memtier.directread import quiet, read_reply, reply_reader
from memtier.errors import BackendBusyError, BackendError, ConfigurationError, TransientBackendError
from memtier.resppack import HIREDIS_PACK, packs_alike

__all__ = [
    "EMBEDDED_NOTICE",
    "AsyncClientGuard",
    "KeptAsyncConnectionsPool",
    "KeptConnectionsPool",
    "LeanPool",
    "SyncClientGuard",
    "client_options",
    "connect_async",
    "connect_sync",
    "embedded_server",
    "idle_to_keep",
    "lean_async_pool",
    "lean_pool",
]

T = TypeVar("T")

log = logging.getLogger("memtier")

EMBEDDED_NOTICE = (
    "memtier: no Redis URL configured (MEMTIER_REDIS_URL); using the embedded in-process "
    "Redis (fakeredis). Data lives in this process only."
)

_EMBEDDED: Any = None


def embedded_server() -> Any:
    """The process-wide fakeredis server (created on first use)."""
    global _EMBEDDED
    if _EMBEDDED is None:
        try:
            import fakeredis
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ConfigurationError(
                "no Redis URL configured and the embedded Redis is not installed:"
                " set MEMTIER_REDIS_URL or `pip install 'memtier[embedded]'`"
            ) from exc
        _EMBEDDED = fakeredis.FakeServer()
    return _EMBEDDED


def client_options(settings: RedisConfig) -> dict[str, Any]:
    """The redis-py keyword arguments memtier sets on every client it builds."""
    return {
        "socket_timeout": settings.socket_timeout_seconds,
        "socket_connect_timeout": settings.connect_timeout_seconds,
        "max_connections": settings.max_connections,
    }


def connect_sync(config: MemtierConfig) -> tuple[Any, bool]:
    """Return ``(client, embedded)`` for the configured Redis.

    A cluster client reads the slot map here (redis-py's sync cluster client connects in
    its constructor); a cluster that cannot be reached raises BackendError.
    """
    from redis import Redis
    from redis.cluster import RedisCluster
    from redis.retry import Retry

    if config.redis_url is None:
        import fakeredis

        log.warning(EMBEDDED_NOTICE)
        return fakeredis.FakeRedis(server=embedded_server()), True
    is_cluster, url = parse_redis_url(config.redis_url)
    options = client_options(config.redis)
    if is_cluster:
        try:
            return RedisCluster.from_url(url, retry=Retry(NoBackoff(), 0), **options), False
        except Exception as exc:  # redis-py raises RedisClusterException (not a RedisError)
            raise BackendError(
                f"cannot read the Redis Cluster slot map: {type(exc).__name__}: {exc}",
                error_type=type(exc).__name__,
            ) from exc
    pool = KeptConnectionsPool.from_url(
        url,
        timeout=config.redis.pool_timeout_seconds,
        retry=Retry(NoBackoff(), 0),
        retry_on_error=[],
        **options,
    )
    return Redis.from_pool(pool), False  # the client closes the pool it owns


def connect_async(config: MemtierConfig) -> tuple[Any, bool]:
    """Asyncio twin of :func:`connect_sync` (no I/O: a cluster client is initialised by
    :class:`AsyncClientGuard` before its first command)."""
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster
    from redis.asyncio.retry import Retry

    if config.redis_url is None:
        import fakeredis

        log.warning(EMBEDDED_NOTICE)
        return fakeredis.FakeAsyncRedis(server=embedded_server()), True
    is_cluster, url = parse_redis_url(config.redis_url)
    options = client_options(config.redis)
    if is_cluster:
        return RedisCluster.from_url(url, retry=Retry(NoBackoff(), 0), **options), False
    pool = KeptAsyncConnectionsPool.from_url(
        url,
        timeout=config.redis.pool_timeout_seconds,
        retry=Retry(NoBackoff(), 0),
        retry_on_error=[],
        **options,
    )
    return Redis.from_pool(pool), False  # the client closes the pool it owns


def _busy(limit: int, timeout_s: float) -> BackendBusyError:
    return BackendBusyError(
        f"no Redis connection free within {timeout_s:g} s ({limit} in use):"
        " raise MEMTIER_REDIS__MAX_CONNECTIONS or send fewer concurrent calls",
        max_connections=limit,
    )


class SyncClientGuard:
    """Back-pressure for a sync client shared by many threads.

    At most ``max_connections`` commands in flight; a caller beyond it waits up to
    ``pool_timeout_seconds`` for a slot, then gets BackendBusyError (retryable,
    nothing was sent).  With one connection per command in flight, no node's pool can
    be exhausted (redis-py's sync cluster pools would raise MaxConnectionsError).
    """

    def __init__(self, settings: RedisConfig) -> None:
        self.limit = settings.max_connections
        self.timeout_s = settings.pool_timeout_seconds
        # The slots are tokens in a SimpleQueue (C code: 0.23 us per get + put here)
        # rather than a threading.BoundedSemaphore (pure Python over a Condition: 3.2 us),
        # taken around every command of every call; a caller puts back only what it took.
        self._slots: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(self.limit):
            self._slots.put(None)

    def call(self, fn: Callable[[], T]) -> T:
        try:
            self._slots.get(True, self.timeout_s)
        except queue.Empty:
            raise _busy(self.limit, self.timeout_s) from None
        try:
            return fn()
        finally:
            self._slots.put(None)


class AsyncClientGuard:
    """One asyncio client's life cycle and back-pressure.

    * :meth:`open` initialises the client exactly once (a cluster client reads its slot
      map and opens its node clients) under an ``asyncio.Lock``: concurrent first calls
      wait for that one initialisation instead of racing it (redis-py's cold cluster
      client fails such a race with ``AttributeError``).  After redis-py marked the
      slot map stale (a connection error during a failover) the next call re-opens it,
      under the same lock.
    * :meth:`call` bounds the commands in flight as :class:`SyncClientGuard` does (the
      asyncio cluster client has no blocking pool: it raises MaxConnectionsError); an
      auto-pipelined batch takes one slot for all its calls (:meth:`call_pipelined`).
    """

    def __init__(self, client: Any, settings: RedisConfig) -> None:
        self.client = client
        self.limit = settings.max_connections
        self.timeout_s = settings.pool_timeout_seconds
        self._slots = asyncio.Semaphore(self.limit)
        self._lock = asyncio.Lock()
        self._opened = False
        self._initialize_due: Callable[[], bool] | None = getattr(client, "_initialize_due", None)
        self.opens = 0  # initialisations performed (tests read it)

    def _stale(self) -> bool:
        # redis-py's asyncio RedisCluster sets ``_initialize`` until initialize() ran and
        # again when a refresh of its slot map is asked for; from 8.2 on the flag stays
        # set until a paced refresh is due (``_initialize_due``), and initialize() does
        # nothing before: re-opening on the flag alone would take the lock on every call
        # meanwhile.  A standalone client has neither attribute.
        if not self._opened:
            return True
        due = self._initialize_due
        if due is not None:
            return bool(due())
        return getattr(self.client, "_initialize", False) is True

    async def open(self) -> None:
        """Initialise the client now (idempotent; concurrent callers share one)."""
        if not self._stale():
            return
        async with self._lock:
            if not self._stale():
                return
            initialize = getattr(self.client, "initialize", None)
            if initialize is not None:
                try:
                    await initialize()
                except Exception as exc:
                    # RedisClusterException is no RedisError: type it (retried: nothing sent).
                    raise TransientBackendError(
                        f"cannot initialise the Redis client: {type(exc).__name__}: {exc}",
                        error_type=type(exc).__name__,
                    ) from exc
            self._opened = True
            self.opens += 1

    async def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        if self._stale():
            await self.open()
        await self.acquire()
        try:
            return await fn()
        finally:
            self.release()

    async def call_pipelined(self, fn: Callable[[], Awaitable[T]]) -> T:
        """A call that rides an auto-pipelined batch: the client opened as for
        :meth:`call`, but no slot of its own -- the batch's send task takes one slot for
        the one connection it holds (:class:`~memtier.autopipeline.AutoPipeline`), so
        ``max_connections`` still bounds this client's connections in use while any
        number of callers share a batch (a slot per caller made callers beyond the
        limit wait for a later batch: more round trips, not fewer connections)."""
        if self._stale():
            await self.open()
        return await fn()

    async def acquire(self) -> None:
        """Take one slot: wait at most ``pool_timeout_seconds``, then BackendBusyError."""
        if self._slots.locked():  # wait, bounded; the free path skips the timer
            try:
                async with asyncio.timeout(self.timeout_s):
                    await self._slots.acquire()
            except TimeoutError:
                raise _busy(self.limit, self.timeout_s) from None
        else:
            await self._slots.acquire()

    def release(self) -> None:
        """Give back the slot :meth:`acquire` took."""
        self._slots.release()

    async def aclose(self) -> None:
        """Close the client; a later call opens it again."""
        async with self._lock:
            self._opened = False
            await self.client.aclose()


class KeptConnectionsPool(BlockingConnectionPool):
    """memtier's standalone sync pool: a ``BlockingConnectionPool`` that, before it hands a
    connection to any command, takes back the connections the lean path keeps idle
    (:meth:`LeanPool.give_back`).  So those never make a caller wait: with at most
    ``max_connections`` commands in flight (the store's guard), one is free for it."""

    _memtier_lean: LeanPool | None = None

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        lean = self._memtier_lean
        if lean is not None:
            lean.give_back()
        return super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]

    def exhausted(self) -> bool:
        """No free connection (nor room for a new one): a caller may be waiting for one,
        so a connection that comes back must come back here, not to the lean stack.
        (Several stores may share one client, each with its own guard.)"""
        return bool(self.pool.empty())


class KeptAsyncConnectionsPool(_AsyncBlockingPool):
    """memtier's standalone asyncio pool: a ``BlockingConnectionPool`` that, before a
    caller would wait for a connection, takes back the connections the auto-pipeline's
    direct calls keep idle (:class:`~memtier.autopipeline.KeptConnections`).  So those
    never make a caller wait: with at most ``max_connections`` calls in flight (the
    store's guard), one is free for it."""

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        kept = getattr(self, "_memtier_kept", None)
        if kept is not None and kept.idle and not self.can_get_connection():
            await kept.give_back()
        return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]


# A caller's own plain pool cannot be asked for its connections back: keep few of them.
_IDLE_IN_A_CALLERS_POOL = 16


def idle_to_keep(pool: Any) -> int:
    """How many connections a lean path may keep idle between calls (the sync lean pool,
    the asyncio direct calls).  memtier's own pools take them back on demand: as many as
    they have.  redis-py's plain pools (they raise ``MaxConnectionsError`` when full,
    never wait) a quarter of their bound, at most 16, so the caller's own commands keep
    three quarters.  Any other pool (blocking, sentinel, a subclass): none, every call
    goes through it."""
    bound = getattr(pool, "max_connections", 0)
    if not isinstance(bound, int):
        return 0
    if isinstance(pool, KeptConnectionsPool | KeptAsyncConnectionsPool):
        return bound
    if type(pool) is _PlainPool or type(pool) is _AsyncPlainPool:
        return min(_IDLE_IN_A_CALLERS_POOL, bound // 4)
    return 0


def _checked(conn: Any) -> Any:
    """What ``ConnectionPool.get_connection`` checks of a connection before it hands it
    out: connected (again, after a failure or ``pool.disconnect()``), nothing unread (a
    reply left behind, or the server closed the socket: reconnect).  Nothing unread is
    asked of :func:`~memtier.directread.quiet` first (one poll), then of redis-py."""
    try:
        if getattr(conn, "_sock", None) is None:
            # (connect() returns at once on a connected socket, but only after its retry
            # wrapper: a few us a call, on every call, for nothing.)
            conn.connect()
        if quiet(conn):
            return conn
        if conn.can_read():
            raise RedisConnectionError("Connection has data")
    except (RedisConnectionError, RedisTimeoutError, OSError):
        conn.disconnect()
        conn.connect()
        if conn.can_read():
            raise RedisConnectionError("Connection not ready") from None
    return conn


# How many times this process was forked into being (os.register_at_fork bumps it in a
# child): a LeanPool made before a fork sees another count and drops the parent's kept
# sockets -- without an os.getpid() per call (a syscall: 0.27 us each here, two a call).
# A child made by a C-level fork() that then runs Python is not seen; subprocess and
# posix_spawn exec at once, multiprocessing forks with os.fork.
_FORKED = [0]


def _count_fork() -> None:
    _FORKED[0] += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_count_fork)


# --- the lean call: one packed command on a pooled connection, no command machinery ------
# What redis-py's ``Redis.execute_command`` is when memtier is imported: a client whose
# class (or instance) replaced it -- a tracing wrapper, a test double -- keeps it.
_GENERIC_EXECUTE = _SyncRedis.execute_command
_GENERIC_EXECUTE_ASYNC = _AsyncRedis.execute_command


class DuringWork(Protocol):
    """Work a lean call runs between its write and its read (``LeanPool.execute``'s
    ``during``: the caller's work while Redis runs the command).  Every send of the call
    calls it (a NOSCRIPT re-send, a retry), so it runs its work once; ``seconds`` is the
    time that took, which the call's latency metric leaves out.  It must not raise an
    ``Exception`` (it keeps its own)."""

    seconds: float

    def __call__(self) -> None: ...


class LeanPool:
    """Send one packed command on a connection of a standalone client's pool.

    What redis-py's ``Redis._execute_command`` does for a command without a response
    callback, minus its generic machinery (argument handling, retry object, per-call
    observability): take a connection, send, read the reply (straight from its hiredis
    reader where redis-py reads with hiredis: :mod:`memtier.directread`), disconnect it
    on any failure that is not a whole error reply (a timeout or a lost
    connection leaves an unread reply or a dead socket: the connection must not go back
    to the pool usable), and always give it back.

    With ``keep_idle`` > 0 (only the one LeanPool :func:`lean_pool` keeps per pool; how
    many: :func:`idle_to_keep`) a connection goes back to an idle stack of this
    LeanPool, not through the pool: redis-py 8's ``get_connection`` / ``release`` pair
    costs 15-40 us a call (a lock, observability counters, an event dispatch), a tenth
    of the client's own work per append.  The stack never holds more than there were
    lean calls at once (the store's guard bounds those by ``max_connections``) nor more
    than ``keep_idle``; memtier's own pool takes them back before it hands out one to any
    other command, and while it has none free a connection goes back to it, not here
    (:class:`KeptConnectionsPool`), so no caller waits on a connection that sits idle
    here.  A kept connection is checked as the pool checks one (connected,
    nothing unread) before each use; after a fork the child drops the parent's without
    touching them.
    """

    __slots__ = ("_exhausted", "_forked", "_idle", "_keep", "_packer", "packs_alike", "pool")

    def __init__(self, pool: Any, *, keep_idle: int = 0) -> None:
        self.pool = pool
        self._keep = keep_idle
        self._exhausted: Callable[[], bool] | None = getattr(pool, "exhausted", None)
        self._idle: deque[Any] | None = deque() if keep_idle > 0 else None
        self._forked = _FORKED[0]
        # hiredis packs exactly as redis-py does for str/bytes/int/float arguments in UTF-8
        # (strict) after a one-word command name (redis-py would split "CONFIG GET"; no
        # lean call sends one), at half the cost; another encoding keeps redis-py's.
        kwargs = getattr(pool, "connection_kwargs", {})
        self.packs_alike = packs_alike(
            kwargs.get("encoding", "utf-8"), kwargs.get("encoding_errors", "strict")
        )
        self._packer = HIREDIS_PACK if self.packs_alike else None

    def _get(self) -> Any:
        idle = self._idle
        if idle:
            if self._forked != _FORKED[0]:  # a forked child: the parent's sockets are not ours
                idle.clear()
                self._forked = _FORKED[0]
            else:
                try:
                    conn = idle.pop()
                except IndexError:  # another thread took the last one
                    pass
                else:
                    try:
                        return _checked(conn)
                    except BaseException:
                        self._release(conn)  # kept, disconnected: the next use reconnects
                        raise
        return self.pool.get_connection()

    def _release(self, conn: Any) -> None:
        try:
            should_reconnect = getattr(conn, "should_reconnect", None)
            if should_reconnect is not None and should_reconnect():
                conn.disconnect()  # redis-py's maintenance notifications asked for it
                conn.connect()
        finally:
            idle, exhausted = self._idle, self._exhausted
            if (
                idle is not None
                and len(idle) < self._keep
                and self._forked == _FORKED[0]
                and not (exhausted is not None and exhausted())
            ):
                idle.append(conn)
            else:
                self.pool.release(conn)

    def give_back(self) -> None:
        """Return every idle connection to the pool (bounded by the stack's size)."""
        idle = self._idle
        while idle:
            try:
                conn = idle.pop()
            except IndexError:
                return
            self.pool.release(conn)

    def _pack(self, conn: Any, args: tuple[Any, ...]) -> list[Any]:
        packer = self._packer
        if packer is not None:
            return [packer(args)]
        return list(conn.pack_command(*args))

    def _pack_all(self, conn: Any, commands: tuple[tuple[Any, ...], ...]) -> list[Any]:
        packer = self._packer
        if packer is not None:
            return [b"".join([packer(c) for c in commands])]
        return list(conn.pack_commands(commands))

    def execute(
        self, args: tuple[Any, ...], packed: list[Any], during: DuringWork | None = None
    ) -> Any:
        """Send ``args`` (packed into ``packed`` on first use, reused after) and read the
        reply; ``during`` (if given) runs after the send, before the read."""
        conn = self._get()
        try:
            if not packed:
                packed.extend(self._pack(conn, args))
            try:
                conn.send_packed_command(packed)
                if during is not None:
                    during()
                return read_reply(conn)
            except ResponseError:
                raise  # a whole error reply was read: the connection is in step
            except BaseException:
                conn.disconnect()
                raise
        finally:
            self._release(conn)

    def transaction(
        self, commands: tuple[tuple[Any, ...], ...], count: int, packed: list[Any]
    ) -> Any:
        """Send ``MULTI`` ... ``EXEC`` (``commands``, ``count`` of them, packed into
        ``packed`` on first use) in one write and return ``EXEC``'s reply (a list; errors
        of single commands are exception instances in it).

        Every reply is read before anything is raised, so the connection stays in step:
        a command refused while queueing (its error read whole) aborts the ``EXEC``
        (``EXECABORT``), and that first refusal is raised.
        """
        conn = self._get()
        try:
            if not packed:  # one assignment: a racing sender writes the same bytes
                packed[:] = self._pack_all(conn, commands)
            try:
                conn.send_packed_command(packed)
                read = reply_reader(conn)
                refused: ResponseError | None = None
                for _ in range(count - 1):  # +OK of MULTI, +QUEUED of each command
                    try:
                        read()
                    except ResponseError as exc:
                        refused = refused or exc
                try:
                    replies = read()
                except ResponseError:
                    if refused is not None:
                        raise refused from None
                    raise
                if refused is not None:  # pragma: no cover - EXEC aborts after a refusal
                    raise refused
                return replies
            except ResponseError:
                raise  # whole error replies were read: the connection is in step
            except BaseException:
                conn.disconnect()
                raise
        finally:
            self._release(conn)

    def pipeline(
        self, commands: tuple[tuple[Any, ...], ...], during: DuringWork | None = None
    ) -> list[Any]:
        """Send ``commands`` in one write, not as a transaction, and return their replies
        in order; an error reply is its exception instance in the list (every reply is
        read, so the connection stays in step).  ``during`` (if given) runs after the
        write, before the first read."""
        conn = self.send_pipeline(commands)
        if during is not None:
            try:
                during()
            except BaseException:
                self.drop(conn)
                raise
        return self.read_pipeline(conn, len(commands))

    def send_pipeline(self, commands: tuple[tuple[Any, ...], ...]) -> Any:
        """The first half of :meth:`pipeline`: take a connection and write ``commands`` on
        it in one write.  The connection is the caller's until it hands it to
        :meth:`read_pipeline` or :meth:`drop` (a Redis Cluster batch writes to every
        node before it reads any: :meth:`memtier.leancluster.ClusterLean.pipeline`)."""
        conn = self._get()
        try:
            packed = self._pack_all(conn, commands)
        except BaseException:
            self._release(conn)  # nothing written: the connection is in step
            raise
        try:
            conn.send_packed_command(packed)
        except BaseException:
            self.drop(conn)
            raise
        return conn

    def read_pipeline(self, conn: Any, count: int) -> list[Any]:
        """The second half of :meth:`pipeline`: read ``count`` replies from ``conn`` (an
        error reply as its exception instance), then give the connection back (dropped
        if a read failed: a reply may be left unread)."""
        try:
            read = reply_reader(conn)
            replies: list[Any] = []
            for _ in range(count):
                try:
                    replies.append(read())
                except ResponseError as exc:
                    replies.append(exc)
            return replies
        except BaseException:
            conn.disconnect()
            raise
        finally:
            self._release(conn)

    def drop(self, conn: Any) -> None:
        """Disconnect ``conn`` (its replies are not to be read) and give it back."""
        try:
            conn.disconnect()
        finally:
            self._release(conn)


def lean_pool(client: Any) -> LeanPool | None:
    """A :class:`LeanPool` for ``client`` if its script calls may bypass redis-py's
    command machinery: a plain standalone sync ``redis.Redis`` (not a subclass, not a
    single-connection client, no replaced ``execute_command``, no EVALSHA response
    callback, no client-side cache) on a real server.  None keeps the generic path
    (fakeredis, a cluster client, a wrapper)."""
    if type(client) is not _SyncRedis or "execute_command" in vars(client):
        return None
    if _SyncRedis.execute_command is not _GENERIC_EXECUTE or getattr(client, "connection", None):
        return None
    if "EVALSHA" in getattr(client, "response_callbacks", {}):
        return None
    pool = getattr(client, "connection_pool", None)
    connection_class = getattr(pool, "connection_class", None)
    if connection_class is None or str(connection_class.__module__).startswith("fakeredis"):
        return None
    if getattr(pool, "cache", None) is not None:  # client-side caching wraps connections
        return None
    lean: LeanPool | None = getattr(pool, "_memtier_lean", None)
    if lean is None:  # one per pool: the idle connections it keeps are the pool's
        lean = LeanPool(pool, keep_idle=idle_to_keep(pool))
        setattr(pool, "_memtier_lean", lean)  # noqa: B010 - a redis-py object, untyped here
    return lean


def lean_async_pool(client: Any) -> Any | None:
    """The connection pool of ``client`` if its script calls may be auto-pipelined
    (:mod:`memtier.autopipeline`): the asyncio twin of :func:`lean_pool`'s test -- a plain
    standalone ``redis.asyncio.Redis`` (not a subclass, not a single-connection client, no
    replaced ``execute_command``, no EVALSHA response callback, no client-side cache) on a
    real server.  None keeps the generic path (fakeredis, an asyncio cluster client, a
    wrapper)."""
    if type(client) is not _AsyncRedis or "execute_command" in vars(client):
        return None
    if _AsyncRedis.execute_command is not _GENERIC_EXECUTE_ASYNC:
        return None
    if getattr(client, "single_connection_client", False) or getattr(client, "connection", None):
        return None
    if "EVALSHA" in getattr(client, "response_callbacks", {}):
        return None
    pool = getattr(client, "connection_pool", None)
    connection_class = getattr(pool, "connection_class", None)
    if connection_class is None or str(connection_class.__module__).startswith("fakeredis"):
        return None
    if getattr(pool, "cache", None) is not None:
        return None
    return pool
