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
    """A path prefix a claim handed out: its ``entries``, root first, in the thread
    incarnation ``inc``; ``size`` their stored bytes; ``last_id`` the path id of the last;
    ``text_bytes`` the length of the path ids joined by single spaces, in UTF-8 (where the
    last ends in the path cache's text: ``run_claim`` checks it there).  One tuple of
    entries and no more: a claim extends it by its new entries, and each O(path) copy
    touches every entry object of a path of up to 2,000."""

    inc: str
    entries: tuple[ConversationEntry, ...]
    size: int
    last_id: str
    text_bytes: int


# No prefix (keep the whole path).  text_bytes -1: the first id adds no space before it.
_EMPTY: Final = KnownHistory("", (), 0, "", -1)


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
        self._keep(thread_key, inc, _EMPTY, ids, entries, sizes)

    def extend(
        self,
        thread_key: str,
        prefix: KnownHistory,
        ids: Sequence[str],
        entries: Sequence[ConversationEntry],
        sizes: Sequence[int],
    ) -> tuple[ConversationEntry, ...]:
        """:meth:`keep` of ``prefix`` (what :meth:`known` handed out, the path's start)
        followed by ``ids`` -> ``entries``, in ``prefix``'s incarnation.  The same as
        keeping the whole path, at the cost of the new entries only: a claim on a long
        thread adds two entries to a path of up to 2,000, and walking all of them again
        in Python took ~0.15 us an entry on every continue.  Returns the entries kept:
        ``prefix.entries`` and then as many of ``entries`` as fit."""
        return self._keep(thread_key, prefix.inc, prefix, ids, entries, sizes)

    def _keep(
        self,
        thread_key: str,
        inc: str,
        prefix: KnownHistory,
        ids: Sequence[str],
        entries: Sequence[ConversationEntry],
        sizes: Sequence[int],
    ) -> tuple[ConversationEntry, ...]:
        if not inc:
            self.forget(thread_key)
            return ()
        # The prefix fit within MAX_THREAD_BYTES entry by entry (its size is their sum):
        # counting on from its size stops where counting the whole path would.
        n, size = 0, prefix.size
        for entry_size in sizes[: len(entries)]:
            if size + entry_size > MAX_THREAD_BYTES:
                break
            size += entry_size
            n += 1
        if n == 0:
            kept = prefix
        else:
            added = ids[:n]
            kept = KnownHistory(
                inc,
                prefix.entries + tuple(entries[:n]),
                size,
                added[-1],
                prefix.text_bytes + sum(len(i.encode()) + 1 for i in added),
            )
        with self._lock:
            old = self._threads.pop(thread_key, None)
            if old is not None:
                self._bytes -= old.size
            if not kept.entries:
                return ()
            self._threads[thread_key] = kept
            self._bytes += size
            while self._bytes > MAX_BYTES or len(self._threads) > MAX_THREADS:
                _, dropped = evict_random(self._threads, self._rng, spare=thread_key)
                self._bytes -= dropped.size
        return kept.entries

    def forget(self, thread_key: str) -> None:
        with self._lock:
            old = self._threads.pop(thread_key, None)
            if old is not None:
                self._bytes -= old.size

    def stats(self) -> tuple[int, int]:
        """(thread keys kept, entry bytes kept): for tests of the bounds."""
        with self._lock:
            return len(self._threads), self._bytes
