"""What each thread's last claim decoded its history to, looked up by the entries' exact bytes.

A continue hands the runner the whole history along its branch, and ``run_claim`` answers
it as entry JSON: decoding every entry into a :class:`ConversationEntry` (~4.5 us each)
grew with the thread, turn after turn, although a thread's next turn sees the same
entries plus its own two.  :class:`HistoryCache` (one per service) keeps, per thread
key, the entries its last claim decoded, by their stored bytes: decoding is a pure
function of those bytes and the models are frozen, so an entry found here is the one
:func:`entry_from_json` would build.  Nothing is trusted beyond that: a stored entry
changed by hand has other bytes and is decoded again; a missing entry still fails as
before (the caller checks ``None`` first).

Bounded in code: :data:`MAX_THREADS` thread keys, :data:`MAX_BYTES` of entry bytes in
all, entries above :data:`MAX_ENTRY_BYTES` never kept; the least recently claimed thread
is dropped first.  It holds only what the replies held (stored, redacted content).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Final

from memtier.threads.models import ConversationEntry
from memtier.threads.records import entry_from_json

__all__ = ["MAX_BYTES", "MAX_ENTRY_BYTES", "MAX_THREADS", "HistoryCache"]

MAX_THREADS: Final = 256  # thread keys kept (least recently claimed dropped first)
MAX_BYTES: Final = 8 * 2**20  # entry bytes kept in all (plus the models decoded from them)
MAX_ENTRY_BYTES: Final = 16 * 2**10  # a longer entry is decoded each time, never kept


class HistoryCache:
    """Per thread key: stored entry bytes -> the :class:`ConversationEntry` they decode to."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: OrderedDict[str, tuple[dict[bytes, ConversationEntry], int]] = OrderedDict()
        self._bytes = 0

    def decode(self, thread_key: str, values: Sequence[bytes | str]) -> list[ConversationEntry]:
        """``values`` (entry JSON, none ``None``) decoded, reusing the thread's last decode;
        the thread's entry becomes what this call decoded (within the bounds)."""
        with self._lock:
            held = self._threads.get(thread_key)
        known = held[0] if held is not None else {}
        kept: dict[bytes, ConversationEntry] = {}
        size = 0
        out: list[ConversationEntry] = []
        for value in values:
            raw = value.encode() if isinstance(value, str) else value
            entry = known.get(raw)
            if entry is None:
                entry = entry_from_json(raw)
            if len(raw) <= MAX_ENTRY_BYTES:
                kept[raw] = entry
                size += len(raw)
            out.append(entry)
        with self._lock:
            old = self._threads.pop(thread_key, None)
            if old is not None:
                self._bytes -= old[1]
            if size <= MAX_BYTES:
                self._threads[thread_key] = (kept, size)
                self._bytes += size
                while self._bytes > MAX_BYTES or len(self._threads) > MAX_THREADS:
                    _, (_, dropped) = self._threads.popitem(last=False)
                    self._bytes -= dropped
        return out

    def stats(self) -> tuple[int, int]:
        """(thread keys kept, entry bytes kept): for tests of the bounds."""
        with self._lock:
            return len(self._threads), self._bytes
