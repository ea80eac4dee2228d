"""The context read's request, kept per (member, channel, limit) (issue 12, "context vs
LRANGE").

Without a test clock, ``MemoryCore.context_call`` hands out the request it built before
for the same key and limit: it depends on nothing else (the keys, the channel's TTL from
the frozen configuration, the limit), and it is immutable.  An adversary checks:

* whatever was looked up before, and however many keys pushed others out of the
  bounded cache, the request for a key is the one a core that never served a read
  builds for it, and its session check folds every reply the same way;
* a store with a test clock reads the clock on every request (never a kept one);
* on real servers and the real clock, a kept request still sees the session expire at
  its TTL and the next session after it, on the sync and asyncio stores;
* its packed bytes are packed once and sent again by every later read; two threads that
  pack one fresh request at the same moment (held at a barrier right where each packs)
  leave one copy of it, and the server runs exactly one transaction per read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
import redis.asyncio
from asyncadapter import PrivateLoop
from hypothesis import example, given, settings
from hypothesis import strategies as st
from memhelpers import Clock, command_calls, key
from servers import RedisServer

from memtier import AsyncConversationStore, AvatarMessage, ConversationStore, MemtierConfig, limits
from memtier.autopipeline import Packer
from memtier.connection import LeanPool
from memtier.engine import Transaction
from memtier.memory import core as memory_core
from memtier.memory.core import MemoryCore

CONFIG = MemtierConfig(namespace="reqcache", partitions=4)

# (avatar number, channel, limit): limits the read normalises alike (0, negative, above
# the ceiling: all) and apart.
LOOKUPS = st.lists(
    st.tuples(
        st.integers(1, 12),
        st.sampled_from(["public", "im"]),
        st.sampled_from([0, -3, 1, 2, 20, 2_000, 2_001, 2**70]),
    ),
    max_size=60,
)

# Replies of the plain session check (HMGET of the head fields, TIME, HGET clock), live,
# expired, absent and malformed, for comparing two requests' folds.
HEAD_REPLIES = st.lists(
    st.one_of(
        st.none(),
        st.binary(max_size=8),
        st.integers(0, 2**40).map(lambda n: str(n).encode()),
    ),
    min_size=1,
    max_size=8,
)


def _folded(request: Transaction, fields: list[Any], now_s: int, clock: Any) -> Any:
    """What ``request``'s session check makes of one set of replies (or the error)."""
    assert request.plain is not None
    replies: list[Any] = [fields, [str(now_s).encode(), b"0"], clock]
    try:
        return ("ok", request.plain.fold(replies))
    except Exception as exc:  # the same malformed reply must fail the same way
        return ("error", type(exc).__name__, str(exc))


def _model_request(k: Any, limit: int) -> tuple[Any, ...]:
    """What the read of ``k`` must send, from the keyspace and the configuration alone:
    the session check's keys and ARGV (the channel's TTL, no clock override), its plain
    commands, and the ``LRANGE`` of the newest ``limit`` records (all for 0, a negative
    count or one above the turns ceiling)."""
    keyspace = MemoryCore(CONFIG).keyspace
    part = keyspace.partition(keyspace.partition_of(k.member))
    session = part.session(k.member)
    conv = CONFIG.conversation
    ttl_ms = conv.public_ttl_ms if k.channel.value == "public" else conv.im_ttl_ms
    newest = limit if 0 < limit <= limits.MAX_TURNS_PER_SESSION.ceiling else 0
    return (
        (session.session, part.meta),
        (ttl_ms, ""),
        (
            ("HMGET", session.session, "id", "last", "summary"),
            ("TIME",),
            ("HGET", part.meta, "clock"),
        ),
        (("LRANGE", session.turns, -newest if newest else 0, -1),),
    )


def _as_model(request: Transaction) -> tuple[Any, ...]:
    assert request.plain is not None
    return (request.script.keys, request.script.args, request.plain.commands, request.reads)


def _same_request(kept: Transaction, fresh: Transaction) -> None:
    assert kept.script == fresh.script
    assert kept.reads == fresh.reads
    assert kept.plain is not None and fresh.plain is not None
    assert kept.plain.commands == fresh.plain.commands


