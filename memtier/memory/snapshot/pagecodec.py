"""The flush's decoder of a ``snapshot_page`` reply: session lines straight from the reply.

:func:`decode_page` gives, for every session of a reply, the payload line the file
holds (exactly ``session_to_json`` of the ``SessionState`` path: same dict, same key
order, same bytes through orjson; tests/workers/test_page_codec.py pins it against that
path on generated replies and on records written by the real ``append_turn``) and,
per record, whether the current redactor wrote it (its flags name
:data:`~memtier.redaction.REDACTOR_VERSION`): the flush's secret re-check skips those
(:func:`~memtier.memory.snapshot.validation.check_session_line`, ``redacted=``).

Why a second decoder: building a :class:`~memtier.memory.state.StoredTurn` per record
was the largest single cost of the flush after the checks (``bench.flushprobe``).  The
fast path handles only the two spellings the store writes, byte for byte -- format 2
with the current redactor's flags (``0v1``, ``1rv1``...), and format 1 (``0``/``1``) --
with every head number plain ASCII digits and the payload of the format's one shape;
any other record (another redactor version, a sign, a wall time equal to the clock,
a ``str`` element, anything malformed) goes through :meth:`StoredTurn.parse` itself,
so what is accepted, what is rejected and what comes out cannot differ from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from memtier import limits
from memtier.errors import ScriptError
from memtier.memory.state import page_sessions
from memtier.memory.turncodec import KIND_CODES, KIND_FIELDS, KIND_ROLES, StoredTurn
from memtier.redaction import REDACTOR_VERSION
from memtier.wire import text

__all__ = [
    "CURRENT_FLAGS",
    "KIND_SHAPES",
    "PageSession",
    "decode_page",
    "decode_session",
    "text_of",
]

# Flags of a format-2 record the current redactor wrote -> (tool flag, rotated).
CURRENT_FLAGS: Final[Mapping[bytes, tuple[int, bool]]] = {
    f"{tool}{rot}v{REDACTOR_VERSION}".encode("ascii"): (tool, rot == "r")
    for tool in (0, 1)
    for rot in ("", "r")
}
# Flags of a format-1 record (no redactor version) -> tool flag.
_FIRST_FORMAT_FLAGS: Final[Mapping[bytes, int]] = {b"0": 0, b"1": 1}
# Kind code of a format-2 payload -> (kind, its field names, its role).
KIND_SHAPES: Final[Mapping[int, tuple[str, tuple[str, ...], str]]] = {
    code: (kind, KIND_FIELDS[kind], KIND_ROLES[kind]) for kind, code in KIND_CODES.items()
}
_WINDOW: Final = int(limits.IDEMPOTENCY_WINDOW)
_loads: Final = orjson.loads


@dataclass(frozen=True, slots=True)
class PageSession:
    """One session of a page: its payload line, and per record (in order) True when
    the current redactor wrote it (its texts need no secret re-check)."""

    line: dict[str, Any]
    redacted: tuple[bool, ...]


def text_of(value: Any) -> str:
    """:func:`memtier.wire.text` inlined (once per hash element)."""
    return value.decode("utf-8") if type(value) is bytes else text(value)


# (record line, turn id, seq, clock, wall, bytes, rotated, current redactor)
_Decoded = tuple[dict[str, Any], str, int, int, int, int, bool, bool]


def fast_record(raw: bytes) -> _Decoded | None:
    """A record in one of the store's own spellings, or None (the caller falls back)."""
    parts = raw.split(b"|", 5)
    if len(parts) != 6:
        return None
    seq_b, clock_b, wall_b, nbytes_b, flags, payload = parts
    if not (seq_b.isdigit() and clock_b.isdigit() and nbytes_b.isdigit()):
        return None  # bytes.isdigit: ASCII digits only (str.isdigit takes more)
    current = CURRENT_FLAGS.get(flags)
    if current is not None:
        tool, rotated = current
        # Format 2 leaves a wall time equal to the clock out (and refuses it written).
        if wall_b == b"":
            wall_b = clock_b
        elif wall_b == clock_b or not wall_b.isdigit():
            return None
        try:
            body = _loads(payload)
        except orjson.JSONDecodeError:
            return None
        if type(body) is not list or len(body) < 2 or type(body[0]) is not int:
            return None
        shape = KIND_SHAPES.get(body[0])
        if shape is None:
            return None
        kind, names, role = shape
        turn_id = body[1]
        if len(body) != len(names) + 2 or type(turn_id) is not str:
            return None
        fields: dict[str, Any] = {}
        for name, value in zip(names, body[2:], strict=True):
            if type(value) is not str:
                return None
            fields[name] = value
    else:
        first = _FIRST_FORMAT_FLAGS.get(flags)
        if first is None or not wall_b.isdigit():
            return None
        tool, rotated = first, False
        try:
            body = _loads(payload)
        except orjson.JSONDecodeError:
            return None
        if type(body) is not dict:
            return None
        kind_any, id_any, parsed = body.get("k"), body.get("id"), body.get("f")
        if type(kind_any) is not str or type(id_any) is not str or type(parsed) is not dict:
            return None
        kind, turn_id = kind_any, id_any
        for name, value in parsed.items():
            if type(name) is not str or type(value) is not str:
                return None
        fields = parsed
        role = KIND_ROLES.get(kind, "?")
    seq, clock, wall, nbytes = int(seq_b), int(clock_b), int(wall_b), int(nbytes_b)
    line = {
        "seq": seq,
        "clock_ms": clock,
        "wall_ms": wall,
        "bytes": nbytes,
        "tool": tool,
        "kind": kind,
        "role": role,
        "id": turn_id,
        "f": fields,
    }
    return line, turn_id, seq, clock, wall, nbytes, rotated, current is not None


