"""Which entry a full per-process cache gives up: one chosen at random, not the oldest.

memtier's decode caches (:class:`~memtier.threads.historycache.HistoryCache`,
:class:`~memtier.threads.servedrows.ServedRows`,
:class:`~memtier.memory.contextdecode.ReadCache`) each keep a bounded number of
conversations.  A worker commonly serves its conversations in turn, and a cache that
drops the least recently used conversation then drops, every time, the one it needs
next: with one conversation more than fit, nothing ever hits (measured: the client CPU
of a threads ``continue`` x2.2 once 200 threads' histories passed the history cache's
byte bound, ``python -m bench.threadsprobe --prefill 60``).  Dropping one at random
keeps about as many hits as fit in that case, and under skewed access (a few hot
conversations, a long tail) hits about 5 points less often than LRU, because a hot entry
that is dropped comes back at its next use (``python -m bench.evictionsim``;
docs/performance.md, "The caches under rotation").

The choice costs one pass over the keys (the caches hold at most a few hundred) and is
made only when an entry must go.  The generator is seeded per cache, so a test of the
bounds sees the same choices every run.
"""

from __future__ import annotations

import random
from collections.abc import MutableMapping
from typing import Final, TypeVar

__all__ = ["SEED", "evict_random"]

K = TypeVar("K")
V = TypeVar("V")

SEED: Final = 0x6D656D74  # each cache's generator starts here (tests see fixed choices)


def evict_random(
    entries: MutableMapping[K, V], rng: random.Random, spare: K | None = None
) -> tuple[K, V]:
    """Remove and return one entry of ``entries`` (not empty), chosen by ``rng``; never
    ``spare`` (the entry just added) while any other is left."""
    keys = list(entries)
    if len(keys) > 1 and spare is not None:
        keys = [k for k in keys if k != spare]
    victim = keys[rng.randrange(len(keys))]
    return victim, entries.pop(victim)
