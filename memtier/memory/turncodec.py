"""The stored turn record: the one module that encodes and decodes it.

A turn record in the ``T:t:<member>`` list is::

    "<seq>|<clock_ms>|<wall_ms>|<bytes>|<is_tool 0/1>|<json {"k": kind, "id": turn_id, "f": {...}}>"

``append_turn`` writes the head; the JSON payload is :func:`encode_payload`'s.  Two
readers decode it: :func:`decode_record` (the hot path of ``context``/``pop``, straight
to a :class:`~memtier.memory.models.TurnRecord`) and :meth:`StoredTurn.parse` (workers
and snapshots: every number checked strictly, re-encodable byte for byte).  The kind
tables are derived from :data:`~memtier.memory.models.TURN_TYPES`, so they cannot drift.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import orjson

from memtier.errors import ScriptError
from memtier.memory.models import TURN_TYPES, Role, TurnRecord, trusted
from memtier.wire import text

__all__ = [
    "KIND_FIELDS",
    "KIND_ROLES",
    "UNTRUSTED_KINDS",
    "StoredTurn",
    "decode_record",
    "encode_payload",
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
UNTRUSTED_KINDS: Final = frozenset(kind for kind, t in TURN_TYPES.items() if t.untrusted)
# Kind -> Role member, for the read path (one dict lookup per turn).
_ROLE_OF: Final[Mapping[str, Role]] = {kind: t.role for kind, t in TURN_TYPES.items()}
# wire.ms_to_datetime inlined (the same call, positional tz): once per turn of every read.
_fromtimestamp: Final = datetime.fromtimestamp


def encode_payload(kind: str, turn_id: str, fields: dict[str, str]) -> bytes:
    """The JSON payload of a record (field order preserved), as append sends it."""
    return orjson.dumps({"k": kind, "id": turn_id, "f": fields})


def decode_record(raw: bytes | str) -> TurnRecord:
    """One stored record, as written by append_turn (the read path).

    Built without pydantic validation per turn (see :func:`~memtier.memory.models.trusted`):
    the record was encoded by the store and the script, and its shape is checked here --
    an unknown kind, a non-string id or a field that is not a string raises
    :class:`ScriptError` instead of producing a malformed model.
    """
    # Inline, not wire.text(): this runs once per turn of every context read.
    record = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    seq, clock, wall, _nbytes, _tool, payload = record.split("|", 5)
    body = orjson.loads(payload)
    kind = body["k"]
    role = _ROLE_OF.get(kind) if type(kind) is str else None
    turn_id = body["id"]
    fields = body["f"]
    if role is None or type(turn_id) is not str or type(fields) is not dict:
        raise ScriptError("read_context returned a malformed turn record")
    for value in fields.values():  # a plain loop: cheaper than all() over a generator
        if type(value) is not str:
            raise ScriptError("read_context returned a malformed turn record")
    return trusted(
        TurnRecord,
        {
            "seq": int(seq),
            "timestamp": _fromtimestamp(int(wall) / 1000, UTC),
            "clock_ms": int(clock),
            "kind": kind,
            "role": role,
            "turn_id": turn_id,
            "fields": fields,
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

    @classmethod
    def parse(cls, raw: bytes | str) -> StoredTurn:
        """Parse a record string; a malformed one raises :class:`ValueError`."""
        seq, clock, wall, nbytes, tool, payload = text(raw).split("|", 5)
        if tool not in ("0", "1"):
            raise ValueError("tool flag must be 0 or 1")
        body: Any = orjson.loads(payload)
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
        return encode_payload(self.kind, self.turn_id, dict(self.fields))

    def encode(self, *, clock_shift: int = 0) -> bytes:
        """The record string; ``clock_shift`` moves the clock (restore into a new epoch)."""
        head = (
            f"{self.seq}|{self.clock_ms + clock_shift}|{self.wall_ms}|{self.nbytes}|"
            f"{1 if self.is_tool else 0}|"
        )
        return head.encode("ascii") + self.payload()


def _strict_int(digits: str) -> int:
    if not digits or not (digits.isdigit() or (digits[0] == "-" and digits[1:].isdigit())):
        raise ValueError(f"not an integer: {digits[:24]!r}")
    return int(digits)