def _parsed_record(raw: Any) -> _Decoded:
    """Any other record: :meth:`StoredTurn.parse` decides (its :class:`ValueError`)."""
    r = StoredTurn.parse(raw)
    line = {
        "seq": r.seq,
        "clock_ms": r.clock_ms,
        "wall_ms": r.wall_ms,
        "bytes": r.nbytes,
        "tool": 1 if r.is_tool else 0,
        "kind": r.kind,
        "role": KIND_ROLES.get(r.kind, "?"),
        "id": r.turn_id,
        "f": dict(r.fields),
    }
    current = r.redactor_version == REDACTOR_VERSION
    return line, r.turn_id, r.seq, r.clock_ms, r.wall_ms, r.nbytes, r.rotated, current


def _receipt_seq(receipt: str) -> int:
    parts = receipt.split("|", 2)
    return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else 0


def decode_session(
    member: str, flat: Sequence[Any], recs: Sequence[Any], clock: int, wall: int
) -> PageSession:
    """One session of a reply (its member, hash fields, records; the reply's clock and
    wall time); :class:`ScriptError` when it is malformed."""
    h: dict[str, str] = {}
    receipts: dict[str, str] = {}
    pairs = iter(flat)  # (name, value) pairs; an odd last element is ignored, as before
    for raw_name, raw_value in zip(pairs, pairs, strict=False):
        # wire.text inlined: a page has ~12 hash fields per session
        name = raw_name.decode("utf-8") if type(raw_name) is bytes else text(raw_name)
        value = raw_value.decode("utf-8") if type(raw_value) is bytes else text(raw_value)
        if name[:2] == "r:":
            receipts[name[2:]] = value
        else:
            h[name] = value
    try:
        sid = h["id"]
        records: list[dict[str, Any]] = []
        redacted: list[bool] = []
        for raw in recs:
            got = fast_record(raw) if type(raw) is bytes else None
            if got is None:
                got = _parsed_record(raw)
            line, turn_id, seq, rclock, rwall, nbytes, rotated, current = got
            records.append(line)
            redacted.append(current)
            # memtier.memory.turncodec.window_receipts on the decoded values (a test pins
            # it): a stored receipt wins, else the one made from the record.
            if turn_id not in receipts:
                receipts[turn_id] = f"{sid}|{seq}|{rclock}|{rwall}|{nbytes}|{1 if rotated else 0}"
        if len(receipts) > _WINDOW:
            by_seq = sorted(receipts.items(), key=lambda item: -_receipt_seq(item[1]))
            receipts = dict(by_seq[:_WINDOW])
        last_ms = int(h.get("last", h["created"]))
        line = {
            "member": member,
            "id": sid,
            "created_ms": int(h["created"]),
            "created_wall_ms": int(h["created_wall"]),
            "last_ms": last_ms,
            "last_wall_ms": int(h.get("last_wall", h["created_wall"])),
            "age_ms": max(0, clock - last_ms),
            "read_wall_ms": wall,
            "seq": int(h["seq"]),
            "turns": int(h["turns"]),
            "bytes": int(h["bytes"]),
            "tools": int(h["tools"]),
            "summary_bytes": int(h.get("summary_bytes", "0")),
            "summary_version": int(h.get("sv", "0")),
            "summary": h.get("summary") or None,
            "records": records,
            "receipts": [[tid, receipts[tid]] for tid in sorted(receipts)],
        }
    except (KeyError, ValueError) as exc:  # orjson.JSONDecodeError is a ValueError
        raise ScriptError(f"session {member!r} is malformed in Redis: {exc}") from exc
    return PageSession(line, tuple(redacted))


def decode_page(reply: Sequence[Any]) -> list[PageSession]:
    """Every session of one ``snapshot_page`` reply (see the module docstring);
    :class:`ScriptError` for a malformed session or trailing data."""
    clock, wall, sessions = page_sessions(reply)
    return [decode_session(member, flat, recs, clock, wall) for member, flat, recs in sessions]
