"""The context read's session check as plain commands: what ``context_head`` computes,
from the values it reads, in Python.

``lua/memory/context_head-2.lua`` reads the session's head fields (``HMGET``), the
server clock (``TIME``, or the test clock) and the partition's clock high-water mark
(``HGET``), and decides whether the session is live.  Sent as those three commands
inside the read's ``MULTI`` / ``EXEC`` (:class:`~memtier.engine.PlainHead`), the reads
are exactly as atomic -- nothing else runs between them -- and Redis spends a quarter
of the time on them (no script: ``bench.readserver``).  :func:`fold_head` is the
script's decision over those replies, returning the script's own reply; the two are
compared on real Redis over generated session states
(tests/memory/test_context_head_plain.py).

One difference, on data memtier never writes: a ``last`` or a clock mark that is not
a decimal integer (the script fails on most of them mid-script, and Lua's ``tonumber``
takes a few others -- ``"1.5"``, ``" 7"``, ``"0x10"``) is a
:class:`~memtier.errors.ScriptError` naming the session here, never another verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from memtier.engine import PlainHead, ReadCommand
from memtier.errors import ScriptError

__all__ = ["HEAD_FIELDS", "fold_head", "plain_head"]

# The session hash fields context_head reads, in its HMGET order: what the verdict and a
# context need (the session's other fields are not part of a context).
HEAD_FIELDS: Final = ("id", "last", "summary")
_NOT_FOUND: Final = (-1,)


def plain_head(session: str, meta: str, ttl_ms: int, clock_override: str) -> PlainHead:
    """The session check of ``session`` (its partition's ``meta`` hash) as commands:
    ``HMGET`` of the head fields, ``TIME`` (left out under a test clock), ``HGET`` of
    the clock high-water mark."""
    commands: tuple[ReadCommand, ...] = (
        ("HMGET", session, *HEAD_FIELDS),
        *((("TIME",),) if clock_override == "" else ()),
        ("HGET", meta, "clock"),
    )
    override = None if clock_override == "" else int(clock_override)
    return PlainHead(commands, lambda replies: fold_head(ttl_ms, override, replies))


def _number(value: Any, session: Any) -> int:
    """A clock value as the script's ``tonumber`` reads what memtier writes (decimal
    digits, maybe signed); anything else is a ScriptError naming the session."""
    text = value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
    digits = text[1:] if text[:1] == "-" else text
    if not (digits.isascii() and digits.isdigit()):
        raise ScriptError(
            f"context_head: session {session!r} has a malformed clock value {text[:32]!r}",
            script="context_head",
        )
    return int(text)


def fold_head(ttl_ms: int, override: int | None, replies: Sequence[Any]) -> Any:
    """``context_head``'s reply from the replies of :func:`plain_head`'s commands:
    ``[0, sid, summary]`` for a live session, ``[-1]`` for an absent or expired one."""
    head = replies[0]
    if not isinstance(head, list) or len(head) != len(HEAD_FIELDS):
        raise ScriptError("context_head: malformed HMGET reply", script="context_head")
    sid, last_raw, summary = head
    if sid is None or last_raw is None:
        return [*_NOT_FOUND]
    if override is None:
        seconds, micros = replies[1]
        wall = int(seconds) * 1000 + int(micros) // 1000
        hwm_raw = replies[2]
    else:
        wall = override
        hwm_raw = replies[1]
    # memtier_clock(meta, override, false): the clock never runs behind its high-water mark
    now = wall if hwm_raw is None else max(wall, _number(hwm_raw, sid))
    if now >= _number(last_raw, sid) + ttl_ms:
        return [*_NOT_FOUND]
    return [0, sid, b"" if summary is None else summary]