@settings(max_examples=80, deadline=None)
@given(lookups=LOOKUPS, fields=HEAD_REPLIES, now_s=st.integers(1_700_000_000, 1_900_000_000))
@example(lookups=[(1, "public", 0), (1, "public", 2_001), (1, "public", -3)], fields=[], now_s=1)
@example(lookups=[(1, "public", 20), (1, "im", 20), (2, "public", 20)], fields=[None], now_s=1)
def test_a_kept_request_is_the_one_a_fresh_core_builds(
    lookups: list[tuple[int, str, int]], fields: list[Any], now_s: int
) -> None:
    core = MemoryCore(CONFIG)
    for n, channel, limit in lookups:
        k = key(n, channel)
        kept = core.context_call(k, limit)
        fresh = MemoryCore(CONFIG).context_call(k, limit)
        _same_request(kept, fresh)
        assert _as_model(kept) == _model_request(k, limit)
        clock_field = str(now_s * 1000).encode()
        assert _folded(kept, fields, now_s, clock_field) == _folded(
            fresh, fields, now_s, clock_field
        )
        # kept: the same object while the key and the normalised limit are the same
        assert core.context_call(k, limit) is kept
        newest = memory_core.context_limit(limit)
        assert core.context_call(k, newest) is kept
    info = core._context_requests.cache_info()
    assert info.maxsize == memory_core._CONTEXT_REQUEST_CACHE_SIZE
    assert info.currsize <= info.maxsize


def test_the_kept_requests_are_bounded() -> None:
    """More keys than the cache holds: the oldest go, the count stays at the bound, and
    a key pushed out gets an equal request built again."""
    core = MemoryCore(CONFIG)
    bound = memory_core._CONTEXT_REQUEST_CACHE_SIZE
    first = core.context_call(key(1), 20)
    for n in range(2, bound + 50):
        core.context_call(key(n), 20)
    assert core._context_requests.cache_info().currsize == bound
    again = core.context_call(key(1), 20)
    assert again is not first  # it was pushed out
    _same_request(again, first)


def test_a_test_clock_is_read_on_every_request() -> None:
    """Under a test clock each request carries the clock's value when it is built: a
    kept request would carry the time of the first read."""
    clock = Clock()
    core = MemoryCore(CONFIG, clock=clock)
    k = key(1)
    before = core.context_call(k, 20)
    clock.advance(5_000)
    after = core.context_call(k, 20)
    assert before.script.args != after.script.args
    assert str(clock.now) in [str(a) for a in after.script.args]
    assert str(clock.now - 5_000) in [str(a) for a in before.script.args]


# Long enough that the read right after an append on a loaded CI machine still finds
# the session live; the server counts the TTL from before ``appended`` is taken.
TTL_S = 1.5


def _wait_past(deadline: float) -> None:
    while time.monotonic() < deadline:
        time.sleep(0.02)


async def _expiry_scenario(store: Any, call: Any) -> None:
    """Append, read, wait past the TTL, read, append, read: ``call`` awaits a coroutine
    of the asyncio store and passes a sync store's result through."""
    k = key(7)
    await call(store.append(k, AvatarMessage(text="first")))
    appended = time.monotonic()
    live = await call(store.context(k, limit=20))
    assert [t.seq for t in live.turns] == [1] and live.session_id is not None
    request = store.core.context_call(k, 20)
    assert store.core.context_call(k, 20) is request  # the one every read below uses
    _wait_past(appended + TTL_S + 0.2)
    gone = await call(store.context(k, limit=20))
    assert gone.session_id is None and gone.turns == ()
    assert store.core.context_call(k, 20) is request
    await call(store.append(k, AvatarMessage(text="second")))
    after = await call(store.context(k, limit=20))
    assert [t.seq for t in after.turns] == [1]
    assert after.session_id not in (None, live.session_id)
    assert store.core.context_call(k, 20) is request


async def _passed(result: Any) -> Any:
    return result


async def _awaited(result: Any) -> Any:
    return await result


def test_a_kept_request_sees_the_session_expire_on_the_sync_store(backend_no_fake: Any) -> None:
    """The real clock (no test hook), real servers (standalone and Cluster)."""
    config = backend_no_fake.config(conversation={"public_ttl_seconds": TTL_S})
    store = ConversationStore(backend_no_fake.sync_client(), config)
    asyncio.run(_expiry_scenario(store, _passed))  # a sync store: nothing in it awaits


