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
  its TTL and the next session after it, on the sync and asyncio stores.
"""

from __future__ import annotations

import time
from typing import Any

from asyncadapter import PrivateLoop
from hypothesis import example, given, settings
from hypothesis import strategies as st
from memhelpers import Clock, key

from memtier import AsyncConversationStore, AvatarMessage, ConversationStore, MemtierConfig, limits
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


TTL_S = 0.6


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
    loop = PrivateLoop()
    try:
        loop.run(_expiry_scenario(store, _passed))
    finally:
        loop.stop()


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
