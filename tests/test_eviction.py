"""memtier.eviction: one entry goes, at random, never the one just added while others
are left; the same seed makes the same choices."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from memtier.eviction import SEED, evict_random


@given(
    keys=st.lists(st.integers(0, 50), min_size=1, max_size=30, unique=True),
    spare_at=st.integers(-1, 40),
    seed=st.integers(0, 2**32),
)
def test_one_entry_goes_and_never_the_spare_while_others_are_left(
    keys: list[int], spare_at: int, seed: int
) -> None:
    entries = {k: f"v{k}" for k in keys}
    spare = keys[spare_at] if 0 <= spare_at < len(keys) else None
    before = dict(entries)
    victim, value = evict_random(entries, random.Random(seed), spare=spare)
    assert value == before[victim] and victim not in entries
    assert entries == {k: v for k, v in before.items() if k != victim}
    if len(before) > 1:
        assert victim != spare


def test_the_same_seed_makes_the_same_choices() -> None:
    def choices() -> list[int]:
        rng, entries, out = random.Random(SEED), {k: k for k in range(100)}, []
        while entries:
            out.append(evict_random(entries, rng)[0])
        return out

    first = choices()
    assert first == choices() and sorted(first) == list(range(100))
    assert first != list(range(100))  # not in insertion (age) order
