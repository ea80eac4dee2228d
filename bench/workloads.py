"""Payloads, key pools, the raw-Redis baselines and memtier's own measures.

Every measure here is a :class:`~bench.framework.Measure`: ``run(n)`` performs
``n`` operations on one connection, in a loop, and returns the elapsed time.
Payloads are deterministic chat-like ASCII text (no secrets, so redaction does
its full scan and replaces nothing), identical for memtier, the baselines and
the peers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import redis
import redis.asyncio
from redis.connection import Connection

from bench.framework import Measure, timed
from bench.server import HOST, BenchRedis
from memtier import (
    AsyncConversationStore,
    AvatarMessage,
    ConversationKey,
    ConversationStore,
    MemtierConfig,
)

__all__ = [
    "PAYLOAD_SIZES",
    "AsyncLoop",
    "Baselines",
    "KeyPool",
    "MemtierBench",
    "RecordedCall",
    "bench_config",
    "chat_text",
    "lean_calls_recorded",
    "populate",
    "prepared_appends",
]

PAYLOAD_SIZES: dict[str, int] = {"300B": 300, "4KiB": 4096}
READ_LAST = 20  # "read the last 20 turns"
HISTORY_TURNS = 100  # turns in each session that the read benchmarks read from
READ_POOL = 32  # sessions (lists) the read benchmarks rotate over
APPEND_POOL = 1000  # sessions the append benchmarks rotate over
MINIMAL_SCRIPT = Path(__file__).with_name("minimal_append-4.lua")
# The floors: the commands memtier's semantics require, no Lua logic (run from redis-benchmark).
FLOOR_APPEND_SCRIPT = Path(__file__).with_name("floor_append-6.lua")
FLOOR_READ_SCRIPT = Path(__file__).with_name("floor_read-2.lua")
FLOOR_TTL_MS = 10 * 24 * 3600 * 1000  # the floor read's sessions never expire during a run

_WORDS = [
    "hello",
    "there",
    "could",
    "you",
    "help",
    "me",
    "find",
    "the",
    "sandbox",
    "region",
    "near",
    "the",
    "harbour",
    "I",
    "want",
    "to",
    "build",
    "a",
    "small",
    "shop",
    "with",
    "a",
    "vendor",
    "script",
    "and",
    "some",
    "furniture",
    "from",
    "my",
    "inventory",
    "the",
    "teleport",
    "to",
    "the",
    "welcome",
    "area",
    "keeps",
    "failing",
    "and",
    "my",
    "friend",
    "says",
    "the",
    "group",
    "chat",
    "is",
    "quiet",
    "today",
    "thanks",
    "sure",
    "okay",
    "what",
    "where",
    "when",
    "how",
    "why",
    "maybe",
    "later",
    "tomorrow",
    "tonight",
    "see",
    "you",
    "at",
    "the",
    "event",
]


def chat_text(nbytes: int, seed: int = 7) -> str:
    """Deterministic chat-like ASCII text of exactly ``nbytes`` bytes."""
    rnd = random.Random(seed)
    words: list[str] = []
    size = 0
    while size < nbytes:
        word = rnd.choice(_WORDS)
        words.append(word)
        size += len(word) + 1
    text = " ".join(words)[:nbytes]
    return text.ljust(nbytes, ".")


def bench_config(
    namespace: str, threads: dict[str, Any] | None = None, **conversation: Any
) -> MemtierConfig:
    """Config for the benchmark namespaces: bounds at their hard ceilings unless overridden.

    Bounds do not change the cost of an append (the script checks them either way);
    ceilings keep the rotating key pools from ever hitting a session bound.
    """
    conv: dict[str, Any] = {
        "max_active_sessions": 1_000_000,
        "max_turns_per_session": 2_000,
        "max_session_bytes": 4 * 1024 * 1024,
        "max_aggregate_bytes": 64 * 1024**3,
    }
    conv.update(conversation)
    extra = {"threads": threads} if threads else {}  # else the environment's, as before
    return MemtierConfig.load(namespace=namespace, conversation=conv, **extra)


class KeyPool:
    """A fixed, deterministic set of conversation keys, handed out round-robin."""

    def __init__(self, tag: int, size: int, channel: str = "public") -> None:
        self.keys = [ConversationKey(uuid.UUID(int=(tag << 64) | i), channel) for i in range(size)]
        self.i = 0

    def next(self) -> ConversationKey:
        key = self.keys[self.i % len(self.keys)]
        self.i += 1
        return key


class AsyncLoop:
    """One event loop shared by every asyncio measure of a run."""

    def __init__(self) -> None:
        self.runner = asyncio.Runner()
        self.closers: list[Callable[[], Coroutine[Any, Any, Any]]] = []

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.runner.run(coro)

    def close(self) -> None:
        for closer in self.closers:
            try:
                self.run(closer())
            except Exception:
                pass
        self.runner.close()


CONCURRENCY = 64  # coroutines on one event loop in the concurrent asyncio rows


async def run_concurrently(
    n: int, step: Callable[[int], Coroutine[Any, Any, Any]], coroutines: int = CONCURRENCY
) -> float:
    """``n`` calls of ``step(i)`` (i = 0..n-1) spread over ``coroutines`` coroutines on the
    running loop, each awaiting its own calls one after another; elapsed seconds."""

    async def worker(first: int) -> None:
        for i in range(first, n, coroutines):
            await step(i)

    started = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(min(coroutines, n))))
    return time.perf_counter() - started


def _with_key(prepared: Any, key: Any) -> Any:
    """``prepared`` for another key (a named tuple since 2026-12-03, a dataclass before:
    the bench also runs older trees)."""
    if hasattr(prepared, "_replace"):
        return prepared._replace(key=key)
    return dataclasses.replace(prepared, key=key)


def populate(
    store: ConversationStore,
    keys: Sequence[ConversationKey],
    text: str,
    turns: int = 1,
    batch: int = 500,
    *,
    unique_ids: bool = False,
) -> int:
    """Append ``turns`` turns to each key fast: pipelined EVALSHA of memtier's own script.

    The turn is prepared (redacted, bounded, encoded) once by memtier's core and
    re-targeted per key; every append still runs the real ``append_turn`` script with
    all its checks.  Turn ids are short (``p<turn>``) and shared across sessions (ids are
    per session) unless ``unique_ids``: then every turn is prepared by the core with a
    uuid4 hex id, exactly as ``append`` does (slower; used where bytes are measured).
    Returns the number of appends that did not store (should be 0).
    """
    client = store.client
    core = store.core
    script = store.scripts["append_turn"]
    client.script_load(script.source)
    failures = 0
    pipe = client.pipeline(transaction=False)
    pending = 0
    for t in range(turns):
        shared = core.prepare_turn(keys[0], AvatarMessage(text=text, turn_id=f"p{t}"))
        for key in keys:
            if unique_ids:  # exactly what append() sends: a uuid4 hex turn id
                prepared = core.prepare_turn(key, AvatarMessage(text=text))
            else:
                prepared = _with_key(shared, key)
            call = core.append_call(prepared)
            pipe.evalsha(script.sha, script.num_keys, *call.keys, *call.args)
            pending += 1
            if pending >= batch:
                failures += sum(1 for r in pipe.execute() if int(r[0]) != 0)
                pending = 0
    if pending:
        failures += sum(1 for r in pipe.execute() if int(r[0]) != 0)
    return failures


# --- raw Redis baselines ---------------------------------------------------------------------


def _resp(*parts: str | bytes | int) -> bytes:
    """RESP-encode one command (what a pre-encoded raw-socket client sends)."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        data = part if isinstance(part, bytes) else str(part).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class Baselines:
    """The physical limit for a Python client: the minimal script and LRANGE, four ways."""

    def __init__(self, server: BenchRedis, loop: AsyncLoop) -> None:
        self.server = server
        self.loop = loop
        self.client = server.client()
        self.source = MINIMAL_SCRIPT.read_text(encoding="utf-8")
        self.sha = str(self.client.script_load(self.source))
        self.floor_append_sha = str(
            self.client.script_load(FLOOR_APPEND_SCRIPT.read_text(encoding="utf-8"))
        )
        self.floor_read_sha = str(
            self.client.script_load(FLOOR_READ_SCRIPT.read_text(encoding="utf-8"))
        )
        self.histories_made: set[str] = set()

    # keys ------------------------------------------------------------------------------------
    @staticmethod
    def append_args(tag: str, i: int) -> tuple[str, str, str, str]:
        sid = f"{i % APPEND_POOL:012d}"
        return (f"{{{tag}}}:q:{sid}", f"{{{tag}}}:t:{sid}", f"{{{tag}}}:meta", f"{{{tag}}}:lru")

    @staticmethod
    def history_key(tag: str, i: int) -> str:
        return f"{{{tag}}}:r:{i % READ_POOL:012d}"

    def make_histories(self, tag: str, text: str) -> None:
        """READ_POOL lists of HISTORY_TURNS JSON entries, like a chat history store keeps."""
        if tag in self.histories_made:
            return
        self.histories_made.add(tag)
        entry = orjson.dumps({"role": "user", "content": text})
        pipe = self.client.pipeline(transaction=False)
        for i in range(READ_POOL):
            key = self.history_key(tag, i)
            pipe.delete(key)
            pipe.rpush(key, *([entry] * HISTORY_TURNS))
        pipe.execute()

    # append ----------------------------------------------------------------------------------
    def append_measures(self, size: str, text: str) -> list[Measure]:
        tag = f"ba{size}"
        pool = [(*self.append_args(tag, i), text, f"m{i}") for i in range(APPEND_POOL)]
        sha, client = self.sha, self.client
        state = {"i": 0}

        def redispy(n: int) -> None:
            i = state["i"]
            for j in range(i, i + n):
                client.evalsha(sha, 4, *pool[j % APPEND_POOL])
            state["i"] = i + n

        conn = low_level_connection(self.server.port)

        def lowlevel(n: int) -> None:
            i = state["i"]
            for j in range(i, i + n):
                conn.send_command("EVALSHA", sha, 4, *pool[j % APPEND_POOL])
                conn.read_response()
            state["i"] = i + n

        packed = [_resp("EVALSHA", sha, 4, *args) for args in pool]
        raw = RawSocket(self.server.port)

        def raw_socket(n: int) -> None:
            i = state["i"]
            for j in range(i, i + n):
                raw.call(packed[j % APPEND_POOL])
            state["i"] = i + n

        rb_args = [
            "EVALSHA",
            sha,
            "4",
            f"{{{tag}}}:q:__rand_int__",
            f"{{{tag}}}:t:__rand_int__",
            f"{{{tag}}}:meta",
            f"{{{tag}}}:lru",
            text,
            "m__rand_int__",
        ]
        return [
            Measure(
                f"base.append.{size}.redispy",
                f"raw EVALSHA minimal script, redis-py+hiredis [{size}]",
                timed(redispy),
            ),
            Measure(
                f"base.append.{size}.lowlevel",
                f"raw EVALSHA minimal script, redis-py Connection [{size}]",
                timed(lowlevel),
            ),
            Measure(
                f"base.append.{size}.socket",
                f"raw EVALSHA minimal script, pre-encoded socket [{size}]",
                timed(raw_socket),
            ),
            Measure(
                f"base.append.{size}.redis-benchmark",
                f"raw EVALSHA minimal script, redis-benchmark -c 1 [{size}]",
                lambda n: redis_benchmark(self.server.port, n, rb_args, APPEND_POOL),
                note="C client, no Python: the server's own limit for this script",
            ),
        ]

    def floor_append_measure(self, size: str, text: str, clients: int = 1) -> Measure:
        """The floor of an append: the commands memtier's semantics require, from a C client.

        ``clients`` connections of one ``redis-benchmark`` (the multi-process section's
        floor); ``run(n)`` then performs ``n`` appends per connection, like each worker
        process does.  redis-benchmark draws every ``__rand_int__`` independently, so the
        session's hash, list and id zset are different sessions of the same pool: the same
        commands on keys of the same shape, which is what the server cost depends on.
        """
        tag = f"fl{size}"
        record = orjson.dumps({"role": "user", "content": text}).decode()
        rb_args = [
            "EVALSHA",
            self.floor_append_sha,
            "6",
            f"{{{tag}}}:s:__rand_int__",
            f"{{{tag}}}:t:__rand_int__",
            f"{{{tag}}}:i:__rand_int__",
            f"{{{tag}}}:lru",
            f"{{{tag}}}:ix",
            f"{{{tag}}}:meta",
            "t__rand_int____rand_int____rand_int__",  # 36 random digits: no duplicates
            record,
            "m__rand_int__",
        ]
        port = self.server.port
        if clients == 1:
            return Measure(
                f"floor.append.{size}.redis-benchmark",
                f"floor: append's required commands, one script, redis-benchmark -c 1 [{size}]",
                lambda n: redis_benchmark(port, n, rb_args, APPEND_POOL),
                note="C client; TIME, 2 HMGET, RPUSH, ZADD x2, HSET x3; no Lua logic",
            )
        return Measure(
            "procs.floor-own",
            f"floor: append's required commands, redis-benchmark -c {clients} [300B]",
            lambda n: redis_benchmark(port, n * clients, rb_args, APPEND_POOL, clients=clients),
            items_per_op=clients,
            note="C client, one process, one connection per worker; aggregate op/s",
        )

    def floor_read_measure(self, size: str, text: str) -> Measure:
        """The floor of context(limit=20): expiry check + LRANGE in one script, C client."""
        tag = f"br{size}"
        self.make_histories(tag, text)
        now_ms = int(time.time() * 1000)
        pipe = self.client.pipeline(transaction=False)
        for i in range(READ_POOL):
            pipe.hset(f"{{{tag}}}:s:{i:012d}", mapping={"id": f"sid{i}", "last": now_ms})
        pipe.execute()
        rb_args = [
            "EVALSHA",
            self.floor_read_sha,
            "2",
            f"{{{tag}}}:s:__rand_int__",
            f"{{{tag}}}:r:__rand_int__",
            str(FLOOR_TTL_MS),
            str(READ_LAST),
        ]
        return Measure(
            f"floor.read20.{size}.redis-benchmark",
            f"floor: context's required commands, one script, redis-benchmark -c 1 [{size}]",
            lambda n: redis_benchmark(self.server.port, n, rb_args, READ_POOL),
            note="C client, no decoding; TIME, HMGET session, LRANGE last 20",
        )

    def append_async_measure(self, size: str, text: str) -> Measure:
        tag = f"bx{size}"
        pool = [(*self.append_args(tag, i), text, f"m{i}") for i in range(APPEND_POOL)]
        sha = self.sha
        holder: dict[str, Any] = {}

        async def make() -> None:
            holder["c"] = redis.asyncio.Redis(host=HOST, port=self.server.port)

        self.loop.run(make())
        self.loop.closers.append(lambda: holder["c"].aclose())
        state = {"i": 0}

        async def go(n: int) -> float:
            client = holder["c"]
            i = state["i"]
            started = time.perf_counter()
            for j in range(i, i + n):
                await client.evalsha(sha, 4, *pool[j % APPEND_POOL])
            state["i"] = i + n
            return time.perf_counter() - started

        return Measure(
            f"base.append.{size}.asyncio",
            f"raw EVALSHA minimal script, redis-py asyncio [{size}]",
            lambda n: float(self.loop.run(go(n))),
        )

    # read last 20 ----------------------------------------------------------------------------
    def read_measures(self, size: str, text: str) -> list[Measure]:
        tag = f"br{size}"
        self.make_histories(tag, text)
        keys = [self.history_key(tag, i) for i in range(READ_POOL)]
        client = self.client
        loads = orjson.loads
        state = {"i": 0}

        def redispy(n: int) -> None:
            i = state["i"]
            for j in range(i, i + n):
                items = [loads(x) for x in client.lrange(keys[j % READ_POOL], -READ_LAST, -1)]
                assert len(items) == READ_LAST
            state["i"] = i + n

        conn = low_level_connection(self.server.port)

        def lowlevel(n: int) -> None:
            i = state["i"]
            for j in range(i, i + n):
                conn.send_command("LRANGE", keys[j % READ_POOL], -READ_LAST, -1)
                items = [loads(x) for x in conn.read_response()]
                assert len(items) == READ_LAST
            state["i"] = i + n

        rb_args = ["LRANGE", f"{{{tag}}}:r:__rand_int__", str(-READ_LAST), "-1"]
        return [
            Measure(
                f"base.read20.{size}.redispy",
                f"LRANGE last 20 + orjson, redis-py+hiredis [{size}]",
                timed(redispy),
            ),
            Measure(
                f"base.read20.{size}.lowlevel",
                f"LRANGE last 20 + orjson, redis-py Connection [{size}]",
                timed(lowlevel),
            ),
            Measure(
                f"base.read20.{size}.redis-benchmark",
                f"LRANGE last 20, redis-benchmark -c 1 (no decoding) [{size}]",
                lambda n: redis_benchmark(self.server.port, n, rb_args, READ_POOL),
                note="C client, no JSON decoding",
            ),
        ]

    def read_async_measure(self, size: str, text: str) -> Measure:
        tag = f"br{size}"
        self.make_histories(tag, text)
        keys = [self.history_key(tag, i) for i in range(READ_POOL)]
        loads = orjson.loads
        holder: dict[str, Any] = {}

        async def make() -> None:
            holder["c"] = redis.asyncio.Redis(host=HOST, port=self.server.port)

        self.loop.run(make())
        self.loop.closers.append(lambda: holder["c"].aclose())
        state = {"i": 0}

        async def go(n: int) -> float:
            client = holder["c"]
            i = state["i"]
            started = time.perf_counter()
            for j in range(i, i + n):
                raw = await client.lrange(keys[j % READ_POOL], -READ_LAST, -1)
                items = [loads(x) for x in raw]
                assert len(items) == READ_LAST
            state["i"] = i + n
            return time.perf_counter() - started

        return Measure(
            f"base.read20.{size}.asyncio",
            f"LRANGE last 20 + orjson, redis-py asyncio [{size}]",
            lambda n: float(self.loop.run(go(n))),
        )

    def concurrent_async_measures(self, size: str, text: str) -> list[Measure]:
        """The raw redis-py asyncio client at :data:`CONCURRENCY` coroutines on one loop:
        the minimal script by EVALSHA, and LRANGE 20 + orjson (each coroutine takes its own
        pooled connection, as redis-py's client does for concurrent commands)."""
        tag, rtag = f"bc{size}", f"br{size}"
        self.make_histories(rtag, text)
        keys = [self.history_key(rtag, i) for i in range(READ_POOL)]
        pool = [(*self.append_args(tag, i), text, f"m{i}") for i in range(APPEND_POOL)]
        sha, loads = self.sha, orjson.loads
        holder: dict[str, Any] = {}

        async def make() -> None:
            holder["c"] = redis.asyncio.Redis(host=HOST, port=self.server.port)

        self.loop.run(make())
        self.loop.closers.append(lambda: holder["c"].aclose())
        state = {"a": 0, "r": 0}

        async def append(i: int) -> None:
            await holder["c"].evalsha(sha, 4, *pool[(state["a"] + i) % APPEND_POOL])

        async def read(i: int) -> None:
            raw = await holder["c"].lrange(keys[(state["r"] + i) % READ_POOL], -READ_LAST, -1)
            items = [loads(x) for x in raw]
            assert len(items) == READ_LAST

        def go(op: str, step: Callable[[int], Coroutine[Any, Any, None]]) -> Callable[[int], float]:
            def run(n: int) -> float:
                elapsed = float(self.loop.run(run_concurrently(n, step)))
                state[op] += n
                return elapsed

            return run

        return [
            Measure(
                f"base.append.{size}.asyncio{CONCURRENCY}",
                f"raw EVALSHA minimal script, redis-py asyncio, {CONCURRENCY} coroutines [{size}]",
                go("a", append),
            ),
            Measure(
                f"base.read20.{size}.asyncio{CONCURRENCY}",
                f"LRANGE last 20 + orjson, redis-py asyncio, {CONCURRENCY} coroutines [{size}]",
                go("r", read),
            ),
        ]

    # list_metadata baseline -------------------------------------------------------------------
    def metadata_measure(self, store: ConversationStore, sessions: int, page: int) -> Measure:
        """HSCAN of memtier's index hash + one pipelined HMGET per session: no script."""
        part = store.core.keyspace.partition(0)
        client = self.client
        fields = ("id", "created", "created_wall", "last", "last_wall", "turns", "bytes")

        def walk(n: int) -> None:
            for _ in range(n):
                cursor: Any = 0
                seen = 0
                for _page in range(1_000_000):  # bounded: a 10k-session walk takes ~100 pages
                    cursor, entries = client.hscan(part.index, cursor, count=page)
                    pipe = client.pipeline(transaction=False)
                    for member in entries:
                        name = member.decode() if isinstance(member, bytes) else str(member)
                        pipe.hmget(part.session(name).session, *fields)
                    seen += len(pipe.execute())
                    if int(cursor) == 0:
                        break
                assert seen >= sessions, (seen, sessions)

        return Measure(
            f"base.metadata.page{page}",
            f"raw HSCAN index + pipelined HMGET per session, page {page}",
            timed(walk),
            unit="sessions/s",
            items_per_op=sessions,
            fixed_ops=1,
        )


