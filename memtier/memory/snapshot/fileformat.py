"""The snapshot file format: the one owner that encodes and decodes a generation file.

File layout (format 1, schema 1)
    bytes ``0 .. 4095``: ``MEMTIER-SNAPSHOT\\n``, the header JSON, space padding, ``\\n``.
    The header holds ``format``, ``format_version``, ``schema_version``, ``namespace``,
    ``generation``, ``created_by``, ``partitions``, the server clock and wall time of the
    flush (``flush_started_wall_ms``, ``flush_clock_ms``, ``flush_wall_ms``),
    ``sessions``, ``payload_bytes``, ``payload_sha256`` and ``header_sha256`` (SHA-256
    of the canonical header JSON without that field).  Then the payload: one JSON object
    per line per live session (see :func:`session_to_json`): key, session id,
    timestamps, sequence counter, counters, summary, receipts and every turn record with
    its seq, clock, wall time, bytes, kind, role, turn id and content fields.

Everything that writes the bytes (:mod:`~memtier.memory.snapshot.writer`) or reads them
back (:mod:`~memtier.memory.snapshot.validation`) goes through the functions here: the
header block (:func:`encode_header` / :func:`read_header`), the payload lines
(:func:`session_to_json` / :func:`read_lines`) and the field sets of each level.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, BinaryIO, Final

import orjson

from memtier import limits
from memtier.errors import ScriptError, SnapshotError
from memtier.memory.snapshot.pagecodec import decode_page
from memtier.memory.state import SessionState
from memtier.wire import text

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "HEADER_BLOCK",
    "HEADER_KEYS",
    "MAGIC",
    "RECORD_KEYS",
    "SCHEMA_VERSION",
    "SESSION_KEYS",
    "SnapshotValidationError",
    "encode_header",
    "fail",
    "int_field",
    "page_last_member",
    "page_lines",
    "read_header",
    "read_lines",
    "session_to_json",
    "time_field",
]

MAGIC: Final = b"MEMTIER-SNAPSHOT\n"
FORMAT: Final = "memtier-snapshot"
FORMAT_VERSION: Final = 1
SCHEMA_VERSION: Final = 1
# Fixed-size header block: written last (over a placeholder) so the payload streams to
# disk with constant memory while the checksum is computed.
HEADER_BLOCK: Final = 4096
# One session line: its bytes, receipts and JSON escaping (<= 6x for control characters)
# stay well under this for the largest session the hard ceilings allow.
MAX_LINE_BYTES: Final = 8 * int(limits.MAX_SESSION_BYTES.ceiling) + 1024 * 1024
# Plausible timestamps: 2000-01-01 .. 9999-12-31 (ms).  Clocks come from Redis TIME.
MIN_TIME_MS: Final = 946_684_800_000
MAX_TIME_MS: Final = 253_402_300_799_999
MAX_INT: Final = 2**53

HEADER_KEYS: Final = frozenset(
    {
        "format",
        "format_version",
        "schema_version",
        "namespace",
        "generation",
        "created_by",
        "partitions",
        "flush_started_wall_ms",
        "flush_clock_ms",
        "flush_wall_ms",
        "sessions",
        "payload_bytes",
        "payload_sha256",
        "header_sha256",
    }
)
SESSION_KEYS: Final = frozenset(
    {
        "member",
        "id",
        "created_ms",
        "created_wall_ms",
        "last_ms",
        "last_wall_ms",
        "age_ms",
        "read_wall_ms",
        "seq",
        "turns",
        "bytes",
        "tools",
        "summary_bytes",
        "summary_version",
        "summary",
        "records",
        "receipts",
    }
)
RECORD_KEYS: Final = frozenset(
    {"seq", "clock_ms", "wall_ms", "bytes", "tool", "kind", "role", "id", "f"}
)


class SnapshotValidationError(Exception):
    """One failed check (internal: becomes a :class:`Rejection`)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def fail(reason: str, detail: str) -> SnapshotValidationError:
    return SnapshotValidationError(reason, detail)


def int_field(obj: Mapping[str, Any], name: str, lo: int = 0, hi: int = MAX_INT) -> int:
    value = obj.get(name)
    if type(value) is not int or not lo <= value <= hi:
        raise fail("invalid_session", f"{name} must be an integer in [{lo}, {hi}]")
    return value


def time_field(obj: Mapping[str, Any], name: str) -> int:
    return int_field(obj, name, MIN_TIME_MS, MAX_TIME_MS)


def _canonical(header: Mapping[str, Any]) -> bytes:
    return orjson.dumps(
        {k: v for k, v in header.items() if k != "header_sha256"}, option=orjson.OPT_SORT_KEYS
    )


def encode_header(header: Mapping[str, Any]) -> bytes:
    full = dict(header)
    full["header_sha256"] = hashlib.sha256(_canonical(full)).hexdigest()
    body = MAGIC + orjson.dumps(full, option=orjson.OPT_SORT_KEYS)
    if len(body) + 1 > HEADER_BLOCK:
        raise SnapshotError("snapshot header does not fit its block")
    return body + b" " * (HEADER_BLOCK - len(body) - 1) + b"\n"