def test_a_kept_request_sees_the_session_expire_on_the_asyncio_store(
    backend_no_fake: Any,
) -> None:
    config = backend_no_fake.config(conversation={"public_ttl_seconds": TTL_S})
    loop = PrivateLoop()
    try:

        async def scenario() -> None:
            store = AsyncConversationStore(backend_no_fake.async_client(), config)
            await _expiry_scenario(store, _awaited)
            await store.close()

        loop.run(scenario())
    finally:
        loop.stop()


# --- the packed bytes, kept with the request --------------------------------------------------
def test_two_threads_packing_one_request_leave_one_copy() -> None:
    """Both threads find the kept request unpacked and pack it at the same moment (a
    barrier where each packs): the request then holds one transaction's bytes, each read
    sent exactly one (the server ran two ``EXEC``), and the next read packs nothing."""
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url, max_connections=4)
        try:
            assert int(client.info("server")["process_id"]) == server.pid  # ours only
            store = ConversationStore(client, MemtierConfig.load(redis_url=server.url))
            k = key(3)
            for n in range(3):
                store.append(k, AvatarMessage(text=f"turn {n}"))
            request = store.core.context_call(k, 20)
            assert request.packed == []
            client.config_resetstat()
            barrier = threading.Barrier(2, timeout=30)
            packs = []
            original = LeanPool._pack_all

            def pack_at_the_barrier(self: LeanPool, conn: Any, commands: Any) -> Any:
                packs.append(1)
                if len(packs) <= 2:
                    barrier.wait()  # both threads got past `if not packed`
                return original(self, conn, commands)

            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(LeanPool, "_pack_all", pack_at_the_barrier)
                with ThreadPoolExecutor(2) as pool:
                    reads = list(pool.map(lambda _: store.context(k, limit=20), range(2)))
                assert len(packs) == 2  # the race happened: both packed
                assert [[t.seq for t in r.turns] for r in reads] == [[1, 2, 3], [1, 2, 3]]
                assert b"".join(request.packed).count(b"MULTI") == 1
                assert command_calls(client).get("cmdstat_exec", 0) == 2
                assert [t.seq for t in store.context(k, limit=20).turns] == [1, 2, 3]
                assert len(packs) == 2  # sent again, not packed again
                assert command_calls(client).get("cmdstat_exec", 0) == 3
        finally:
            client.close()


def test_a_request_derived_from_a_kept_one_packs_its_own_bytes(redis_server: Any) -> None:
    """``dataclasses.replace`` of a kept request (the script form of the same read, as
    the NOSCRIPT tests build it) does not inherit the bytes the kept one was sent as."""
    client = redis.Redis.from_url(redis_server.url)
    try:
        config = MemtierConfig.load(redis_url=redis_server.url, namespace="reqcache-derived")
        store = ConversationStore(client, config)
        k = key(5)
        store.append(k, AvatarMessage(text="one"))
        want = [t.seq for t in store.context(k, limit=20).turns]
        request = store.core.context_call(k, 20)
        assert b"EVALSHA" not in b"".join(request.packed)  # the plain form was sent
        derived = dataclasses.replace(request, plain=None)
        assert derived.packed == []
        reply = store.executor.execute(derived, "context")
        assert [t.seq for t in store.core.decode_context(k, reply).turns] == want
        assert b"EVALSHA" in b"".join(derived.packed)
        assert b"EVALSHA" not in b"".join(request.packed)
    finally:
        client.close()


def test_the_asyncio_store_packs_a_kept_request_once(redis_server: Any) -> None:
    loop = PrivateLoop()
    packed: list[int] = []
    original = Packer.__call__

    def counted(self: Packer, args: Any) -> list[bytes]:
        packed.append(1)
        return original(self, args)

    try:

        async def scenario() -> None:
            config = MemtierConfig.load(redis_url=redis_server.url, namespace="reqcache-aio")
            store = AsyncConversationStore(redis.asyncio.Redis.from_url(redis_server.url), config)
            k = key(4)
            await store.append(k, AvatarMessage(text="one"))
            request = store.core.context_call(k, 20)
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(Packer, "__call__", counted)
                first = await store.context(k, limit=20)
                packs = len(packed)
                sent = list(request.packed)
                second = await store.context(k, limit=20)
            assert packs > 0 and len(packed) == packs  # packed by the first read only
            assert request.packed == sent and b"".join(sent).count(b"MULTI") == 1
            assert [t.seq for t in first.turns] == [t.seq for t in second.turns] == [1]
            await store.close()

        loop.run(scenario())
    finally:
        loop.stop()