def prepared_appends(store: ConversationStore, pool: KeyPool, text: str, n: int) -> list[bytes]:
    """``n`` calls of memtier's own ``append_turn`` to ``pool``'s next sessions, each
    prepared as ``store.append`` prepares it (validated, redacted, a fresh turn id: every
    call stores a turn) and packed for a raw socket (the script must be loaded)."""
    core, script = store.core, store.scripts["append_turn"]
    packed = []
    for _ in range(n):
        call = core.append_call(core.prepare_turn(pool.next(), AvatarMessage(text=text)))
        packed.append(_resp("EVALSHA", script.sha, script.num_keys, *call.keys, *call.args))
    return packed


def low_level_connection(port: int) -> Any:
    """redis-py's low-level :class:`~redis.connection.Connection` (hiredis parser), connected."""
    conn: Any = Connection(host=HOST, port=port)  # type: ignore[no-untyped-call]
    conn.connect()
    return conn


@dataclasses.dataclass(frozen=True)
class RecordedCall:
    """One call of memtier's lean transport as it went over the wire: the request's bytes,
    the reply (an error reply as its exception), and how many replies the request gets
    (1 for a script call, the command count for a ``MULTI`` ... ``EXEC`` transaction)."""

    request: bytes
    reply: Any
    replies: int


