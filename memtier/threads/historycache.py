"""What each thread's last claim handed its runner: the history path, decoded, by thread.

A continue hands the runner the whole history along its branch.  Sending and decoding
every entry on every claim grew with the thread, turn after turn (``run_claim`` spent
~5 us of Redis time per history entry here, and decoding one into a
:class:`ConversationEntry` ~4.5 us), although a thread's next turn on the same branch
sees the same entries plus its own two.  :class:`HistoryCache` (one per service) keeps,
per thread key, the path its last claim handed out: the thread's incarnation (``inc``,
set by ``run_claim``), the entry ids root first and their decoded entries.  The next
claim names the incarnation, how many path entries it holds and the id of the last one;
when the thread's path has that id at that place in that incarnation, ``run_claim``
sends only the ids and entries after it.  That is exact because entries never change
once written and never change parent, so a path prefix ending at a given entry is the
same for the life of the thread; a thread deleted and created again under the same id
has a new incarnation (its entry ids start again), so an old cache never matches it.

Bounded in code: :data:`MAX_THREADS` thread keys, :data:`MAX_BYTES` of entry bytes in
all (a path longer than :data:`MAX_THREAD_BYTES` keeps only its prefix within it); past a
bound, threads other than the one just claimed are dropped at random
(:mod:`memtier.eviction`: a service that takes its threads in turn would otherwise drop
each one just before its next claim).  It holds only what the replies held (stored,
redacted content).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from memtier.eviction import SEED, evict_random
from memtier.threads.models import ConversationEntry

__all__ = ["MAX_BYTES", "MAX_THREADS", "MAX_THREAD_BYTES", "HistoryCache", "KnownHistory"]

MAX_THREADS: Final = 256  # thread keys kept (past it, one other than the newest goes)
MAX_BYTES: Final = 8 * 2**20  # entry bytes kept in all (plus the models decoded from them)
MAX_THREAD_BYTES: Final = 2 * 2**20  # entry bytes kept of one thread's path (its prefix)


@dataclass(frozen=True, slots=True)
class KnownHistory:
    """A path prefix a claim handed out: ``entries[i]`` is the entry ``ids[i]``, root
    first, in the thread incarnation ``inc``; ``sizes[i]`` its stored bytes (``size``:
    their sum)."""

    inc: str
    ids: tuple[str, ...]
    entries: tuple[ConversationEntry, ...]
    sizes: tuple[int, ...]
    size: int


class HistoryCache:
    """Per thread key: the last path prefix handed out (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: dict[str, KnownHistory] = {}
        self._bytes = 0
        self._rng = random.Random(SEED)

    def known(self, thread_key: str) -> KnownHistory | None:
        """The thread's kept path, or None (what the next claim names)."""
        with self._lock:
            return self._threads.get(thread_key)

    def keep(
        self,
        thread_key: str,
        inc: str,
        ids: Sequence[str],
        entries: Sequence[ConversationEntry],
        sizes: Sequence[int],
    ) -> None:
        """Keep the path ``ids`` -> ``entries`` (``sizes``: stored bytes of each; as many
        as there are entries, a prefix of ``ids``) for the thread, within the bounds."""
        if not inc:
            self.forget(thread_key)
            return
        n, size = 0, 0
        for entry_size in sizes[: len(entries)]:
            if size + entry_size > MAX_THREAD_BYTES:
                break
            size += entry_size
            n += 1
        kept = KnownHistory(inc, tuple(ids[:n]), tuple(entries[:n]), tuple(sizes[:n]), size)
        with self._lock:
            old = self._threads.pop(thread_key, None)
            if old is not None:
                self._bytes -= old.size
            if n == 0:
                return
            self._threads[thread_key] = kept
            self._bytes += size
            while self._bytes > MAX_BYTES or len(self._threads) > MAX_THREADS:
                _, dropped = evict_random(self._threads, self._rng, spare=thread_key)
                self._bytes -= dropped.size

    def forget(self, thread_key: str) -> None:
        with self._lock:
            old = self._threads.pop(thread_key, None)
            if old is not None:
                self._bytes -= old.size

    def stats(self) -> tuple[int, int]:
        """(thread keys kept, entry bytes kept): for tests of the bounds."""
        with self._lock:
            return len(self._threads), self._bytes
