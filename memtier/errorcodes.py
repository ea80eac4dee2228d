"""The codes of memtier's one error vocabulary and the one table about them.

:class:`ErrorCode` is the only error-code enum of the package; :data:`ERRORS` says, per
code, its HTTP status, whether the same call may succeed unchanged (``retryable``),
whether a Lua script's refusal maps to it (``from_script``, checked against the
scripts by tests/test_error_vocabulary.py) and what it means.  The exception classes
(:mod:`memtier.errors`), the threads API's OpenAPI document and the docs tables read it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

__all__ = [
    "ERRORS",
    "HTTP_STATUS_TITLES",
    "LEGACY_SPELLINGS",
    "THREADS_API_CODES",
    "ConversationErrorCode",
    "ErrorCode",
    "ErrorSpec",
    "http_status_for",
]

LEGACY_SPELLINGS: Final[Mapping[str, str]] = MappingProxyType({"invalid_input": "invalid_request"})


class ErrorCode(StrEnum):
    """Every stable error code of memtier (never renamed without a legacy spelling)."""

    # both tiers
    INVALID_REQUEST = "invalid_request"
    INVALID_CURSOR = "invalid_cursor"
    BACKEND_UNAVAILABLE = "backend_unavailable"
    # memory tier (and the Redis layer under both)
    INTERNAL_ERROR = "internal_error"
    CONFIGURATION_ERROR = "configuration_error"
    UNSUPPORTED_CHANNEL = "unsupported_channel"
    TURN_TOO_LARGE = "turn_too_large"
    INVALID_NAME = "invalid_name"
    CAPACITY_EXCEEDED = "capacity_exceeded"
    SESSION_FULL = "session_full"
    BACKEND_TRANSIENT = "backend_transient"
    SCRIPT_ERROR = "script_error"
    SNAPSHOT_ERROR = "snapshot_error"
    OUTCOME_UNKNOWN = "outcome_unknown"
    BACKEND_REFUSED = "backend_refused"
    BACKEND_BUSY = "backend_busy"
    # conversation threads (the HTTP API's wire names)
    UNAUTHORIZED = "unauthorized"
    NOT_FOUND = "not_found"
    THREAD_ARCHIVED = "thread_archived"
    METADATA_CONFLICT = "metadata_conflict"
    BRANCH_LIMIT = "branch_limit"
    UNKNOWN_LEAF = "unknown_leaf"
    CURSOR_THREAD_MISMATCH = "cursor_thread_mismatch"
    LIMIT_EXCEEDED = "limit_exceeded"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    EXPORT_TOO_LARGE = "export_too_large"
    REQUEST_IN_PROGRESS = "request_in_progress"
    RUNNER_FAILED = "runner_failed"
    THREAD_BUSY = "thread_busy"
    REQUEST_CONFLICT = "request_conflict"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    RUN_CANCELLED = "run_cancelled"
    # Deprecated Python name of INVALID_REQUEST (the memory tier's old spelling).
    INVALID_INPUT = "invalid_request"

    @classmethod
    def _missing_(cls, value: object) -> ErrorCode | None:
        if isinstance(value, str) and value in LEGACY_SPELLINGS:
            return cls(LEGACY_SPELLINGS[value])
        return None

    def __eq__(self, other: object) -> bool:
        # `exc.code == "invalid_input"` stays true for code written before the rename.
        # (Equality only: as a dict key or set member use the current spelling.)
        if isinstance(other, str) and not isinstance(other, ErrorCode):
            other = LEGACY_SPELLINGS.get(other, other)
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = str.__hash__


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    """What one code means: its HTTP status, whether the same call may succeed unchanged,
    where it comes from, and a description (the docs tables and the OpenAPI document).

    ``from_script``: some Lua script's refusal status maps to it (checked against the
    scripts by tests/test_error_vocabulary.py); False: raised by Python only.
    """

    status: int
    description: str
    retryable: bool = False
    from_script: bool = False


_E = ErrorCode

# The one table.  Row order is the enum's; the threads API's order is THREADS_API_CODES.
ERRORS: Final[Mapping[ErrorCode, ErrorSpec]] = MappingProxyType(
    {
        _E.INVALID_REQUEST: ErrorSpec(
            400,
            "malformed, non-UTF-8 or too deep JSON, unknown fields or query parameters,"
            " a wrong type, an invalid id or value",
        ),
        _E.INVALID_CURSOR: ErrorSpec(400, "a cursor that does not verify"),
        _E.BACKEND_UNAVAILABLE: ErrorSpec(503, "Redis unavailable after bounded retries"),
        _E.INTERNAL_ERROR: ErrorSpec(500, "the base class MemtierError itself (never raised)"),
        _E.CONFIGURATION_ERROR: ErrorSpec(
            500, "a setting above its hard ceiling, inconsistent, or an unknown DSN scheme"
        ),
        _E.UNSUPPORTED_CHANNEL: ErrorSpec(400, "a group, conference or unknown channel"),
        _E.TURN_TOO_LARGE: ErrorSpec(
            413, "a turn larger than any session may hold", from_script=True
        ),
        _E.INVALID_NAME: ErrorSpec(400, "a tool or action name outside the name grammar"),
        _E.CAPACITY_EXCEEDED: ErrorSpec(
            507, "eviction cannot make room within the aggregate bound", from_script=True
        ),
        _E.SESSION_FULL: ErrorSpec(
            507, "the session is at its turn, byte or tool-result bound", from_script=True
        ),
        _E.BACKEND_TRANSIENT: ErrorSpec(
            503, "one transient Redis failure, nothing applied (retried)", retryable=True
        ),
        _E.SCRIPT_ERROR: ErrorSpec(
            500, "a Lua script rejected its arguments (a bug in memtier)", from_script=True
        ),
        _E.SNAPSHOT_ERROR: ErrorSpec(500, "a snapshot generation could not be written or read"),
        _E.OUTCOME_UNKNOWN: ErrorSpec(
            503,
            "an attempt may have been applied (its reply was lost): retry with the same id",
            retryable=True,
        ),
        _E.BACKEND_REFUSED: ErrorSpec(
            507, "Redis refused the command, nothing applied: OOM, MISCONF, NOPERM, NOAUTH"
        ),
        _E.BACKEND_BUSY: ErrorSpec(
            503, "no free connection within the pool timeout; nothing sent", retryable=True
        ),
        _E.UNAUTHORIZED: ErrorSpec(
            401,
            "`authorize` refused the request, or its agent identity does not project onto"
            " its ownership",
        ),
        _E.NOT_FOUND: ErrorSpec(
            404, "no such thread for this owner (also another owner's thread)", from_script=True
        ),
        _E.THREAD_ARCHIVED: ErrorSpec(
            409, "continue or branch on an archived thread", from_script=True
        ),
        _E.METADATA_CONFLICT: ErrorSpec(
            409,
            "lost a compare-and-swap (branch, archive) or a true create+create race",
            from_script=True,
        ),
        _E.BRANCH_LIMIT: ErrorSpec(
            409, "the thread has its maximum of branch refs", from_script=True
        ),
        _E.UNKNOWN_LEAF: ErrorSpec(
            400,
            "`leafId` is not a branch ref (continue) or not an entry (branch)",
            from_script=True,
        ),
        _E.CURSOR_THREAD_MISMATCH: ErrorSpec(400, "a cursor minted for another thread"),
        _E.LIMIT_EXCEEDED: ErrorSpec(
            400,
            "a value above a frozen limit (title, request id, page size, cursor, run"
            ' options), a full thread, or a shared run limit (`limit: "run:<meter>"`)',
            from_script=True,
        ),
        _E.PAYLOAD_TOO_LARGE: ErrorSpec(413, "request body above `request_body_bytes`"),
        _E.EXPORT_TOO_LARGE: ErrorSpec(413, "one ledger page is larger than `export_bytes`"),
        _E.REQUEST_IN_PROGRESS: ErrorSpec(
            409, "the same `requestId` is still running", retryable=True, from_script=True
        ),
        _E.RUNNER_FAILED: ErrorSpec(502, "the runner raised"),
        _E.THREAD_BUSY: ErrorSpec(
            409, "another request's turn holds the thread", retryable=True, from_script=True
        ),
        # The IETF Idempotency-Key draft (draft-ietf-httpapi-idempotency-key-header): a key
        # reused with another payload is 422; a request still running under the key is 409.
        _E.REQUEST_CONFLICT: ErrorSpec(
            422,
            "`requestId` reused with another message or leaf (IETF Idempotency-Key draft)",
            from_script=True,
        ),
        _E.UNSUPPORTED_MEDIA_TYPE: ErrorSpec(
            415, "a body that is not `application/json` (or none where one is required)"
        ),
        _E.METHOD_NOT_ALLOWED: ErrorSpec(405, "a method the path does not have"),
        _E.RUN_CANCELLED: ErrorSpec(
            409,
            "the turn was cancelled (its caller, a shutdown); nothing was committed -- a"
            " retry is a new run",
            from_script=True,
        ),
    }
)

# The codes the conversation-threads HTTP API answers with, in its documented order
# (docs/threads.md, the OpenAPI document's x-memtier-error-codes).  A public wire promise.
THREADS_API_CODES: Final[tuple[ErrorCode, ...]] = (
    _E.INVALID_REQUEST,
    _E.UNAUTHORIZED,
    _E.NOT_FOUND,
    _E.THREAD_ARCHIVED,
    _E.METADATA_CONFLICT,
    _E.BRANCH_LIMIT,
    _E.UNKNOWN_LEAF,
    _E.INVALID_CURSOR,
    _E.CURSOR_THREAD_MISMATCH,
    _E.LIMIT_EXCEEDED,
    _E.PAYLOAD_TOO_LARGE,
    _E.EXPORT_TOO_LARGE,
    _E.REQUEST_IN_PROGRESS,
    _E.RUNNER_FAILED,
    _E.BACKEND_UNAVAILABLE,
    _E.THREAD_BUSY,
    _E.REQUEST_CONFLICT,
    _E.UNSUPPORTED_MEDIA_TYPE,
    _E.METHOD_NOT_ALLOWED,
    _E.RUN_CANCELLED,
)

# The heading of each HTTP status in the OpenAPI document ("<title>: <codes>").
HTTP_STATUS_TITLES: Final[Mapping[int, str]] = MappingProxyType(
    {
        400: "Invalid request",
        401: "Authorization required (Bearer token)",
        404: "No such thread for this owner (also a thread of another owner)",
        405: "Method not allowed",
        409: "Conflict",
        413: "Too large",
        415: "Unsupported media type (send application/json)",
        422: "The request id was already used for a different request (do not retry as is)",
        502: "The agent runner failed",
        503: "The storage backend is unavailable; retry later",
    }
)


def http_status_for(code: str) -> int:
    """The HTTP status of a stable error code (500 for a string that is no code)."""
    try:
        return ERRORS[ErrorCode(code)].status
    except ValueError:
        return 500


# --- deprecated -------------------------------------------------------------------------------


class _ThreadsCodes:
    """``ConversationErrorCode`` (deprecated): not a second enum, a view of :class:`ErrorCode`.

    Attribute access gives the ErrorCode member (``ConversationErrorCode.NOT_FOUND is
    ErrorCode.NOT_FOUND``); iterating gives the threads API's codes, as the old enum did.
    """

    __slots__ = ()

    def __getattr__(self, name: str) -> ErrorCode:
        try:
            return ErrorCode[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, name: str) -> ErrorCode:
        return ErrorCode[name]

    def __call__(self, value: str) -> ErrorCode:
        return ErrorCode(value)

    def __iter__(self) -> Iterator[ErrorCode]:
        return iter(THREADS_API_CODES)

    def __len__(self) -> int:
        return len(THREADS_API_CODES)

    def __contains__(self, value: object) -> bool:
        return value in THREADS_API_CODES

    def __repr__(self) -> str:
        return "<ConversationErrorCode: deprecated view of memtier.errors.ErrorCode>"


if TYPE_CHECKING:
    ConversationErrorCode = ErrorCode
else:
    ConversationErrorCode = _ThreadsCodes()
