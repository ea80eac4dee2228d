"""The stored forms of a thread and of its entries: one owner that encodes and decodes each.

* the thread hash (``T:t:<id>``: marker, owner, title, metadata, state, branches, head,
  version, hold and the shared run-limit counters ``use.<meter>``), written by the
  scripts and read here into a :class:`~memtier.threads.models.ConversationThread`;
* an entry (``T:e:<id>`` field value): the JSON of one user or assistant message.

What is served is redacted again on the way out (a row written by hand or by an older
version never reaches a caller as it is).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from typing import Any, Final, TypeVar

import orjson

from memtier.errors import ConversationError, ErrorCode
from memtier.errors import ValidationError as MemtierValidationError
from memtier.redaction import served_json, served_text
from memtier.threads.models import (
    MARKER,
    BranchRef,
    ConversationEntry,
    ConversationThread,
    EntryRole,
    Ownership,
    ThreadState,
    ms_to_datetime,
)
from memtier.trustedmodels import trusted
from memtier.wire import text

__all__ = [
    "entry_from_json",
    "entry_from_row",
    "entry_row",
    "pairs",
    "text",
    "thread_from_fields",
    "thread_of",
]


_E = TypeVar("_E", bound=StrEnum)


def _by_value(enum: type[_E]) -> Callable[[Any], _E]:
    """``enum(value)`` as a dict lookup -- a tenth of the enum's own call, run for every
    entry and every thread a continue reads; a value that is not a member's still goes
    through the enum, which refuses it as before."""
    members = {member.value: member for member in enum}

    def member_of(value: Any) -> _E:
        found = members.get(value) if type(value) is str else None
        return enum(value) if found is None else found

    return member_of


_role: Final = _by_value(EntryRole)
_state: Final = _by_value(ThreadState)


def pairs(flat: Sequence[Any]) -> dict[str, str]:
    """A flat ``field, value, ...`` reply (HGETALL inside a script) as a dict."""
    try:  # all bytes (memtier's clients): decoded in C, UTF-8 strict as text() does
        decoded = list(map(bytes.decode, flat))
    except TypeError:  # str (decode_responses=True) or numbers among them
        decoded = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in flat]
    # An odd last element is left out (as the pairwise reading always did).
    fields = iter(decoded)
    return dict(zip(fields, fields, strict=False))


def usage_of(fields: Mapping[str, str]) -> dict[str, int]:
    """The shared run-limit counters of a thread hash (``use.<meter>`` fields)."""
    usage: dict[str, int] = {}
    for name, value in fields.items():
        if name.startswith("use."):
            try:
                usage[name[4:]] = int(value)
            except ValueError:
                continue
    return usage


def thread_from_fields(
    fields: Mapping[str, str], owner: Ownership, thread_id: str
) -> ConversationThread:
    """A stored thread hash -> model; anything not this owner's thread is not-found.

    Built without validation: every value below is made here with its field's type (a
    value that cannot be -- an unknown state, a count that is not a number -- raises
    before the model is built, as validation would); validating a thread on every claim
    was a twentieth of a continue's client work (tests/threads/test_thread_records.py
    compares the result with a validated instance)."""
    if (
        fields.get("marker") != MARKER
        or fields.get("id") != thread_id
        or fields.get("tenant") != owner.tenant_id
        or fields.get("user") != owner.user_id
    ):
        raise ConversationError(ErrorCode.NOT_FOUND, "conversation not found")
    branches = tuple(
        trusted(
            BranchRef,
            {"leaf_id": str(ref["leafId"]), "created_at": ms_to_datetime(int(ref["createdAt"]))},
        )
        for ref in (orjson.loads(fields.get("branches") or "[]") or [])
    )
    title = fields.get("title")
    stored_metadata = fields.get("metadata")
    metadata: Any = {}  # (none, the usual case: nothing to decode or redact)
    if stored_metadata and stored_metadata != "{}":
        try:
            metadata = served_json(orjson.loads(stored_metadata), scrub=False)
        except (MemtierValidationError, orjson.JSONDecodeError):
            metadata = {}  # a row written by hand beyond the bounds: never served as is
        if not isinstance(metadata, dict):
            metadata = {}
    values = {  # every field, in declaration order (trusted's contract)
        "id": thread_id,
        "title": None if title is None else served_text(title, scrub=False),
        "state": _state(fields.get("state", "active")),
        "branches": branches,
        "created_at": ms_to_datetime(int(fields["created"])),
        "updated_at": ms_to_datetime(int(fields["updated"])),
        "tenant_id": owner.tenant_id,
        "user_id": owner.user_id,
        "metadata": metadata,
        "version": int(fields["version"]),
        "head_id": fields.get("head") or None,
        "legal_hold": fields.get("held") == "1",
        "usage": usage_of(fields),
    }
    return trusted(ConversationThread, values)


def thread_of(
    raw: Mapping[Any, Any] | None, owner: Ownership, thread_id: str
) -> ConversationThread:
    """An HGETALL reply of a thread hash -> model (see :func:`thread_from_fields`)."""
    fields = {text(k): text(v) for k, v in (raw or {}).items()}
    return thread_from_fields(fields, owner, thread_id)


def entry_row(
    entry_id: str,
    parent_id: str,
    role: str,
    content: str,
    created_ms: int,
    request_id: str,
    truncated: bool,
) -> dict[str, Any]:
    """One entry as it is stored (JSON object; ``truncated`` only when the text was cut)."""
    row: dict[str, Any] = {
        "id": entry_id,
        "parentId": parent_id,
        "role": role,
        "content": content,
        "createdAt": created_ms,
        "requestId": request_id,
    }
    if truncated:
        row["truncated"] = True
    return row


def entry_from_json(raw: str | bytes) -> ConversationEntry:
    """A stored entry (its JSON) -> model."""
    return entry_from_row(orjson.loads(raw))


def entry_from_row(data: Mapping[str, Any]) -> ConversationEntry:
    """A stored entry (its decoded JSON, or the row :func:`entry_row` built) -> model.

    Built without validation when every value has the type :func:`entry_row` gives it
    (the rows memtier wrote): validating four entries per turn was a tenth of a
    continue's model work.  Any other row is validated, and refused as it always was."""
    values = {  # built in the order errors had (a bad role before a missing content)
        "id": data["id"],
        "parent_id": data.get("parentId") or None,
        "role": _role(data["role"]),
        "content": data["content"],
        "created_at": ms_to_datetime(int(data["createdAt"])),
        "request_id": data.get("requestId"),
        "truncated": True if data.get("truncated") else None,
    }
    parent, request_id = values["parent_id"], values["request_id"]
    if (
        type(values["id"]) is str
        and type(values["content"]) is str
        and (parent is None or type(parent) is str)
        and (request_id is None or type(request_id) is str)
    ):
        return trusted(ConversationEntry, values)
    return ConversationEntry(**values)
