"""D8: what a step of the Redis server clock does to an inactivity TTL, exactly.

memtier's TTL clock is ``max(server TIME, the partition's high-water mark)``:
never decreasing, so a backwards step can neither expire a session early nor
reorder turns.  The price is that the clock stands still until the server clock
catches up: a backwards step of S keeps a session alive for up to TTL + S of
real time.  A forward step of S ends sessions early by S.  These tests pin both
bounds (README, "Time"), so the documentation cannot drift from the behaviour.
"""

from __future__ import annotations

from typing import Any

import memfixtures
from memhelpers import Clock, StoreMaker, key

from memtier import AvatarMessage

# The store tests run on the sync and on the asyncio store (issue 13): ids [sync-fake], ...
make_store = memfixtures.make_store

MINUTE = 60_000
TTL_MIN = 30  # the public channel's inactivity TTL


def test_a_backwards_step_lengthens_a_ttl_by_at_most_the_step(
    make_store: StoreMaker, backend: Any
) -> None:
    clock = Clock()
    store = make_store(backend, clock)
    k = key(1)
    first = store.append(k, AvatarMessage(text="before the step"))
    step = 60 * MINUTE
    clock.advance(-step)  # NTP steps the server clock back an hour
    # Real time passes: TTL + step - 1 minute later the session is still there ...
    clock.advance(TTL_MIN * MINUTE + step - MINUTE)
    assert store.context(k).session_id == first.session_id
    # ... and TTL + step later (the true bound) it is gone, not a millisecond later.
    clock.advance(MINUTE)
    assert store.context(k).session_id is None
    assert store.append(k, AvatarMessage(text="after")).rotated


def test_a_forward_step_shortens_a_ttl_by_the_step(make_store: StoreMaker, backend: Any) -> None:
    clock = Clock()
    store = make_store(backend, clock)
    k = key(2)
    first = store.append(k, AvatarMessage(text="before the step"))
    clock.advance(10 * MINUTE)  # the server clock jumps 10 minutes ahead
    clock.advance((TTL_MIN - 10) * MINUTE - 1)  # 20 real minutes later: 1 ms left
    assert store.context(k).session_id == first.session_id
    clock.advance(1)
    assert store.context(k).session_id is None
