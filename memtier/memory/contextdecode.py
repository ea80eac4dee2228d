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
  per store, bounded) with the records, position by position, and reused for the same
  record bytes: the whole read when the records are exactly the last read's (read again
  before the next turn); the run that continues the last read's records from one of
  them on (the window moved by the turns appended since); otherwise each record found
  by its first bytes -- its seq and clocks, unique within a read -- then compared whole
  (hashing a whole 4 KiB record costs ~0.7 us, twenty of them more than the rest of a
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
_PREFIX: Final = 48  # "seq|clock|wall|flags|..." and the payload's start: > the seq's digits


class _LastRead:
    """One key's last read: its records (a list, as the reply held them) and what each
    decoded to, position by position (immutable values, shared by reads)."""

    __slots__ = ("chars", "messages", "raws", "turns")

    def __init__(
        self,
        chars: int,
        raws: list[Any],
        turns: tuple[TurnRecord, ...],
        messages: tuple[ContextMessage, ...],
    ) -> None:
        self.chars = chars  # characters of the records
        self.raws = raws
        self.turns = turns
        self.messages = messages


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
        self._keys: dict[str, _LastRead] = {}
        self._chars = 0  # characters of the records held, over all keys
        self._lock = threading.Lock()
        self._rng = random.Random(SEED)

    def take(self, member: str) -> _LastRead | None:
        """The key's last read, removed (the caller keeps the new one)."""
        with self._lock:
            found = self._keys.pop(member, None)
            if found is None:
                return None
            self._chars -= found.chars
            return found

    def keep(self, member: str, last: _LastRead) -> None:
        """Keep ``last`` as ``member``'s last read."""
        chars = last.chars
        if chars > MAX_CACHED_CHARS or self._max_keys == 0:
            return
        with self._lock:
            keys = self._keys
            old = keys.pop(member, None)
            if old is not None:
                self._chars -= old.chars
            while keys and (len(keys) >= self._max_keys or self._chars + chars > MAX_CACHED_CHARS):
                # at random, not the least recently read (see memtier.eviction)
                self._chars -= evict_random(keys, self._rng)[1].chars
            keys[member] = last
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
) -> tuple[tuple[TurnRecord, ...], tuple[ContextMessage, ...]] | None:
    """The turns and their messages (no summary) of ``raws``, the records of ``member``'s
    read, or None when a record is not of the current format's usual shape (the caller
    then decodes the general way).  ``cache``: the store's :class:`ReadCache`.

    What the key's last read decoded is reused, in the cheapest way that applies: the
    same records (read again before the next turn: an agent's steps within one turn,
    another worker) are handed back whole, compared record by record (~0.1 us for 20);
    records that continue the last read's from one of its records on (the window moved
    by the turns appended since, or a smaller limit) reuse that run by position; any
    other read looks each record up by its first bytes, then compares it whole.
    """
    previous = cache.take(member)
    turns: tuple[TurnRecord, ...] = ()
    messages: tuple[ContextMessage, ...] = ()
    done = 0  # raws[:done] are the last read's records from `at` on
    old: list[Any] = []
    old_turns: tuple[TurnRecord, ...] = ()
    old_messages: tuple[ContextMessage, ...] = ()
    by_prefix: dict[Any, int] | None = None
    new_turns: list[TurnRecord] = []
    new_messages: list[ContextMessage] = []
    add_turn = new_turns.append
    add_message = new_messages.append
    try:
        if previous is not None and raws:
            old, old_turns, old_messages = previous.raws, previous.turns, previous.messages
            if old == raws:  # the same records: the same values
                cache.keep(member, previous)
                return old_turns, old_messages
            first = raws[0]
            # (not old.index's ValueError: its message holds the repr of the record)
            at = old.index(first) if first in old else -1
            if at >= 0:
                done = min(len(old) - at, len(raws))
                if raws[:done] == old[at : at + done]:
                    turns = old_turns[at : at + done]
                    messages = old_messages[at : at + done]
                else:
                    done = 0
            if done == 0:
                by_prefix = {raw[:_PREFIX]: i for i, raw in enumerate(old)}
        for raw in raws[done:]:
            if by_prefix is not None:
                i = by_prefix.get(raw[:_PREFIX])
                if i is not None and old[i] == raw:
                    add_turn(old_turns[i])
                    add_message(old_messages[i])
                    continue
            decoded = _decode(raw)
            if decoded is None:
                return None
            add_turn(decoded[0])
            add_message(decoded[1])
        if new_turns:
            turns += tuple(new_turns)
            messages += tuple(new_messages)
        if raws and len(raws) <= MAX_CACHED_TURNS:
            chars = sum(len(raw) for raw in raws)
            cache.keep(member, _LastRead(chars, list(raws), turns, messages))
    except Exception:
        return None
    return turns, messages
