"""What the ledger's rows were served as, per thread, looked up by the rows' exact data.

Replay and export redact every row again on the way out (a row written by hand or by an
older version is never served as it is): ~60-150 us a row of 300 B, against a few us for
everything else, and a ledger is read again and again (a client polling a running turn,
a page refreshed, an export).  :class:`ServedRows` (one per service) remembers, per
thread key, what each row's data JSON was served as -- the JSON of the redacted payload,
or "not servable" -- keyed by the stored data string itself.  The redaction on read is a
pure function of that string (deterministic, no clock, no configuration after start), so
a row found here is served exactly as the full redactor would serve it; a row changed in
Redis has another data string and goes through the redactor again.  Nothing is skipped:
this is the same computation, done once per distinct row per process.

Bounded in code: :data:`MAX_THREADS` thread keys, :data:`MAX_BYTES` of rows (data and
served JSON) in all, :data:`MAX_ROWS_PER_THREAD` rows per thread (its memo starts over
beyond), rows of more than :data:`MAX_ROW_BYTES` never kept; past a bound, threads
other than the one being read are dropped at random (:mod:`memtier.eviction`: readers
that poll many threads in turn would otherwise drop each one just before its next read).
It holds only what the ledger held (stored, redacted rows) and their served form.
"""

from __future__ import annotations

import random
import threading
from typing import Final

from memtier.eviction import SEED, evict_random

__all__ = [
    "MAX_BYTES",
    "MAX_ROWS_PER_THREAD",
    "MAX_ROW_BYTES",
    "MAX_THREADS",
    "NOT_SERVABLE",
    "ServedRows",
]

MAX_THREADS: Final = 256  # thread keys kept (past it, one other than the one read goes)
MAX_BYTES: Final = 8 * 2**20  # row data (characters) + served JSON (bytes) kept in all
MAX_ROWS_PER_THREAD: Final = 4_000  # a thread's memo starts over beyond this
MAX_ROW_BYTES: Final = 16 * 2**10  # a longer row (characters) is redacted each time, never kept
NOT_SERVABLE: Final = b""  # the memo's value for a row that is never served


class ServedRows:
    """Per thread key: stored row data -> its served JSON (or :data:`NOT_SERVABLE`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: dict[str, tuple[dict[str, bytes], list[int]]] = {}
        self._bytes = 0
        self._rng = random.Random(SEED)

    def memo(self, thread_key: str) -> dict[str, bytes]:
        """The thread's memo (new if none): look rows up and add them with :meth:`keep`."""
        with self._lock:
            held = self._threads.get(thread_key)
            if held is None or len(held[0]) >= MAX_ROWS_PER_THREAD:
                if held is not None:
                    self._bytes -= held[1][0]
                held = ({}, [0])
                self._threads[thread_key] = held
            while len(self._threads) > MAX_THREADS:
                _, (_, dropped) = evict_random(self._threads, self._rng, spare=thread_key)
                self._bytes -= dropped[0]
            return held[0]

    def keep(self, thread_key: str, memo: dict[str, bytes], data: str, served: bytes) -> None:
        """Remember one row of ``thread_key`` (``memo`` is what :meth:`memo` returned)."""
        size = len(data) + len(served)
        if len(data) > MAX_ROW_BYTES or data in memo:
            return
        with self._lock:
            held = self._threads.get(thread_key)
            if held is None or held[0] is not memo:
                return  # dropped or started over meanwhile: this memo is no longer kept
            memo[data] = served
            held[1][0] += size
            self._bytes += size
            while self._bytes > MAX_BYTES and self._threads:
                _, (_, dropped) = evict_random(self._threads, self._rng, spare=thread_key)
                self._bytes -= dropped[0]

    def stats(self) -> tuple[int, int]:
        """(thread keys kept, bytes kept): for tests of the bounds."""
        with self._lock:
            return len(self._threads), self._bytes