@contextlib.contextmanager
def lean_calls_recorded(sink: list[RecordedCall]) -> Iterator[None]:
    """memtier's lean transport (:class:`memtier.connection.LeanPool`) as it is, each call
    it completes appended to ``sink``: what a probe serves back as canned replies
    (``bench.clientsplit``) or sends again from a pre-encoded socket
    (``bench.workers_threads``).  Only plain sync clients take the lean path: a caller
    checks that the calls it expects were recorded."""
    from memtier.connection import LeanPool

    execute, transaction = LeanPool.execute, LeanPool.transaction

    def recorded_execute(self: Any, args: Any, packed: list[Any], during: Any = None) -> Any:
        reply = execute(self, args, packed, during)
        sink.append(RecordedCall(b"".join(packed), reply, 1))
        return reply

    def recorded_transaction(self: Any, commands: Any, count: int, packed: list[Any]) -> Any:
        reply = transaction(self, commands, count, packed)
        sink.append(RecordedCall(b"".join(packed), reply, count))
        return reply

    LeanPool.execute = recorded_execute  # type: ignore[method-assign]
    LeanPool.transaction = recorded_transaction  # type: ignore[method-assign]
    try:
        yield
    finally:
        LeanPool.execute, LeanPool.transaction = execute, transaction  # type: ignore[method-assign]


