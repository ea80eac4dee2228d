"""Validation of what callers pass to the threads service, before any I/O.

Each check raises :class:`~memtier.errors.ConversationError` with a stable code
(``invalid_request``, ``limit_exceeded``, ``not_found`` for an id that cannot be one of
the caller's threads) and returns the value in the form the flows store.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any, Final

import orjson

from memtier import limits
from memtier.errors import ConversationError, ErrorCode
from memtier.errors import ValidationError as MemtierValidationError
from memtier.keys import THREAD_ID_RE, OwnerKeys, ThreadKeys, ThreadKeyspace
from memtier.redaction import SanitizedText, contains_secret, redact_json, sanitize
from memtier.threads.models import Ownership

__all__ = [
    "CREATE_ID_RE",
    "RESERVED_THREAD_IDS",
    "create_thread_id",
    "dumps",
    "fingerprint",
    "message_text",
    "metadata_json",
    "owner_keys",
    "page_size",
    "sanitized",
    "thread_keys",
    "title_text",
    "valid_entry_id",
    "valid_request_id",
    "valid_version",
]

Code = ErrorCode

# The grammar of an id given to create: 1..128 of [A-Za-z0-9_.-], not starting with "."
# (so never "." or "..", which clients normalise away in URLs), and not a route segment
# of the HTTP API (``{base}/openapi.json`` would shadow ``GET {base}/{id}``).
CREATE_ID_RE: Final = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.\-]{0,127}\Z")
RESERVED_THREAD_IDS: Final = frozenset(
    {"openapi.json", "events", "continue", "branch", "archive", "export", "docs", "redoc"}
)
_ENTRY_ID_RE: Final = THREAD_ID_RE


def utf8_len(text: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ConversationError(Code.INVALID_REQUEST, "text is not valid Unicode") from None


def dumps(value: Any) -> str:
    """Compact JSON text (what the scripts store)."""
    return orjson.dumps(value).decode("utf-8")


def fingerprint(value: Any) -> str:
    """sha256 of the JSON of ``value``: what makes two requests "the same"."""
    return hashlib.sha256(orjson.dumps(value)).hexdigest()


def owner_keys(keyspace: ThreadKeyspace, owner: Ownership) -> OwnerKeys:
    if not isinstance(owner, Ownership):
        raise ConversationError(Code.INVALID_REQUEST, "ownership must be an Ownership")
    return keyspace.owner(owner.tenant_id, owner.user_id)


def thread_keys(keyspace: ThreadKeyspace, owner: Ownership, thread_id: str) -> ThreadKeys:
    okeys = owner_keys(keyspace, owner)
    if not isinstance(thread_id, str) or not THREAD_ID_RE.match(thread_id):
        # Not a possible id, so certainly not one of the caller's threads.
        raise ConversationError(Code.NOT_FOUND, "conversation not found")
    return okeys.thread(thread_id)


def page_size(limit: int | None, ceiling: int) -> int:
    if limit is None:
        return ceiling
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConversationError(Code.INVALID_REQUEST, "limit must be a positive integer")
    if limit > ceiling:
        raise ConversationError(
            Code.LIMIT_EXCEEDED, f"limit must not exceed {ceiling}", limit=ceiling
        )
    return limit


def valid_request_id(value: str | None, cap: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConversationError(Code.INVALID_REQUEST, "requestId must be a non-empty string")
    if utf8_len(value) > cap:
        raise ConversationError(
            Code.LIMIT_EXCEEDED, f"requestId longer than {cap} bytes", limit=cap
        )
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in value):
        raise ConversationError(Code.INVALID_REQUEST, "requestId contains control characters")
    if contains_secret(value):
        raise ConversationError(Code.INVALID_REQUEST, "requestId looks like a credential")
    return value


def valid_entry_id(value: str, what: str = "leafId") -> str:
    if not isinstance(value, str) or not _ENTRY_ID_RE.match(value):
        raise ConversationError(Code.INVALID_REQUEST, f"{what} is not a valid entry id")
    return value


def title_text(title: str | None, cap: int) -> str | None:
    if title is None:
        return None
    if not isinstance(title, str):
        raise ConversationError(Code.INVALID_REQUEST, "title must be a string")
    if utf8_len(title) > cap:
        raise ConversationError(Code.LIMIT_EXCEEDED, f"title longer than {cap} bytes", limit=cap)
    return sanitized(title, cap).text


def metadata_json(metadata: Mapping[str, Any] | None) -> str:
    if metadata is None:
        return "{}"
    if not isinstance(metadata, Mapping):
        raise ConversationError(Code.INVALID_REQUEST, "metadata must be a JSON object")
    try:
        encoded = orjson.dumps(dict(metadata))
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise ConversationError(Code.INVALID_REQUEST, f"metadata is not JSON: {exc}") from None
    cap = limits.THREAD_METADATA_BYTES
    if len(encoded) > cap:
        raise ConversationError(
            Code.LIMIT_EXCEEDED, f"metadata longer than {cap} bytes as JSON", limit=cap
        )
    try:
        redacted, _ = redact_json(orjson.loads(encoded), max_depth=32)
    except MemtierValidationError as exc:
        raise ConversationError(Code.INVALID_REQUEST, f"metadata: {exc.message}") from None
    return dumps(redacted)


def message_text(message: str) -> tuple[str, bool]:
    """(redacted, bounded message, whether it was cut)."""
    if not isinstance(message, str) or not message.strip():
        raise ConversationError(Code.INVALID_REQUEST, "message must be a non-empty string")
    cap = limits.THREAD_MESSAGE_BYTES
    if utf8_len(message) > cap:
        raise ConversationError(Code.LIMIT_EXCEEDED, f"message longer than {cap} bytes", limit=cap)
    done = sanitized(message, cap)
    return done.text, done.truncated


def sanitized(text: str, cap: int) -> SanitizedText:
    """``text`` redacted and cut to ``cap`` bytes (invalid text: ``invalid_request``)."""
    try:
        return sanitize(text, cap)
    except MemtierValidationError as exc:
        raise ConversationError(Code.INVALID_REQUEST, exc.message) from None


def valid_version(given: int) -> int:
    if isinstance(given, bool) or not isinstance(given, int) or given < 0:
        raise ConversationError(Code.INVALID_REQUEST, "expectedVersion must be an integer >= 0")
    return given


def create_thread_id(thread_id: Any) -> str:
    """An id given to create, checked against the documented grammar (``invalid_request``)."""
    if (
        not isinstance(thread_id, str)
        or not CREATE_ID_RE.match(thread_id)
        or thread_id.lower() in RESERVED_THREAD_IDS
    ):
        raise ConversationError(
            Code.INVALID_REQUEST,
            "id must match [A-Za-z0-9_-][A-Za-z0-9_.-]{0,127} and not be a route name"
            " (openapi.json, events, continue, branch, archive, export)",
        )
    return thread_id
