"""The thread ledger (``T:v:<id>``, a stream of redacted event rows): its row codec and
the flows that read it (replay, export).

One owner for a ledger row: :func:`row_args` encodes the rows a flow writes (type and
data JSON, through the scripts ``events_append``, ``run_commit``, ``run_abort``,
``run_cancel``), :func:`event_data` turns a runner's event data into row data (raw
payload fields omitted, local paths and secrets redacted, bounded) and
:func:`decode_row` turns a stored row back into an :class:`EventRecord` -- redacted
again, so a row written by hand or by an older version is never served as it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

import orjson

from memtier import limits
from memtier.engine import Command, Plan
from memtier.errors import ConversationError, ErrorCode
from memtier.errors import ValidationError as MemtierValidationError
from memtier.keys import ThreadKeys
from memtier.redaction import redact_json, scrub_json_paths, scrub_paths, served_json
from memtier.threads.cursor import CursorKind
from memtier.threads.models import (
    MARKER,
    RESERVED_EVENT_TYPES,
    TERMINAL_EVENT_TYPES,
    ConversationThread,
    EventRecord,
    ExportResult,
    Ownership,
    ReplayPage,
    ms_to_datetime,
)
from memtier.threads.records import text, thread_of
from memtier.threads.servedrows import NOT_SERVABLE
from memtier.threads.specs import READ_EVENTS, thread_call
from memtier.threads.status import ThreadStatus, status_error
from memtier.threads.validation import dumps, page_size, sanitized, thread_keys
from memtier.trustedmodels import trusted

if TYPE_CHECKING:
    from memtier.threads.core import ThreadsCore

__all__ = [
    "RAW_PAYLOAD_KEYS",
    "check_event_type",
    "decode_row",
    "event_data",
    "export",
    "exported_thread",
    "message_event",
    "replay",
    "row_args",
    "served_payload",
]

Code = ErrorCode

_EVENT_TYPE_RE: Final = re.compile(r"^[a-z][a-z0-9_.]{0,63}\Z")
_STREAM_ID_RE: Final = re.compile(r"^\d{1,20}-\d{1,20}\Z")
_LEDGER_START: Final = "0-0"  # before every row: "(0-0" reads from the start
_ROW_FIELDS: Final = 5  # id, type, data, run, redacted
_EXPORT_ENVELOPE_BYTES: Final = 512  # export JSON around the thread and events (cursor incl.)
_MAX_SUMMARY_DEPTH: Final = 16

# Runner event data: keys whose values are raw payloads are omitted (summaries only).
RAW_PAYLOAD_KEYS: Final = frozenset(
    {
        "raw",
        "payload",
        "rawinput",
        "rawoutput",
        "rawpayload",
        "arguments",
        "args",
        "input",
        "output",
        "stdout",
        "stderr",
        "body",
    }
)

# --- encoding --------------------------------------------------------------------------------


def row_args(events: Iterable[tuple[str, Mapping[str, Any]]]) -> list[str | int | bytes]:
    """The ARGV tail of rows to write: ``type, data JSON`` per row (data already clean)."""
    args: list[str | int | bytes] = []
    for etype, data in events:
        args += [etype, dumps(data)]
    return args


def check_event_type(etype: str) -> None:
    """A runner's event type: the grammar, and not one of the service's own rows."""
    if not _EVENT_TYPE_RE.match(etype) or etype in RESERVED_EVENT_TYPES:
        raise ConversationError(
            Code.INVALID_REQUEST, f"event type {etype[:64]!r} is invalid or reserved"
        )


def message_event(entry_id: str, content: str, truncated: bool) -> dict[str, Any]:
    """A message on the ledger: already redacted; local paths become ``[PATH]`` here
    (the entry itself keeps the text the agent works with)."""
    event: dict[str, Any] = {"entryId": entry_id, "content": scrub_paths(content)}
    if truncated:
        event["truncated"] = True
    return event


def event_data(data: Mapping[str, Any]) -> dict[str, Any]:
    """Runner event data -> ledger data: raw fields omitted, paths/secrets redacted, cut."""
    if not isinstance(data, Mapping):
        raise ConversationError(Code.INVALID_REQUEST, "event data must be a mapping")
    try:
        summary = _summarize(data, 0)
        redacted, _ = redact_json(summary, max_depth=32)
    except (MemtierValidationError, TypeError, ValueError) as exc:
        raise ConversationError(Code.INVALID_REQUEST, f"event data is not JSON: {exc}") from None
    encoded = dumps(redacted)
    cap = limits.THREAD_EVENT_BYTES
    if len(encoded.encode("utf-8")) <= cap:
        return dict(redacted)
    preview = sanitized(encoded, cap - 256).text
    return {"truncated": True, "preview": preview}


def _summarize(node: Any, depth: int) -> Any:
    """Copy of event data with raw payload fields omitted and local paths scrubbed."""
    if depth > _MAX_SUMMARY_DEPTH:
        return "[omitted: nested too deeply]"
    if isinstance(node, str):
        return scrub_paths(node)
    if node is None or isinstance(node, bool | int | float):
        return node
    if isinstance(node, Mapping):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if not isinstance(key, str):
                raise TypeError("event data keys must be strings")
            if key.lower().replace("_", "").replace("-", "") in RAW_PAYLOAD_KEYS:
                out[key] = {"omitted": True}
            else:
                out[scrub_paths(key)] = _summarize(value, depth + 1)
        return out
    if isinstance(node, list | tuple):
        return [_summarize(item, depth + 1) for item in node]
    raise TypeError(f"not JSON: {type(node).__name__}")


# --- decoding --------------------------------------------------------------------------------


def served_payload(data: str) -> dict[str, Any] | None:
    """A stored row's data JSON as it may be served, or None when it may not be (not a
    JSON object, or not redactable).  A pure function of ``data``."""
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(payload, dict):
        return None
    try:
        # Checked on read too: a row written by an older version or by hand may
        # still hold a secret or a local path; it is redacted before it is served.
        served = served_json(payload, scrub=True)
    except (MemtierValidationError, TypeError, ValueError):
        return None
    return served if isinstance(served, dict) else None


def decode_row(
    row_id: str, etype: str, data: str, run: str, redacted: str, thread_id: str
) -> EventRecord | None:
    """A stored row -> record, or None when it may not be served (not written through the
    redactor, not a JSON object, or not redactable)."""
    if redacted != "1":
        return None  # rows not written through the redactor are never served
    payload = served_payload(data)
    return None if payload is None else _record(row_id, etype, payload, run, thread_id)


# The fields a validating EventRecord(...) call below would be given (``redacted`` keeps
# its default).
_RECORD_FIELDS_SET: Final = frozenset(
    {"id", "thread_id", "type", "timestamp", "request_id", "data"}
)


def _record(
    row_id: str, etype: str, payload: dict[str, Any], run: str, thread_id: str
) -> EventRecord:
    """A served row's record, built unvalidated (:func:`memtier.trustedmodels.trusted`):
    every value already has its field's type (strs of the reply, the time from the row
    id, ``payload`` a JSON object decoded for this record alone); validating took ~3 us
    a row, a third of a replay page's client work (tests/threads/test_event_records.py
    holds it to the validated record)."""
    timestamp = ms_to_datetime(int(row_id.split("-", 1)[0]))
    values = {
        "id": row_id,
        "thread_id": thread_id,
        "type": etype,
        "timestamp": timestamp,
        "request_id": run or None,
        "data": payload,
        "redacted": True,
    }
    return trusted(EventRecord, values, _RECORD_FIELDS_SET)


def exported_thread(thread: ConversationThread) -> ConversationThread:
    """The thread as export serves it: no local paths in its title or metadata."""
    return thread.model_copy(
        update={
            "title": None if thread.title is None else scrub_paths(thread.title),
            "metadata": scrub_json_paths(thread.metadata),
        }
    )


# --- the reading flows -----------------------------------------------------------------------

_Page = tuple[list[EventRecord], bool, str | None, bool, str]


def _read_page(
    core: ThreadsCore, owner: Ownership, keys: ThreadKeys, position: str | None, count: int
) -> Plan[_Page]:
    """One page: (records, more, last position, a turn is running, newest row's type)."""
    start = "-" if position is None else "(" + position
    reply = yield thread_call(
        READ_EVENTS,
        keys,
        marker=MARKER,
        start=start,
        count=count + 1,
        tenant=owner.tenant_id,
        user=owner.user_id,
    )
    if int(reply[0]) != ThreadStatus.OK:
        raise status_error(int(reply[0]))
    running, newest_type = int(reply[1]) == 1, text(reply[2])
    rows = reply[3:]
    total = len(rows) // _ROW_FIELDS
    more = total > count
    records: list[EventRecord] = []
    last = position
    thread_id = keys.thread.rsplit(":t:", 1)[1]
    served_rows = core.served_rows
    memo = served_rows.memo(keys.thread)
    for i in range(min(total, count)):
        row_id, etype, data, run, redacted = (
            text(x) for x in rows[_ROW_FIELDS * i : _ROW_FIELDS * (i + 1)]
        )
        last = row_id
        if redacted != "1":
            continue  # rows not written through the redactor are never served
        # decode_row, with what this thread's rows were served as before (ServedRows: the
        # same pure function of the row's data, computed once per distinct row)
        known = memo.get(data)
        if known is None:
            payload = served_payload(data)
            served = NOT_SERVABLE if payload is None else orjson.dumps(payload)
            served_rows.keep(keys.thread, memo, data, served)
        elif known == NOT_SERVABLE:
            payload = None
        else:
            payload = orjson.loads(known)  # a new dict for each record
        if payload is not None:
            records.append(_record(row_id, etype, payload, run, thread_id))
    return records, more, last, running, newest_type


def _position(
    core: ThreadsCore, owner: Ownership, thread_id: str, cursor: str | None
) -> Plan[tuple[str | None, ConversationError | None]]:
    """Decode a ledger cursor; the error is returned, raised only once the thread exists.

    So a wrong-owner or missing thread is ``not_found`` whatever cursor came with it.
    """
    if cursor is None:
        return None, None
    codec = yield from core.codec()
    try:
        position = codec.decode(
            cursor,
            CursorKind.LEDGER,
            tenant=owner.tenant_id,
            user=owner.user_id,
            thread_id=thread_id,
        )
    except ConversationError as exc:
        return None, exc
    if not _STREAM_ID_RE.match(position):
        return None, ConversationError(Code.INVALID_CURSOR, "invalid cursor")
    return position, None


def _cursor(core: ThreadsCore, owner: Ownership, thread_id: str, position: str) -> Plan[str]:
    codec = yield from core.codec()
    return codec.encode(
        CursorKind.LEDGER,
        position,
        tenant=owner.tenant_id,
        user=owner.user_id,
        thread_id=thread_id,
    )


def replay(
    core: ThreadsCore, owner: Ownership, thread_id: str, cursor: str | None, limit: int | None
) -> Plan[ReplayPage]:
    keys = thread_keys(core.keyspace, owner, thread_id)
    n = page_size(limit, core.config.replay_page_rows)
    position, cursor_error = yield from _position(core, owner, thread_id, cursor)
    page = yield from _read_page(core, owner, keys, position, n)
    records, more, last, running, newest_type = page
    if cursor_error is not None:
        raise cursor_error
    # More may come while rows remain or a turn still holds the lease (it is writing).
    terminal = not more and not running and newest_type in TERMINAL_EVENT_TYPES
    next_cursor = None
    if more or running:
        next_cursor = yield from _cursor(core, owner, thread_id, last or _LEDGER_START)
    return ReplayPage(records=tuple(records), next_cursor=next_cursor, terminal=terminal)


def export(
    core: ThreadsCore, owner: Ownership, thread_id: str, cursor: str | None
) -> Plan[ExportResult]:
    keys = thread_keys(core.keyspace, owner, thread_id)
    config = core.config
    position, cursor_error = yield from _position(core, owner, thread_id, cursor)
    raw = yield Command("hgetall", (keys.thread,))
    thread = exported_thread(thread_of(raw, owner, thread_id))
    if cursor_error is not None:
        raise cursor_error
    cap = config.export_bytes
    # the thread, the envelope ({"thread":..,"events":[..],"nextCursor":..}), then pages
    used = len(orjson.dumps(thread.to_wire())) + _EXPORT_ENVELOPE_BYTES
    events: list[EventRecord] = []
    truncated = False
    more = False
    for page in range(config.export_pages):
        records, more, last, _, _ = yield from _read_page(
            core, owner, keys, position, config.replay_page_rows
        )
        size = sum(len(orjson.dumps(r.to_wire())) + 1 for r in records)
        if used + size > cap:
            if page == 0:
                raise ConversationError(
                    Code.EXPORT_TOO_LARGE,
                    f"one page of events is larger than the export cap of {cap} bytes;"
                    " raise exportBytes or page with replay",
                    limit=cap,
                )
            truncated = True
            break
        events.extend(records)
        used += size
        position = last
        if not more:
            break
    else:
        truncated = more
    next_cursor = None
    if truncated and position is not None:
        next_cursor = yield from _cursor(core, owner, thread_id, position)
    return ExportResult(
        thread=thread, events=tuple(events), next_cursor=next_cursor, truncated=truncated
    )
