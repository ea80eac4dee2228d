"""The flush's page work in one pass: decode a ``snapshot_page`` reply and check it.

:func:`check_page` gives, for every session of a reply, its payload line and the
verdict of :func:`~memtier.memory.snapshot.validation.check_session_line` on it -- the
same line and the same verdict as :func:`~memtier.memory.snapshot.pagecodec.decode_page`
followed by ``check_session_line(line, redacted=...)``, which the flush ran before
(tests/workers/test_page_check.py pins that on generated and mutated replies).

Why: decoding built every record's line dict and the checks then read it back, key by
key, through three layers of calls; the two were ~40 % and ~50 % of the flush's CPU
(``bench.flushprobe``).  Here the common session -- every record in the spelling the
store writes today (format 2, the current redactor's flags), no summary, no stored
receipt, at most the idempotency window of records -- is decoded and checked on the
values as they are parsed, each check once.  Such a session is *accepted* here only;
anything else, and any session for which one of these checks fails, goes through the
strict path itself (:func:`~memtier.memory.snapshot.pagecodec.decode_session` then
``check_session_line``), which decides what is rejected and with which reason.  So this
module can make the flush faster but cannot make it accept more: what it accepts is a
subset of what the strict path accepts, with the same line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from memtier import limits
from memtier.memory.models import name_problem
from memtier.memory.snapshot.fileformat import (
    MAX_INT,
    MAX_TIME_MS,
    MIN_TIME_MS,
    SnapshotValidationError,
)
from memtier.memory.snapshot.pagecodec import decode_session, fast_record, text_of
from memtier.memory.snapshot.validation import check_session_line
from memtier.memory.state import page_sessions
from memtier.redaction.placeholders import ASCII_CONTROLS, CONTROL_RE

__all__ = ["CheckedSession", "check_page"]

_MAX_TURN: Final = int(limits.MAX_TURN_BYTES.ceiling)
_MAX_TURNS: Final = int(limits.MAX_TURNS_PER_SESSION.ceiling)
_MAX_SESSION: Final = int(limits.MAX_SESSION_BYTES.ceiling)
_MAX_TOOLS: Final = int(limits.MAX_TOOL_RESULTS.ceiling)
_MAX_SUMMARY: Final = int(limits.MAX_SUMMARY_BYTES.ceiling)
_MAX_TOOL_RESULT: Final = int(limits.MAX_TOOL_RESULT_BYTES.ceiling)
_MAX_NAME: Final = limits.MAX_NAME_BYTES
_WINDOW: Final = int(limits.IDEMPOTENCY_WINDOW)
# The strictest spelling of each id the strict path accepts (validation.py's session-id
# pattern; recordcheck's turn-id pattern, matched in full, implies validation.py's).
_SESSION_ID_RE: Final = re.compile(r"ses_[A-Za-z0-9_\-]{16,64}")
_TURN_ID_RE: Final = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
_CANONICAL_UUID_RE: Final = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.ASCII
)
_loads: Final = orjson.loads


@dataclass(frozen=True, slots=True)
class CheckedSession:
    """One session of a page: its payload line, and why it must be left out (None: it
    passed every check and goes into the generation)."""

    line: dict[str, Any]
    rejected: SnapshotValidationError | None


def _clean(value: str) -> int:
    """The UTF-8 size of a content value the live path could store, else -1 (a control
    character or a lone surrogate: the strict path names the problem)."""
    if value.isascii():
        data = value.encode("ascii")
        return len(data) if len(data.translate(None, ASCII_CONTROLS)) == len(data) else -1
    if CONTROL_RE.search(value) is not None:
        return -1
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return -1


def _records(
    recs: Sequence[Any], sid: str, created_ms: int, last_ms: int
) -> tuple[list[dict[str, Any]], dict[str, str], int, int, int] | None:
    """The records of a common session, decoded and checked: (lines, receipts, last seq,
    bytes, tool results), or None when any record is not common or fails a check."""
    records: list[dict[str, Any]] = []
    receipts: dict[str, str] = {}
    previous = total_bytes = tools = 0
    for raw in recs:
        # pagecodec's decode of the store's spellings; only the current one is common
        got = fast_record(raw) if type(raw) is bytes else None
        if got is None or not got[7]:
            return None
        line, turn_id, seq, clock, wall, nbytes, rotated, _ = got
        kind, fields, tool = line["kind"], line["f"], line["tool"]
        if not (
            previous < seq <= MAX_INT
            and created_ms <= clock <= last_ms  # within the times' range: checked on both
            and MIN_TIME_MS <= wall <= MAX_TIME_MS
            and nbytes <= _MAX_TURN
            and tool == (kind == "tool")
            and _TURN_ID_RE.fullmatch(turn_id) is not None
        ):
            return None
        if len(fields) == 1:  # avatar / agent: one text
            (value,) = fields.values()
            size = _clean(value)
            if size < 0:
                return None
        else:  # tool / action: a name, then its body (in KIND_FIELDS order)
            name, value = fields.values()
            name_size, body_size = _clean(name), _clean(value)
            if (
                not 1 <= name_size <= _MAX_NAME
                or body_size < 0
                or body_size > _MAX_TOOL_RESULT
                or name_problem(name) is not None
            ):
                return None
            size = name_size + body_size
        if size != nbytes:  # also bounds the record: nbytes <= the turn ceiling above
            return None
        records.append(line)
        # pagecodec's receipt of a record with no stored receipt (the first one wins).
        if turn_id not in receipts:
            receipts[turn_id] = f"{sid}|{seq}|{clock}|{wall}|{nbytes}|{1 if rotated else 0}"
        previous = seq
        total_bytes += nbytes
        tools += tool
    return records, receipts, previous, total_bytes, tools


def _common(
    member: str, flat: Sequence[Any], recs: Sequence[Any], clock: int, wall: int
) -> dict[str, Any] | None:
    """The line of a common session that passes every check, else None."""
    if len(recs) > _WINDOW:
        return None  # more receipts than the window: the strict path keeps the newest
    avatar, _, channel = member.partition(":")  # a second ":" would be in the channel
    if (channel != "public" and channel != "im") or _CANONICAL_UUID_RE.fullmatch(avatar) is None:
        return None
    h: dict[str, str] = {}
    pairs = iter(flat)
    for raw_name, raw_value in zip(pairs, pairs, strict=False):
        name = raw_name.decode("utf-8") if type(raw_name) is bytes else text_of(raw_name)
        if name[:2] == "r:":
            return None  # a stored receipt: the strict path merges them
        h[name] = raw_value.decode("utf-8") if type(raw_value) is bytes else text_of(raw_value)
    if h.get("summary"):
        return None  # summaries are checked (and secret-scanned) by the strict path
    try:
        sid = h["id"]
        created_ms = int(h["created"])
        last_ms = int(h.get("last", h["created"]))
        created_wall = int(h["created_wall"])
        last_wall = int(h.get("last_wall", h["created_wall"]))
        seq, turns, nbytes = int(h["seq"]), int(h["turns"]), int(h["bytes"])
        tools = int(h["tools"])
        summary_bytes = int(h.get("summary_bytes", "0"))
        summary_version = int(h.get("sv", "0"))
    except (KeyError, ValueError):
        return None  # the strict path raises what the flush always raised
    age_ms = max(0, clock - last_ms)
    if not (
        _SESSION_ID_RE.fullmatch(sid) is not None
        and MIN_TIME_MS <= created_ms <= last_ms <= MAX_TIME_MS
        and MIN_TIME_MS <= created_wall <= MAX_TIME_MS
        and MIN_TIME_MS <= last_wall <= MAX_TIME_MS
        and age_ms <= MAX_INT
        and MIN_TIME_MS <= wall <= MAX_TIME_MS
        and 0 <= seq <= MAX_INT
        and 0 <= turns <= _MAX_TURNS
        and 0 <= nbytes <= _MAX_SESSION
        and 0 <= tools <= _MAX_TOOLS
        and summary_bytes == 0
        and 0 <= summary_version <= MAX_INT
        and len(recs) == turns
    ):
        return None
    decoded = _records(recs, sid, created_ms, last_ms)
    if decoded is None:
        return None
    records, receipts, last_seq, records_bytes, records_tools = decoded
    # (seq >= turns follows: the records' sequences rise from 1 and end at last_seq <= seq)
    if last_seq > seq or records_tools != tools or nbytes != records_bytes:
        return None
    return {
        "member": member,
        "id": sid,
        "created_ms": created_ms,
        "created_wall_ms": created_wall,
        "last_ms": last_ms,
        "last_wall_ms": last_wall,
        "age_ms": age_ms,
        "read_wall_ms": wall,
        "seq": seq,
        "turns": turns,
        "bytes": nbytes,
        "tools": tools,
        "summary_bytes": 0,
        "summary_version": summary_version,
        "summary": None,
        "records": records,
        "receipts": [[tid, receipts[tid]] for tid in sorted(receipts)],
    }


def _strict(
    member: str, flat: Sequence[Any], recs: Sequence[Any], clock: int, wall: int
) -> CheckedSession:
    session = decode_session(member, flat, recs, clock, wall)
    try:
        check_session_line(session.line, redacted=session.redacted)
    except SnapshotValidationError as exc:
        return CheckedSession(session.line, exc)
    return CheckedSession(session.line, None)


def check_page(reply: Sequence[Any]) -> list[CheckedSession]:
    """Every session of one ``snapshot_page`` reply, decoded and checked (see the module
    docstring); :class:`~memtier.errors.ScriptError` for a malformed session or trailing
    data, as :func:`~memtier.memory.snapshot.pagecodec.decode_page` raises."""
    clock, wall, sessions = page_sessions(reply)
    out: list[CheckedSession] = []
    for member, flat, recs in sessions:
        line = _common(member, flat, recs, clock, wall)
        out.append(
            CheckedSession(line, None)
            if line is not None
            else _strict(member, flat, recs, clock, wall)
        )
    return out
