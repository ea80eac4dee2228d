"""Hit rates of a bounded cache dropping the least recently used entry or a random one.

``python -m bench.evictionsim [--steps N]``

No Redis, no memtier cache: a model of one (a dict of keys, ``slots`` of them at most),
fed three access patterns, each with the same seeded generator for both policies:

* ``rotation``: ``keys`` conversations served in turn (a worker taking its threads or
  sessions one after another), one more than fit or more;
* ``zipf``: 2,000 conversations, the i-th used with weight 1/i (a few hot, a long tail);
* ``rotation+noise``: the rotation, one access in ten to one of 5,000 others.

The random policy is :func:`memtier.eviction.evict_random` itself.  docs/performance.md
("The caches under rotation") cites the table this prints.
"""

from __future__ import annotations

import argparse
import random
from collections import OrderedDict
from collections.abc import Callable, Iterator

from memtier.eviction import SEED, evict_random

__all__ = ["hit_rate", "main"]

Pattern = Callable[[random.Random], Iterator[int]]


def rotation(keys: int) -> Pattern:
    def accesses(_: random.Random) -> Iterator[int]:
        n = 0
        while True:
            yield n % keys
            n += 1

    return accesses


def zipf(keys: int) -> Pattern:
    weights = [1 / (i + 1) for i in range(keys)]

    def accesses(rng: random.Random) -> Iterator[int]:
        while True:
            yield from rng.choices(range(keys), weights, k=1000)

    return accesses


def rotation_with_noise(keys: int) -> Pattern:
    def accesses(rng: random.Random) -> Iterator[int]:
        n = 0
        while True:
            yield n % keys if rng.random() < 0.9 else keys + rng.randrange(5000)
            n += 1

    return accesses


def hit_rate(policy: str, slots: int, pattern: Pattern, steps: int) -> float:
    """Hits / accesses of a cache of ``slots`` entries under ``policy`` ("lru" | "random")."""
    cache: OrderedDict[int, None] = OrderedDict()
    rng, accesses = random.Random(SEED), pattern(random.Random(7))
    hits = 0
    for _ in range(steps):
        key = next(accesses)
        if key in cache:
            hits += 1
            cache.move_to_end(key)
            continue
        cache[key] = None
        if len(cache) > slots:
            if policy == "lru":
                cache.popitem(last=False)
            else:
                evict_random(cache, rng, spare=key)
    return hits / steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.evictionsim", description=__doc__)
    p.add_argument("--steps", type=int, default=100_000)
    args = p.parse_args(argv)
    print("| pattern | slots | LRU hit rate | random hit rate |")
    print("|---|---:|---:|---:|")
    for name, pattern in (
        ("rotation of 200", rotation(200)),
        ("rotation of 200, 10 % noise", rotation_with_noise(200)),
        ("zipf over 2,000", zipf(2000)),
    ):
        for slots in (100, 148, 190):
            lru = hit_rate("lru", slots, pattern, args.steps)
            rnd = hit_rate("random", slots, pattern, args.steps)
            print(f"| {name} | {slots} | {lru:.3f} | {rnd:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
