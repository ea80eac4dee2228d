"""The context read's client side: the records of one ``LRANGE`` to turns and messages.

:meth:`~memtier.memory.core.MemoryCore.decode_context` runs once per context read and
turns every record twice into a model (the :class:`TurnRecord` and its
:class:`ContextMessage`).  :func:`decode_turns` does both in one pass over the records,
for the shape ``append_turn`` writes today (records of the current format, see
:mod:`memtier.memory.turncodec`), and inlines what the general path spends on calls:

* the models are built like :func:`~memtier.memory.models.trusted` builds them (no
  validation: every value is checked or converted to its declared type here), with the
  slot setters bound once and the fields set copied from a prebuilt one;
* a conversation is read again and again with the same 19 of its 20 turns, so the
  models the records of a key's last read decoded to are kept (:class:`ReadCache`, one
  per store, bounded) and looked up by each record's exact bytes (found by the record's
  first bytes -- its seq and clocks, unique within a read -- then compared whole:
  hashing a whole 4 KiB record costs ~0.7 us, twenty of them more than the rest of a
  cached read).  The models are a pure function of those bytes and immutable (frozen;
  a record's ``fields`` is a :class:`~memtier.memory.models.FrozenFields`), so the next
  read of the same record hands out the same instances and no caller can change what
  another read returns.  The cache holds only what the last reply of the key held
  (stored, already redacted content); a read that finds the session expired or gone, a
  drop and a pop of the key drop its entry;
* the untrusted-data wrapping takes the same fast path as
  :func:`~memtier.memory.delimiters.escape_delimiters` (ASCII text without ``<`` is
  returned unchanged by it), and otherwise calls it.

Anything else -- a record of the first format, a malformed record, a non-string reply
cell -- makes :func:`decode_turns` return None, and the caller takes the general path
(:func:`~memtier.memory.turncodec.decode_record` per record, then ``project``), which
decodes it or raises exactly as before.  So the fast path accepts a strict subset of
what the general path accepts and builds the same values (tests/memory/
test_context_fast_path.py compares both on records written by the real ``append_turn``
and on generated malformed ones).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Final

import orjson
from pydantic import BaseModel

from memtier.eviction import SEED, evict_random
from memtier.memory.delimiters import (
    UNTRUSTED_CLOSING,
    escape_delimiters,
    untrusted_opening,
)
from memtier.memory.models import ContextMessage, FrozenFields, Role, TurnRecord

__all__ = [
    "MAX_CACHED_CHARS",
    "MAX_CACHED_KEYS",
    "MAX_CACHED_TURNS",
    "ReadCache",
    "decode_turns",
]

# The slot setters of BaseModel's four instance slots (what ``trusted`` sets).
_SET_DICT: Final = BaseModel.__dict__["__dict__"].__set__
_SET_FIELDS_SET: Final = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_SET_EXTRA: Final = BaseModel.__dict__["__pydantic_extra__"].__set__
_SET_PRIVATE: Final = BaseModel.__dict__["__pydantic_private__"].__set__
_new: Final = object.__new__
_RECORD_FIELDS: Final = frozenset(TurnRecord.model_fields)
_MESSAGE_FIELDS: Final = frozenset(ContextMessage.model_fields)
_fromtimestamp: Final = datetime.fromtimestamp

# The read cache's hard bounds: the last read of at most MAX_CACHED_KEYS keys, holding at
# most MAX_CACHED_CHARS characters of records in all (past a bound, a key chosen at random
# goes: memtier.eviction); a read of more than MAX_CACHED_TURNS records is not kept.  In
# memory a record takes about three times its length with its decoded values (its text and
# its wrapped content), so the cache holds at most ~12 MiB; a context(20) of 300 B turns
# keeps ~21 KB.
MAX_CACHED_KEYS: Final = 256
MAX_CACHED_TURNS: Final = 64
MAX_CACHED_CHARS: Final = 4 * 1024 * 1024

# A decoded record: its TurnRecord and its ContextMessage (both immutable, shared by reads).
_Decoded = tuple[TurnRecord, ContextMessage]
# A cache entry, under the record's first _PREFIX characters: the whole record, and what
# it decoded to (a hit must equal the record whole).
_Entry = tuple[Any, TurnRecord, ContextMessage]
_PREFIX: Final = 48  # "seq|clock|wall|flags|..." and the payload's start: > the seq's digits


class ReadCache:
    """What the records of each key's last context read decoded to (see the module doc).

    Safe to share between threads (a lock guards the bookkeeping; a lost race costs a
    decode, never a wrong value: an entry is a pure function of the record bytes it is
    looked up by).
    """

    __slots__ = ("_chars", "_keys", "_lock", "_max_keys", "_rng")

    def __init__(self, max_keys: int = MAX_CACHED_KEYS) -> None:
        # At most MAX_CACHED_KEYS whatever is asked; 0 keeps nothing (every read decodes).
        self._max_keys = max(0, min(max_keys, MAX_CACHED_KEYS))
        self._keys: dict[str, tuple[int, dict[Any, _Entry]]] = {}
        self._chars = 0  # characters of the records held, over all keys
        self._lock = threading.Lock()
        self._rng = random.Random(SEED)

    def take(self, member: str) -> dict[Any, _Entry] | None:
        """The key's last read, removed (the caller keeps the new one)."""
        with self._lock:
            found = self._keys.pop(member, None)
            if found is None:
                return None
            self._chars -= found[0]
            return found[1]

    def keep(self, member: str, chars: int, decoded: dict[Any, _Entry]) -> None:
        """Keep ``decoded`` (records of ``chars`` characters) as ``member``'s last read."""
        if chars > MAX_CACHED_CHARS or self._max_keys == 0:
            return
        with self._lock:
            keys = self._keys
            old = keys.pop(member, None)
            if old is not None:
                self._chars -= old[0]
            while keys and (len(keys) >= self._max_keys or self._chars + chars > MAX_CACHED_CHARS):
                # at random, not the least recently read (see memtier.eviction)
                self._chars -= evict_random(keys, self._rng)[1][0]
            keys[member] = (chars, decoded)
            self._chars += chars

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def chars(self) -> int:
        """Characters of the records held (at most :data:`MAX_CACHED_CHARS`)."""
        return self._chars


