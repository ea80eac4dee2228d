"""What each thread's last claim handed its runner: the history path, decoded, by thread.

A continue hands the runner the whole history along its branch.  Sending and decoding
every entry on every claim grew with the thread, turn after turn (``run_claim`` spent
~5 us of Redis time per history entry here, and decoding one into a
:class:`ConversationEntry` ~4.5 us), although a thread's next turn on the same branch
sees the same entries plus its own two.  :class:`HistoryCache` (one per service) keeps,
per thread key, the path its last claim handed out: the thread's incarnation (``inc``,
set by ``run_claim``) and the decoded entries root first.  The next claim names the
incarnation, how many path entries it holds, the id of the last one and where it ends
in the path's text; when the thread's path has that id at that place in that
incarnation, ``run_claim`` sends only the ids and entries after it.  A successful commit
adds the turn's own two entries to the path it continued (``turns._keep_own_entries``),
as ``run_commit`` adds their ids to the path's text: a process's next turn on the branch
is sent nothing.  When the turn is on
another branch (a regenerated or edited turn: ``leaf_id``), ``run_claim`` finds the last
entry both paths share and says how many of the held entries that is: the claim keeps
that :meth:`KnownHistory.prefix` and is sent only what follows the fork.  That is exact
because entries never change once written and never change parent, so a path prefix
ending at a given entry is the same for the life of the thread; a thread deleted and
created again under the same id has a new incarnation (its entry ids start again), so an
old cache never matches it.

Bounded in code: :data:`MAX_THREADS` thread keys, :data:`MAX_BYTES` of entry bytes in
all -- or what the config's ``[threads]`` ``history_cache_threads`` /
``history_cache_bytes`` set, up to their ceilings in :mod:`memtier.limits` -- (a path
longer than :data:`MAX_THREAD_BYTES` keeps only its prefix within it); past a
bound, threads other than the one just claimed are dropped at random
(:mod:`memtier.eviction`: a service that takes its threads in turn would otherwise drop
each one just before its next claim).  It holds only what the replies held (stored,
redacted content).
"""

from __future__ import annotations

import random
import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from memtier import limits
from memtier.eviction import SEED, evict_random
from memtier.threads.models import ConversationEntry

__all__ = ["MAX_BYTES", "MAX_THREADS", "MAX_THREAD_BYTES", "HistoryCache", "KnownHistory"]

# Defaults of a cache made without bounds (the config's defaults: memtier.limits).
MAX_THREADS: Final = int(limits.HISTORY_CACHE_THREADS.default)  # thread keys kept
MAX_BYTES: Final = int(limits.HISTORY_CACHE_BYTES.default)  # entry bytes kept in all
MAX_THREAD_BYTES: Final = 2 * 2**20  # entry bytes kept of one thread's path (its prefix)


@dataclass(frozen=True, slots=True)
class KnownHistory:
    """A path prefix a claim handed out: its ``entries``, root first, in the thread
    incarnation ``inc``; ``last_id`` the path id of the last; after each entry, the
    stored bytes of the entries so far (``sizes``) and the length of their path ids
    joined by single spaces, in UTF-8 (``ends``: where that id ends in the path cache's
    text, which ``run_claim`` checks) -- running sums, as machine integers: a copy is one
    memcpy, and :meth:`prefix` reads any entry's in O(1).  One tuple of entries and no
    more: a claim extends it by its new entries, and each O(path) copy of a tuple touches
    every entry object of a path of up to 2,000."""

    inc: str
    entries: tuple[ConversationEntry, ...]
    last_id: str
    sizes: array[int]
    ends: array[int]

    @property
    def size(self) -> int:
        """Stored bytes of all its entries."""
        return self.sizes[-1] if self.sizes else 0

    @property
    def text_bytes(self) -> int:
        """Where its last id ends in the path's text (-1 for none: the first id adds no
        space before it)."""
        return self.ends[-1] if self.ends else -1

    def prefix(self, n: int) -> KnownHistory:
        """Its first ``n`` entries (1 <= n <= len(entries)): what a claim on another branch
        says the two paths share.  The last one's id is its entry's own (the path id it
        was stored under: a mismatch only makes the next claim send the whole path)."""
        return KnownHistory(
            self.inc, self.entries[:n], self.entries[n - 1].id, self.sizes[:n], self.ends[:n]
        )


_EMPTY: Final = KnownHistory("", (), "", array("q"), array("q"))  # no prefix: the whole path


class HistoryCache:
    """Per thread key: the last path prefix handed out (see the module docstring)."""

    def __init__(self, max_bytes: int | None = None, max_threads: int | None = None) -> None:
        """Bounds: ``max_bytes`` of entries and ``max_threads`` thread keys in all (None:
        :data:`MAX_BYTES` / :data:`MAX_THREADS`; 0 keeps nothing)."""
        self._max_bytes = MAX_BYTES if max_bytes is None else max_bytes
        self._max_threads = MAX_THREADS if max_threads is None else max_threads
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
        in Python took ~0.15 us an entry on every continue.  Returns the path's entries
        within the per-thread bound: ``prefix.entries`` and then as many of ``entries`` as
        fit (also when the cache's own bounds then dropped them: ``max_bytes`` below one
        thread's path, or 0)."""
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
        size, text = prefix.size, prefix.text_bytes
        sums, ends = array("q"), array("q")
        for entry_id, entry_size in zip(ids, sizes[: len(entries)], strict=False):
            if size + entry_size > MAX_THREAD_BYTES:
                break
            size += entry_size
            text += len(entry_id.encode()) + 1
            sums.append(size)
            ends.append(text)
        n = len(sums)
        if n == 0:
            kept = prefix
        else:
            kept = KnownHistory(
                inc,
                prefix.entries + tuple(entries[:n]),
                ids[n - 1],
                prefix.sizes + sums,
                prefix.ends + ends,
            )
        with self._lock:
            old = self._threads.pop(thread_key, None)
            if old is not None:
                self._bytes -= old.size
            if not kept.entries:
                return ()
            self._threads[thread_key] = kept
            self._bytes += size
            while self._bytes > self._max_bytes or len(self._threads) > self._max_threads:
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