class RawSocket:
    """A blocking loopback socket and a hiredis reader: nothing between us and Redis."""

    def __init__(self, port: int) -> None:
        import hiredis

        self.sock = socket.create_connection((HOST, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = hiredis.Reader()

    def call(self, packed: bytes) -> Any:
        self.sock.sendall(packed)
        return self.read()

    def timed_calls(self, packed: Sequence[bytes], what: str) -> float:
        """Seconds to send each pre-encoded command and read its reply, one round trip
        each; RuntimeError if any was refused (it would make a floor row meaningless)."""
        refused = None
        started = time.perf_counter()
        for one in packed:
            reply = self.call(one)
            if refused is None and isinstance(reply, Exception):
                refused = reply
        elapsed = time.perf_counter() - started
        if refused is not None:
            raise RuntimeError(f"{what} refused a prepared call: {refused}")
        return elapsed

    def close(self) -> None:
        self.sock.close()

    def read(self) -> Any:
        """The next reply (an error reply as its exception object)."""
        while True:
            reply = self.reader.gets()
            if reply is not False:
                return reply
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("redis closed the connection")
            self.reader.feed(data)


def redis_benchmark(
    port: int, n: int, args: Sequence[str], keyspace: int, clients: int = 1
) -> float:
    """Run ``redis-benchmark -c clients -n n`` for one command; returns ``n / rps`` seconds."""
    cmd = [
        "redis-benchmark",
        "-h",
        HOST,
        "-p",
        str(port),
        "-c",
        str(clients),
        "-n",
        str(max(n, 1)),
        "-r",
        str(keyspace),
        "--csv",
        *args,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
    lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
    # "test","rps",...: the test name is the command as sent, unescaped (a JSON payload's
    # quotes included), so the numeric columns are counted from the right.
    numeric = lines[0].count('","')
    rps = float(lines[-1].rsplit('","', numeric)[1].strip('"'))
    return n / rps


# --- memtier -------------------------------------------------------------------------------


class MemtierBench:
    """memtier's sync and asyncio stores on the benchmark server (namespace ``bench``)."""

    def __init__(self, server: BenchRedis, loop: AsyncLoop) -> None:
        self.server = server
        self.loop = loop
        self.config = bench_config("bench")
        self.client = server.client()
        self.store = ConversationStore(self.client, self.config)
        holder: dict[str, Any] = {}

        async def make() -> None:
            holder["c"] = redis.asyncio.Redis(host=HOST, port=server.port)

        loop.run(make())
        self.aclient = holder["c"]
        self.astore = AsyncConversationStore(self.aclient, self.config)
        loop.closers.append(lambda: self.aclient.aclose())
        self._tag = 100

    def pool(self, size: int, channel: str = "public") -> KeyPool:
        self._tag += 1
        return KeyPool(self._tag, size, channel)

    def histories(self, text: str) -> KeyPool:
        pool = self.pool(READ_POOL)
        failures = populate(self.store, pool.keys, text, turns=HISTORY_TURNS)
        if failures:
            raise RuntimeError(f"populating read histories: {failures} appends not stored")
        return pool

    def append_sync(self, size: str, text: str) -> Measure:
        pool, store = self.pool(APPEND_POOL), self.store

        def run(n: int) -> None:
            for _ in range(n):
                store.append(pool.next(), AvatarMessage(text=text))

        return Measure(f"memtier.append.{size}.sync", f"memtier append, sync [{size}]", timed(run))

    def append_lean(self, size: str, text: str) -> Measure:
        """memtier's own core and script through redis-py's low-level Connection.

        Not the public API: the same validation, redaction, bounding, script and
        receipt, without the retry and metrics shell -- what a leaner call path reaches.
        """
        pool, core = self.pool(APPEND_POOL), self.store.core
        script = self.store.scripts["append_turn"]
        self.client.script_load(script.source)
        conn = low_level_connection(self.server.port)

        def run(n: int) -> None:
            for _ in range(n):
                prepared = core.prepare_turn(pool.next(), AvatarMessage(text=text))
                call = core.append_call(prepared)
                conn.send_command("EVALSHA", script.sha, script.num_keys, *call.keys, *call.args)
                core.decode_append(prepared, conn.read_response())

        return Measure(
            f"memtier.append.{size}.lean",
            f"memtier core + script via redis-py Connection, no shell [{size}]",
            timed(run),
            note="not the public API: the retry/metrics shell left out",
        )

    def append_script_socket(self, size: str, text: str) -> Measure:
        """memtier's own ``append_turn`` from a pre-encoded socket: each call's ARGV
        prepared (validated, redacted, a fresh turn id: every call stores) and packed
        before the clock starts, so the row is the script's Redis cost plus one round trip
        and nothing else.  No Python client of these semantics can be faster: the
        distance between this row and the baseline is all the room memtier's own client
        work has (the Python floor of "append vs raw", beside the C floor)."""
        pool = self.pool(APPEND_POOL)
        self.client.script_load(self.store.scripts["append_turn"].source)
        raw = RawSocket(self.server.port)

        def run(n: int) -> float:
            return raw.timed_calls(prepared_appends(self.store, pool, text, n), "append_turn")

        return Measure(
            f"memtier.append.{size}.script-socket",
            f"memtier's append_turn script, pre-encoded socket, ARGV prepared untimed [{size}]",
            run,
            note="not the public API: the Python floor, the script and one round trip only",
        )

    def append_batched(self, size: str, text: str, batch: int = 50) -> Measure:
        """memtier's core and script, ``batch`` appends pipelined per round trip."""
        pool, core = self.pool(APPEND_POOL), self.store.core
        script = self.store.scripts["append_turn"]
        self.client.script_load(script.source)
        pipe = self.client.pipeline(transaction=False)

        def run(n: int) -> None:
            done = 0
            while done < n:
                chunk = min(batch, n - done)
                prepared = [
                    core.prepare_turn(pool.next(), AvatarMessage(text=text)) for _ in range(chunk)
                ]
                for p in prepared:
                    call = core.append_call(p)
                    pipe.evalsha(script.sha, script.num_keys, *call.keys, *call.args)
                for p, reply in zip(prepared, pipe.execute(), strict=True):
                    core.decode_append(p, reply)
                done += chunk

        return Measure(
            f"memtier.append.{size}.batched",
            f"memtier core + script, {batch} appends pipelined per round trip [{size}]",
            timed(run),
            note="not the public API: batching appends from one worker",
        )

    def append_async(self, size: str, text: str) -> Measure:
        pool, store = self.pool(APPEND_POOL), self.astore

        async def go(n: int) -> float:
            started = time.perf_counter()
            for _ in range(n):
                await store.append(pool.next(), AvatarMessage(text=text))
            return time.perf_counter() - started

        return Measure(
            f"memtier.append.{size}.asyncio",
            f"memtier append, asyncio [{size}]",
            lambda n: float(self.loop.run(go(n))),
        )

    def read_sync(self, size: str, pool: KeyPool, *, cold: bool = False) -> Measure:
        """``store.context(limit=20)`` over ``pool``.  With ``cold``, on a store whose
        per-key decode cache is off: every read decodes its 20 records, as a read of
        records this process has not read before does (the sessions here do not change
        between reads, so after the first round the warm row hits that cache)."""
        store = self.store
        if cold:
            from memtier.memory.contextdecode import ReadCache

            store = ConversationStore(self.client, self.config)
            store.core._read_cache = ReadCache(max_keys=0)

        def run(n: int) -> None:
            for _ in range(n):
                ctx = store.context(pool.next(), limit=READ_LAST)
                assert len(ctx.messages) == READ_LAST

        return Measure(
            f"memtier.read20.{size}.sync" + ("-cold" if cold else ""),
            f"memtier context (last 20 of 100), sync{', decode cache off' if cold else ''}"
            f" [{size}]",
            timed(run),
        )

    def read_script_socket(self, size: str, pool: KeyPool) -> Measure:
        """memtier's context read transaction as its lean paths send it (``MULTI``, the
        session check as plain commands -- ``HMGET``, ``TIME``, ``HGET`` --, ``LRANGE`` 20,
        ``EXEC``) from a pre-encoded socket, packed before the clock starts, its reply not
        decoded: the Redis cost of the read's semantics plus one round trip.  What is left
        between this row and the baseline is all the room memtier's decoding and call
        path have (the Python floor of "context vs LRANGE", beside the C floor)."""
        core = self.store.core
        raw = RawSocket(self.server.port)
        packed = []
        for key in pool.keys:
            tx = core.context_call(key, READ_LAST)
            assert tx.plain is not None
            commands = (("MULTI",), *tx.plain.commands, *tx.reads, ("EXEC",))
            packed.append((b"".join(_resp(*c) for c in commands), len(commands)))
        state = {"i": 0}

        def run(n: int) -> None:
            i = state["i"]
            for j in range(i, i + n):
                one, replies = packed[j % len(packed)]
                raw.sock.sendall(one)
                for _ in range(replies):
                    reply = raw.read()
            state["i"] = i + n
            if not (isinstance(reply, list) and len(reply[-1]) == READ_LAST):
                raise RuntimeError(f"the read transaction did not answer 20 records: {reply!r}")

        return Measure(
            f"memtier.read20.{size}.script-socket",
            f"memtier's read transaction, pre-encoded socket, not decoded [{size}]",
            timed(run),
            note="not the public API: the Python floor, the transaction and one round trip only",
        )

    def read_async(self, size: str, pool: KeyPool) -> Measure:
        store = self.astore

        async def go(n: int) -> float:
            started = time.perf_counter()
            for _ in range(n):
                ctx = await store.context(pool.next(), limit=READ_LAST)
                assert len(ctx.messages) == READ_LAST
            return time.perf_counter() - started

        return Measure(
            f"memtier.read20.{size}.asyncio",
            f"memtier context (last 20 of 100), asyncio [{size}]",
            lambda n: float(self.loop.run(go(n))),
        )

    def concurrent_async(self, size: str, text: str, hist: KeyPool) -> list[Measure]:
        """memtier's asyncio store at :data:`CONCURRENCY` coroutines on one loop: appends
        and context reads (auto-pipelined where this memtier has it), and the same appends
        with ``auto_pipelining`` off when this memtier has the setting."""
        pool, store, hist_keys = self.pool(APPEND_POOL), self.astore, hist.keys

        async def append(i: int) -> None:
            await store.append(pool.next(), AvatarMessage(text=text))

        async def read(i: int) -> None:
            ctx = await store.context(hist_keys[i % len(hist_keys)], limit=READ_LAST)
            assert len(ctx.messages) == READ_LAST

        def go(step: Callable[[int], Coroutine[Any, Any, None]]) -> Callable[[int], float]:
            return lambda n: float(self.loop.run(run_concurrently(n, step)))

        c = CONCURRENCY
        out = [
            Measure(
                f"memtier.append.{size}.asyncio{c}",
                f"memtier append, asyncio, {c} coroutines [{size}]",
                go(append),
            ),
            Measure(
                f"memtier.read20.{size}.asyncio{c}",
                f"memtier context (last 20 of 100), asyncio, {c} coroutines [{size}]",
                go(read),
            ),
        ]
        if "auto_pipelining" in type(self.config.redis).model_fields:
            config = self.config.model_copy(
                update={"redis": self.config.redis.model_copy(update={"auto_pipelining": False})}
            )
            generic = AsyncConversationStore(self.aclient, config)
            off_pool = self.pool(APPEND_POOL)

            async def append_off(i: int) -> None:
                await generic.append(off_pool.next(), AvatarMessage(text=text))

            out.append(
                Measure(
                    f"memtier.append.{size}.asyncio{c}-nopipe",
                    f"memtier append, asyncio, {c} coroutines, auto_pipelining off [{size}]",
                    go(append_off),
                    note="the generic path: each call through redis-py's client",
                )
            )
        return out

    def metadata(self, sessions: int, text: str) -> tuple[ConversationStore, list[Measure]]:
        """A namespace holding exactly ``sessions`` sessions, walked with list_metadata."""
        store = ConversationStore(self.client, bench_config("benchmeta"))
        keys = KeyPool(7, sessions).keys
        if populate(store, keys, text):
            raise RuntimeError("populating the metadata namespace failed")
        measures = []
        for page in (100, 1000):

            def walk(n: int, page: int = page) -> None:
                for _ in range(n):
                    seen = sum(1 for _ in store.iter_metadata(page_size=page))
                    assert seen == sessions, (seen, sessions)

            measures.append(
                Measure(
                    f"memtier.metadata.page{page}",
                    f"memtier list_metadata walk of {sessions:,} sessions, page {page}",
                    timed(walk),
                    unit="sessions/s",
                    items_per_op=sessions,
                    fixed_ops=1,
                )
            )
        return store, measures