_AVATAR_OPENING: Final = untrusted_opening("avatar")
# Enum members looked up once: ``Role.AVATAR`` costs a class-attribute lookup per turn.
_ROLE_AVATAR: Final = Role.AVATAR
_ROLE_AGENT: Final = Role.AGENT
_ROLE_TOOL: Final = Role.TOOL


def _wrapped(source_opening: str, text: str) -> str:
    # escape_delimiters returns ASCII text without "<" unchanged (its own first test).
    if "<" in text or not text.isascii():
        text = escape_delimiters(text)
    return source_opening + text + UNTRUSTED_CLOSING


def _decode(raw: Any) -> _Decoded | None:
    """One record of the current format's usual shape, decoded; None for anything else.
    May raise on a malformed record (the caller takes the general path then too)."""
    kind_of_raw = type(raw)
    if kind_of_raw is bytes:
        record = raw.decode("utf-8")
    elif kind_of_raw is str:
        record = raw
    else:
        return None
    parts = record.split("|", 5)
    if len(parts) != 6:
        return None
    body = orjson.loads(parts[5])
    if type(body) is not list or len(body) < 3:
        return None
    code = body[0]
    turn_id = body[1]
    first = body[2]
    if type(code) is not int or type(turn_id) is not str or type(first) is not str:
        return None
    if len(body) == 3:
        if code == 0:
            kind, role, fields = "avatar", _ROLE_AVATAR, {"text": first}
            content, untrusted = _wrapped(_AVATAR_OPENING, first), True
        elif code == 1:
            kind, role, fields = "agent", _ROLE_AGENT, {"text": first}
            content, untrusted = first, False
        else:
            return None
    elif len(body) == 4:
        second = body[3]
        if type(second) is not str:
            return None
        if code == 2:
            kind, role, fields = "tool", _ROLE_TOOL, {"tool": first, "summary": second}
            content = _wrapped(untrusted_opening("tool:" + first), second)
        elif code == 3:
            kind, role, fields = "action", _ROLE_TOOL, {"action": first, "outcome": second}
            content = _wrapped(untrusted_opening("action:" + first), second)
        else:
            return None
        untrusted = True
    else:
        return None
    clock = parts[1]
    turn = _new(TurnRecord)
    _SET_DICT(
        turn,
        {
            "seq": int(parts[0]),
            "timestamp": _fromtimestamp(int(parts[2] or clock) / 1000, UTC),
            "clock_ms": int(clock),
            "kind": kind,
            "role": role,
            "turn_id": turn_id,
            "fields": FrozenFields(fields),
        },
    )
    _SET_FIELDS_SET(turn, set(_RECORD_FIELDS))
    _SET_EXTRA(turn, None)
    _SET_PRIVATE(turn, None)
    message = _new(ContextMessage)
    _SET_DICT(
        message,
        {"role": "assistant" if code == 1 else "user", "content": content, "untrusted": untrusted},
    )
    _SET_FIELDS_SET(message, set(_MESSAGE_FIELDS))
    _SET_EXTRA(message, None)
    _SET_PRIVATE(message, None)
    return turn, message


def decode_turns(
    member: str, raws: Sequence[Any], cache: ReadCache
) -> tuple[tuple[TurnRecord, ...], list[ContextMessage]] | None:
    """The turns and their messages (no summary) of ``raws``, the records of ``member``'s
    read, or None when a record is not of the current format's usual shape (the caller
    then decodes the general way).  ``cache``: the store's :class:`ReadCache`."""
    previous = cache.take(member)
    kept: dict[Any, _Entry] = {}
    kept_chars = 0
    records: list[TurnRecord] = []
    messages: list[ContextMessage] = []
    add_record = records.append
    add_message = messages.append
    try:
        keep = len(raws) <= MAX_CACHED_TURNS
        for raw in raws:
            prefix = raw[:_PREFIX]
            entry = previous.get(prefix) if previous is not None else None
            if entry is None or entry[0] != raw:
                decoded = _decode(raw)
                if decoded is None:
                    return None
                entry = (raw, *decoded)
            if keep:
                kept[prefix] = entry
                kept_chars += len(raw)
            add_record(entry[1])
            add_message(entry[2])
    except Exception:
        return None
    if kept:
        cache.keep(member, kept_chars, kept)
    return tuple(records), messages
