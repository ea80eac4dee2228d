"""append_turn's deferred upkeep: periodic sweeps, sweeps under pressure, lazy key TTLs.

The append script sweeps expired sessions of its partition at most every
``SWEEP_INTERVAL_MS`` (clock) -- but always before it would evict a live session --
and re-sets key TTLs only when a key is new or ``TTL_REFRESH_MS`` of server time
passed since the last PEXPIRE.  These tests pin what that may and may not change.
"""

from __future__ import annotations

from typing import Any

import memfixtures
from memhelpers import Clock, StoreMaker, key

from memtier import AvatarMessage, ReasonCode
from memtier.limits import EXPIRY_GRACE_MS, SWEEP_INTERVAL_MS

# The store tests run on the sync and on the asyncio store (issue 13): ids [sync-fake], ...
make_store = memfixtures.make_store


def test_sweep_runs_on_appends_at_most_once_per_interval(
    make_store: StoreMaker, backend: Any
) -> None:
    clock = Clock()
    store = make_store(backend, clock, conversation={"public_ttl_seconds": 5})
    store.append(key(1), AvatarMessage(text="a"))  # first append of the partition sweeps
    store.append(key(2), AvatarMessage(text="b"))
    clock.advance(5_000 - SWEEP_INTERVAL_MS // 2)
    assert store.append(key(3), AvatarMessage(text="c")).swept == 0  # due: ran, none expired
    clock.advance(SWEEP_INTERVAL_MS // 2)  # keys 1 and 2 are past their deadline now
    assert store.append(key(3), AvatarMessage(text="d")).swept == 0  # not due yet
    assert store.stats()["sessions"] == 3  # not accounted before a sweep ...
    assert store.context(key(1)).session_id is None  # ... but reads already treat it as gone
    clock.advance(SWEEP_INTERVAL_MS // 2)
    assert store.append(key(3), AvatarMessage(text="e")).swept == 2
    assert store.stats() == {"sessions": 1, "bytes": 3}
    assert [e.reason for e in store.events()].count(ReasonCode.EXPIRED) == 2


def test_pressure_sweeps_expired_sessions_before_evicting_live_ones(
    make_store: StoreMaker, backend: Any
) -> None:
    clock = Clock()
    conv = {"public_ttl_seconds": 5, "max_active_sessions": 2}
    store = make_store(backend, clock, conversation=conv)
    store.append(key(1), AvatarMessage(text="a"))
    clock.advance(4_500)
    store.append(key(2), AvatarMessage(text="b"))  # sweeps (due); next sweep not before +1 s
    clock.advance(500)  # key 1 expired, the periodic sweep is not due
    receipt = store.append(key(3), AvatarMessage(text="c"))  # the partition is full
    assert (receipt.swept, receipt.evicted) == (1, 0)
    assert store.context(key(2)).session_id is not None  # the live session stayed
    assert store.stats() == {"sessions": 2, "bytes": 2}


def test_every_key_of_a_session_gets_a_bounded_ttl_even_when_recreated(
    make_store: StoreMaker, backend: Any
) -> None:
    store = make_store(backend, Clock(), conversation={"public_ttl_seconds": 2})
    k = key(1)
    client = backend.sync_client()
    sk = store.core.partition_for(k).session(k.member)
    store.append(k, AvatarMessage(text="one"))
    for redis_key in (sk.session, sk.turns, sk.turn_ids):
        assert 0 < client.pttl(redis_key) <= 2_000 + EXPIRY_GRACE_MS
    # A compaction that folds every turn leaves no list; the next append creates it again
    # and must give it a TTL at once, not at the next periodic refresh.
    client.delete(sk.turns)
    store.append(k, AvatarMessage(text="two"))
    assert 0 < client.pttl(sk.turns) <= 2_000 + EXPIRY_GRACE_MS
    assert [t.seq for t in store.context(k).turns] == [2]