def session_to_json(state: SessionState) -> dict[str, Any]:
    """The payload line of one session (schema 1)."""
    return {
        "member": state.member,
        "id": state.session_id,
        "created_ms": state.created_ms,
        "created_wall_ms": state.created_wall_ms,
        "last_ms": state.last_ms,
        "last_wall_ms": state.last_wall_ms,
        "age_ms": state.age_ms,
        "read_wall_ms": state.read_wall_ms,
        "seq": state.seq,
        "turns": state.turns,
        "bytes": state.nbytes,
        "tools": state.tools,
        "summary_bytes": state.summary_bytes,
        "summary_version": state.summary_version,
        "summary": state.summary,
        "records": [
            {
                "seq": r.seq,
                "clock_ms": r.clock_ms,
                "wall_ms": r.wall_ms,
                "bytes": r.nbytes,
                "tool": 1 if r.is_tool else 0,
                "kind": r.kind,
                "role": r.role,
                "id": r.turn_id,
                "f": dict(r.fields),
            }
            for r in state.records
        ],
        "receipts": [[tid, state.receipts[tid]] for tid in sorted(state.receipts)],
    }


def _str(value: Any) -> str:
    """:func:`memtier.wire.text` inlined for the page walk."""
    return value.decode("utf-8") if type(value) is bytes else text(value)


def page_lines(reply: Sequence[Any]) -> list[dict[str, Any]]:
    """The payload lines of one ``snapshot_page`` reply, decoded straight from it.

    Exactly ``[session_to_json(s) for s in iter_sessions(reply)]`` (a test pins it)
    without the intermediate :class:`SessionState` of each session
    (:func:`~memtier.memory.snapshot.pagecodec.decode_page`, which the flush calls
    directly for each record's redactor verdict too).
    """
    return [session.line for session in decode_page(reply)]


def page_last_member(reply: Sequence[Any]) -> str | None:
    """The member of the last session of a ``snapshot_page`` reply (None: no session),
    found by walking the reply's counts only: the flush knows where to resume before it
    decodes the page (:func:`page_lines`, later, checks the rest)."""
    try:
        count = int(reply[2])
        pos = 3
        member = None
        for _ in range(count):
            member = reply[pos]
            pos += 2 + int(reply[pos + 1])
            pos += 1 + int(reply[pos])
        if pos != len(reply):
            raise ScriptError("session page reply has trailing data")
    except (IndexError, TypeError, ValueError) as exc:
        raise ScriptError(f"malformed session page reply: {exc}") from exc
    return None if member is None else _str(member)


def read_header(fh: BinaryIO, namespace: str) -> dict[str, Any]:
    block = fh.read(HEADER_BLOCK)
    if len(block) < HEADER_BLOCK:
        raise fail("truncated", "shorter than its header block")
    if not block.startswith(MAGIC):
        raise fail("bad_magic", "not a memtier snapshot")
    if block[-1:] != b"\n":
        raise fail("bad_header", "header block terminator")
    body = block[len(MAGIC) : -1].rstrip(b" ")
    if b"\n" in body or block[len(MAGIC) + len(body) : -1].strip(b" "):
        raise fail("bad_header", "header padding")
    try:
        header = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise fail("bad_header", "header is not JSON") from None
    if not isinstance(header, dict):
        raise fail("bad_header", "header is not an object")
    if header.get("format") != FORMAT:
        raise fail("unsupported", f"format {str(header.get('format'))[:32]!r}")
    if (
        header.get("format_version") != FORMAT_VERSION
        or header.get("schema_version") != SCHEMA_VERSION
    ):
        raise fail(
            "unsupported",
            f"format {header.get('format_version')!r} / schema {header.get('schema_version')!r}",
        )
    if set(header) != HEADER_KEYS:
        raise fail("bad_header", "header fields")
    if hashlib.sha256(_canonical(header)).hexdigest() != header["header_sha256"]:
        raise fail("checksum", "header checksum mismatch")
    if header["namespace"] != namespace:
        raise fail("bad_header", "namespace does not match the file name")
    for name in ("generation", "sessions", "payload_bytes", "partitions"):
        int_field(header, name)
    for name in ("flush_started_wall_ms", "flush_clock_ms", "flush_wall_ms"):
        time_field(header, name)
    if header["flush_started_wall_ms"] > header["flush_wall_ms"]:
        raise fail("bad_header", "flush times")
    return header


def read_lines(fh: BinaryIO, payload_bytes: int, sha: Any) -> Iterator[bytes]:
    """Payload lines, hashed as read; bounded line length and total length."""
    remaining = payload_bytes
    while remaining > 0:
        line = fh.readline(min(remaining, MAX_LINE_BYTES + 1))
        if not line:
            raise fail("truncated", "payload shorter than the header says")
        remaining -= len(line)
        sha.update(line)
        if not line.endswith(b"\n"):
            if len(line) > MAX_LINE_BYTES:
                raise fail("oversized", "a session line exceeds its bound")
            raise fail("truncated", "last line is cut")
        yield line
