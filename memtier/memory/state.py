"""Stored sessions as the workers see them: the raw turn record and the session hash, decoded.

Pure and I/O-free.  A turn record in the ``T:t:<member>`` list is::

    "<seq>|<clock_ms>|<wall_ms>|<bytes>|<is_tool 0/1>|<json {"k": kind, "id": turn_id, "f": {...}}>"

and the session hash ``T:s:<member>`` holds ``id, created, created_wall, seq, turns,
bytes, tools, summary_bytes, last, last_wall``, optionally ``summary`` (JSON, see
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

__all__ = ["SessionState", "StoredTurn", "decode_session", "iter_sessions"]

# Kinds of stored turns and their normalized role (mirrors memtier.memory.models.TURN_TYPES).
KIND_ROLES: Mapping[str, str] = {
    "avatar": "avatar",
    "agent": "agent",
    "tool": "tool",
    "action": "tool",
}
# The exact content fields of each kind, in the order the store writes them.
KIND_FIELDS: Mapping[str, tuple[str, ...]] = {
    "avatar": ("text",),
    "agent": ("text",),
    "tool": ("tool", "summary"),
    "action": ("action", "outcome"),
}
UNTRUSTED_KINDS = frozenset({"avatar", "tool", "action"})


def _s(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class StoredTurn:
    """One turn record, parsed."""

    seq: int
    clock_ms: int
    wall_ms: int
    nbytes: int
    is_tool: bool
    kind: str
    turn_id: str
    fields: Mapping[str, str]

    @classmethod
    def parse(cls, raw: bytes | str) -> StoredTurn:
        """Parse a record string; a malformed one raises :class:`ValueError`."""
        text = _s(raw)
        seq, clock, wall, nbytes, tool, payload = text.split("|", 5)
        if tool not in ("0", "1"):
            raise ValueError("tool flag must be 0 or 1")
        body = orjson.loads(payload)
        if not isinstance(body, dict):
            raise ValueError("record payload must be an object")
        kind, turn_id, fields = body.get("k"), body.get("id"), body.get("f")
        if (
            not isinstance(kind, str)
            or not isinstance(turn_id, str)
            or not isinstance(fields, dict)
        ):
            raise ValueError("record payload lacks k/id/f")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in fields.items()):
            raise ValueError("record fields must be strings")
        return cls(
            seq=_strict_int(seq),
            clock_ms=_strict_int(clock),
            wall_ms=_strict_int(wall),
            nbytes=_strict_int(nbytes),
            is_tool=tool == "1",
            kind=kind,
            turn_id=turn_id,
            fields=fields,
        )

    @property
    def role(self) -> str:
        return KIND_ROLES.get(self.kind, "?")

    @property
    def content_bytes(self) -> int:
        """UTF-8 bytes of the content fields: the accounting unit of the store."""
        return sum(len(v.encode("utf-8")) for v in self.fields.values())

    def payload(self) -> bytes:
        """The JSON payload exactly as the store writes it (field order preserved)."""
        return orjson.dumps({"k": self.kind, "id": self.turn_id, "f": dict(self.fields)})

    def encode(self, *, clock_shift: int = 0) -> bytes:
        """The record string; ``clock_shift`` moves the clock (restore into a new epoch)."""
        head = (
            f"{self.seq}|{self.clock_ms + clock_shift}|{self.wall_ms}|{self.nbytes}|"
            f"{1 if self.is_tool else 0}|"
        )
        return head.encode("ascii") + self.payload()


def _strict_int(text: str) -> int:
    if not text or not (text.isdigit() or (text[0] == "-" and text[1:].isdigit())):
        raise ValueError(f"not an integer: {text[:24]!r}")
    return int(text)


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
        name, value = _s(hash_flat[i]), _s(hash_flat[i + 1])
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
            receipts=receipts,
            compaction_queued="cq" in h,
            read_clock_ms=read_clock_ms,
            read_wall_ms=read_wall_ms,
        )
    except (KeyError, ValueError, orjson.JSONDecodeError) as exc:
        raise ScriptError(f"session {member!r} is malformed in Redis: {exc}") from exc


def iter_sessions(reply: Sequence[Any]) -> Iterator[SessionState]:
    """Decode the reply of ``snapshot_page`` / ``read_session`` (see their headers).

    Shape: ``{clock_ms, wall_ms, n_sessions, (member, n_fields, fields..., n_records,
    records...) * n_sessions}``.
    """
    clock, wall, count = int(reply[0]), int(reply[1]), int(reply[2])
    pos = 3
    for _ in range(count):
        member = _s(reply[pos])
        nfields = int(reply[pos + 1])
        flat = reply[pos + 2 : pos + 2 + nfields]
        pos += 2 + nfields
        nrec = int(reply[pos])
        recs = reply[pos + 1 : pos + 1 + nrec]
        pos += 1 + nrec
        yield decode_session(member, flat, recs, read_clock_ms=clock, read_wall_ms=wall)
    if pos != len(reply):
        raise ScriptError("session page reply has trailing data")
