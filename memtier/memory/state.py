"""Stored sessions as the workers see them: the raw turn record and the session hash, decoded.

Pure and I/O-free.  A turn record in the ``T:t:<member>`` list is decoded by
:mod:`memtier.memory.turncodec` (its one owner; re-exported here), and the session hash
``T:s:<member>`` holds ``id, created, created_wall, seq, turns, bytes, tools,
summary_bytes, last, last_wall``, optionally ``summary`` (JSON, see
:mod:`memtier.memory.compaction`), ``sv`` (summary version, absent = 0), ``cq`` (a
compaction job is queued) and the idempotency receipts ``r:<turn_id>``.

Compaction (one session) and snapshots (pages of sessions) both read sessions with
one Lua script per read, so a decoded :class:`SessionState` is always a consistent
point-in-time copy: never half of an append or of a compaction.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from memtier.errors import ScriptError
from memtier.memory.turncodec import (
    KIND_FIELDS,
    KIND_ROLES,
    UNTRUSTED_KINDS,
    StoredTurn,
    window_receipts,
)
from memtier.wire import text

__all__ = [
    "KIND_FIELDS",
    "KIND_ROLES",
    "UNTRUSTED_KINDS",
    "SessionState",
    "StoredTurn",
    "decode_session",
    "iter_sessions",
    "page_sessions",
]


@dataclass(frozen=True)
class SessionState:
    """A consistent point-in-time copy of one session, read by one script call."""

    member: str
    session_id: str
    created_ms: int
    created_wall_ms: int
    last_ms: int
    last_wall_ms: int
    seq: int
    turns: int
    nbytes: int
    tools: int
    summary_bytes: int
    summary_version: int
    summary: str | None
    records: tuple[StoredTurn, ...]
    receipts: Mapping[str, str] = field(default_factory=dict)
    compaction_queued: bool = False
    # The reading script's clock (non-decreasing, ms) and server wall time.
    read_clock_ms: int = 0
    read_wall_ms: int = 0

    @property
    def age_ms(self) -> int:
        """Inactivity at read time (clock domain of the session's partition)."""
        return max(0, self.read_clock_ms - self.last_ms)


def decode_session(
    member: str,
    hash_flat: Sequence[Any],
    records: Sequence[Any],
    *,
    read_clock_ms: int,
    read_wall_ms: int,
) -> SessionState:
    """Build a :class:`SessionState` from ``HGETALL`` output and the ``LRANGE`` of turns.

    Live data is written only by memtier's scripts; anything malformed is a bug or
    tampering and raises :class:`~memtier.errors.ScriptError`.
    """
    h: dict[str, str] = {}
    receipts: dict[str, str] = {}
    for i in range(0, len(hash_flat) - 1, 2):
        name, value = text(hash_flat[i]), text(hash_flat[i + 1])
        if name.startswith("r:"):
            receipts[name[2:]] = value
        else:
            h[name] = value
    try:
        parsed = tuple(StoredTurn.parse(r) for r in records)
        return SessionState(
            member=member,
            session_id=h["id"],
            created_ms=int(h["created"]),
            created_wall_ms=int(h["created_wall"]),
            last_ms=int(h.get("last", h["created"])),
            last_wall_ms=int(h.get("last_wall", h["created_wall"])),
            seq=int(h["seq"]),
            turns=int(h["turns"]),
            nbytes=int(h["bytes"]),
            tools=int(h["tools"]),
            summary_bytes=int(h.get("summary_bytes", "0")),
            summary_version=int(h.get("sv", "0")),
            summary=h.get("summary") or None,
            records=parsed,
            receipts=window_receipts(h["id"], parsed, receipts),
            compaction_queued="cq" in h,
            read_clock_ms=read_clock_ms,
            read_wall_ms=read_wall_ms,
        )
    except (KeyError, ValueError, orjson.JSONDecodeError) as exc:
        raise ScriptError(f"session {member!r} is malformed in Redis: {exc}") from exc


def page_sessions(
    reply: Sequence[Any],
) -> tuple[int, int, list[tuple[str, Sequence[Any], Sequence[Any]]]]:
    """The one walk over a ``snapshot_page`` / ``read_session`` reply (see their headers):
    its clock, wall time and, per session, (member, hash fields, records);
    :class:`ScriptError` for trailing data.

    Shape: ``{clock_ms, wall_ms, n_sessions, (member, n_fields, fields..., n_records,
    records...) * n_sessions}``.
    """
    clock, wall, count = int(reply[0]), int(reply[1]), int(reply[2])
    pos = 3
    out = []
    for _ in range(count):
        member = text(reply[pos])
        nfields = int(reply[pos + 1])
        flat = reply[pos + 2 : pos + 2 + nfields]
        pos += 2 + nfields
        nrec = int(reply[pos])
        recs = reply[pos + 1 : pos + 1 + nrec]
        pos += 1 + nrec
        out.append((member, flat, recs))
    if pos != len(reply):
        raise ScriptError("session page reply has trailing data")
    return clock, wall, out


def iter_sessions(reply: Sequence[Any]) -> Iterator[SessionState]:
    """Every session of a ``snapshot_page`` / ``read_session`` reply as a :class:`SessionState`."""
    clock, wall, sessions = page_sessions(reply)
    for member, flat, recs in sessions:
        yield decode_session(member, flat, recs, read_clock_ms=clock, read_wall_ms=wall)
