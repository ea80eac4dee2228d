"""The stored turn record: the one module that encodes and decodes it.

A turn record in the ``T:t:<member>`` list is::

    "<seq>|<clock_ms>|<wall_ms>|<bytes>|<flags>|<json payload>"

``flags`` says which of two formats the record is in:

* ``0`` / ``1`` -- the first format (the tool flag alone; ``wall_ms`` always written; the
  payload ``{"k": kind, "id": turn_id, "f": {name: value, ...}}``): records stored
  before the redactor version existed.  Still read everywhere (a rolling upgrade leaves
  them in Redis; a restore writes records from snapshot files in it).
* ``<tool 0/1>[r]v<redactor version>`` -- every record ``append_turn`` writes now, e.g.
  ``0v1``, with the payload ``[kind code, turn_id, value, ...]`` (:data:`KIND_CODES`, the
  values in :data:`KIND_FIELDS` order: 29 bytes less than the object for a chat turn).  ``r``
  marks the first turn of a session that began because the previous one expired
  (``rotated`` of its append receipt: a duplicate retry answers from the record), and
  ``v<n>`` is the :data:`~memtier.redaction.REDACTOR_VERSION` of the process that
  redacted the content.  ``wall_ms`` is left empty when it equals ``clock_ms`` (the usual
  case: the clock only runs ahead of the wall time after a server clock step back), which
  saves 13 bytes a turn.

``append_turn`` writes the head; the JSON payload is :func:`encode_payload`'s.  The turn id
stays in the JSON: the id zset ``T:i:<member>`` keeps only the last
:data:`~memtier.limits.IDEMPOTENCY_WINDOW` ids, and readers return every turn's id.  Two
readers decode it: :func:`decode_record` (the hot path of ``context``/``pop``, straight
to a :class:`~memtier.memory.models.TurnRecord`) and :meth:`StoredTurn.parse` (workers
and snapshots: every number checked strictly, re-encodable byte for byte).  The kind
tables are derived from :data:`~memtier.memory.models.TURN_TYPES`, so they cannot drift.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import orjson

from memtier import limits
from memtier.errors import ScriptError
from memtier.memory.models import TURN_TYPES, FrozenFields, Role, TurnRecord, trusted
from memtier.redaction import REDACTOR_VERSION
from memtier.wire import text

__all__ = [
    "KIND_CODES",
    "KIND_FIELDS",
    "KIND_ROLES",
    "UNTRUSTED_KINDS",
    "StoredTurn",
    "decode_record",
    "encode_payload",
    "encode_payload_first_format",
    "record_flags",
    "window_receipts",
]

# Kinds of stored turns and their normalized role.
KIND_ROLES: Final[Mapping[str, str]] = {kind: t.role.value for kind, t in TURN_TYPES.items()}
# The exact content fields of each kind, in the order the store writes them.
KIND_FIELDS: Final[Mapping[str, tuple[str, ...]]] = {
    "avatar": ("text",),
    "agent": ("text",),
    "tool": ("tool", "summary"),
    "action": ("action", "outcome"),
}
# The kind's code in a record of the current format (stable: stored in Redis).
KIND_CODES: Final[Mapping[str, int]] = {"avatar": 0, "agent": 1, "tool": 2, "action": 3}
_KIND_OF_CODE: Final = {code: kind for kind, code in KIND_CODES.items()}
_FIELDS_OF_CODE: Final = {code: KIND_FIELDS[kind] for kind, code in KIND_CODES.items()}
UNTRUSTED_KINDS: Final = frozenset(kind for kind, t in TURN_TYPES.items() if t.untrusted)
# Kind -> Role member, for the read path (one dict lookup per turn).
_ROLE_OF: Final[Mapping[str, Role]] = {kind: t.role for kind, t in TURN_TYPES.items()}
# wire.ms_to_datetime inlined (the same call, positional tz): once per turn of every read.
_fromtimestamp: Final = datetime.fromtimestamp


# The flags the client sends (append_turn's `flags` ARGV) for a new record.
_FLAGS_OF_TOOL: Final = (f"0v{REDACTOR_VERSION}", f"1v{REDACTOR_VERSION}")


def record_flags(is_tool: bool) -> str:
    """The flags of a record this process writes (``append_turn`` adds ``r`` itself)."""
    return _FLAGS_OF_TOOL[is_tool]


def encode_payload(kind: str, turn_id: str, fields: Mapping[str, str]) -> bytes:
    """The JSON payload of a new record, as append sends it: ``[kind code, turn_id,
    *values]`` (:data:`KIND_CODES`; the values in :data:`KIND_FIELDS` order, their names
    are not stored)."""
    if tuple(fields) != KIND_FIELDS.get(kind):
        raise ValueError(f"fields of a {kind!r} turn must be exactly {KIND_FIELDS.get(kind)}")
    return orjson.dumps([KIND_CODES[kind], turn_id, *fields.values()])


def encode_payload_first_format(kind: str, turn_id: str, fields: Mapping[str, str]) -> bytes:
    """The JSON payload of a record of the first format: ``{"k", "id", "f": {...}}``."""
    return orjson.dumps({"k": kind, "id": turn_id, "f": dict(fields)})


def _body_parts(body: Any) -> tuple[Any, Any, Any]:
    """(kind, turn_id, fields dict or None) of either payload shape; types unchecked."""
    if type(body) is list:
        kind = _KIND_OF_CODE.get(body[0]) if body and type(body[0]) is int else None
        names = KIND_FIELDS.get(kind) if kind is not None else None
        if names is None or len(body) != len(names) + 2:
            return None, None, None
        return kind, body[1], dict(zip(names, body[2:], strict=True))
    if type(body) is dict:
        return body.get("k"), body.get("id"), body.get("f")
    return None, None, None


def decode_record(raw: bytes | str) -> TurnRecord:
    """One stored record, as written by append_turn (the read path).

    Built without pydantic validation per turn (see :func:`~memtier.memory.models.trusted`):
    the record was encoded by the store and the script, and its shape is checked here --
    an unknown kind, a non-string id or a field that is not a string raises
    :class:`ScriptError` instead of producing a malformed model.
    """
    # Inline, not wire.text(): this runs once per turn of every context read.
    record = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    seq, clock, wall, _nbytes, _flags, payload = record.split("|", 5)
    body = orjson.loads(payload)
    if type(body) is list and body and type(body[0]) is int:  # format 2 (inlined: per turn)
        kind = _KIND_OF_CODE.get(body[0])
        names = _FIELDS_OF_CODE.get(body[0], ())
        turn_id = body[1] if len(body) > 1 else None
        ok = bool(names) and len(body) == len(names) + 2
        fields = dict(zip(names, body[2:], strict=True)) if ok else None
    else:
        kind, turn_id, fields = _body_parts(body)
    role = _ROLE_OF.get(kind) if type(kind) is str else None
    if role is None or type(turn_id) is not str or type(fields) is not dict:
        raise ScriptError("read_context returned a malformed turn record")
    for value in fields.values():  # a plain loop: cheaper than all() over a generator
        if type(value) is not str:
            raise ScriptError("read_context returned a malformed turn record")
    return trusted(
        TurnRecord,
        {
            "seq": int(seq),
            "timestamp": _fromtimestamp(int(wall or clock) / 1000, UTC),
            "clock_ms": int(clock),
            "kind": kind,
            "role": role,
            "turn_id": turn_id,
            "fields": FrozenFields(fields),
        },
    )


@dataclass(frozen=True, slots=True)
class StoredTurn:
    """One turn record, parsed strictly (workers, snapshots, recovery)."""

    seq: int
    clock_ms: int
    wall_ms: int
    nbytes: int
    is_tool: bool
    kind: str
    turn_id: str
    fields: Mapping[str, str]
    # The first turn of a session that began because the previous one expired.
    rotated: bool = False
    # The redactor that redacted the content; None: a record of the first format.
    redactor_version: int | None = None

    @classmethod
    def parse(cls, raw: bytes | str) -> StoredTurn:
        """Parse a record string; a malformed one raises :class:`ValueError`."""
        seq, clock, wall, nbytes, flags, payload = text(raw).split("|", 5)
        tool, rotated, version = _parse_flags(flags)
        if version is not None and wall == "":
            wall = clock
        elif wall == clock and version is not None:
            raise ValueError("wall time equal to the clock must be left out")
        body: Any = orjson.loads(payload)
        # one payload shape per format, so that the record re-encodes byte for byte
        if not isinstance(body, list if version is not None else dict):
            raise ValueError("record payload must be an array (an object in the first format)")
        kind, turn_id, fields = _body_parts(body)
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
            is_tool=tool,
            kind=kind,
            turn_id=turn_id,
            fields=fields,
            rotated=rotated,
            redactor_version=version,
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
        if self.redactor_version is None:
            return encode_payload_first_format(self.kind, self.turn_id, self.fields)
        return encode_payload(self.kind, self.turn_id, self.fields)

    def encode(self, *, clock_shift: int = 0) -> bytes:
        """The record string; ``clock_shift`` moves the clock (restore into a new epoch)."""
        clock = self.clock_ms + clock_shift
        tool = 1 if self.is_tool else 0
        if self.redactor_version is None:  # the first format, as it was stored
            head = f"{self.seq}|{clock}|{self.wall_ms}|{self.nbytes}|{tool}|"
        else:
            wall = "" if self.wall_ms == clock else self.wall_ms
            rot = "r" if self.rotated else ""
            head = f"{self.seq}|{clock}|{wall}|{self.nbytes}|{tool}{rot}v{self.redactor_version}|"
        return head.encode("ascii") + self.payload()


def window_receipts(
    session_id: str,
    records: Sequence[StoredTurn],
    stored: Mapping[str, str],
    *,
    window: int = int(limits.IDEMPOTENCY_WINDOW),
) -> dict[str, str]:
    """The receipt of every turn id a retry is recognised by, as a snapshot keeps them.

    ``append_turn`` no longer writes a receipt ``r:<turn_id>`` per turn: it answers a retry
    from the turn's record.  A snapshot does not copy the id zset, so the receipts a
    restore needs (``restore_session`` rebuilds the id zset from them) are made here from
    the records: ``"<sid>|<seq>|<clock>|<wall>|<bytes>|<rotated>"``, ``sid`` the session's
    own.  ``stored`` are the receipts found in the session hash (folded turns, restored
    sessions, records of the first format): they win.  The id zset holds the newest
    :data:`~memtier.limits.IDEMPOTENCY_WINDOW` ids, every one of which has a record or a
    stored receipt, so the newest that many of both by seq are exactly its ids -- or, when
    turns were popped after the zset was trimmed, a few older ones too (a retry of those
    is then answered as a duplicate rather than stored again: never stored twice).
    """
    out = dict(stored)
    for record in records:
        if record.turn_id not in out:
            out[record.turn_id] = (
                f"{session_id}|{record.seq}|{record.clock_ms}|{record.wall_ms}|"
                f"{record.nbytes}|{1 if record.rotated else 0}"
            )
    if len(out) <= window:
        return out
    by_seq = sorted(out.items(), key=lambda item: -_receipt_seq(item[1]))
    return dict(by_seq[:window])


def _receipt_seq(receipt: str) -> int:
    parts = receipt.split("|", 2)
    return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else 0


def _parse_flags(flags: str) -> tuple[bool, bool, int | None]:
    """(is_tool, rotated, redactor_version) of a record's flags field."""
    if flags in ("0", "1"):
        return flags == "1", False, None
    tool, rest = flags[:1], flags[1:]
    rotated = rest.startswith("r")
    if rotated:
        rest = rest[1:]
    digits = rest[1:]
    if tool not in ("0", "1") or rest[:1] != "v" or not (digits.isascii() and digits.isdigit()):
        raise ValueError(f"malformed record flags: {flags[:24]!r}")
    if digits[0] == "0":  # one spelling per version: the record re-encodes byte for byte
        raise ValueError(f"malformed record flags: {flags[:24]!r}")
    return tool == "1", rotated, int(digits)


def _strict_int(digits: str) -> int:
    if not digits or not (digits.isdigit() or (digits[0] == "-" and digits[1:].isdigit())):
        raise ValueError(f"not an integer: {digits[:24]!r}")
    return int(digits)
