"""One exception hierarchy for memtier, each class with a stable code.

::

    MemtierError                     code, retryable, http_status
    ├── ConfigurationError           configuration_error  setting above its ceiling, bad DSN
    ├── ValidationError              invalid_input        input rejected before any I/O
    │   ├── UnsupportedChannelError  unsupported_channel  group/conference/unknown channel
    │   ├── TurnTooLargeError        turn_too_large       more than any session may hold
    │   ├── InvalidCursorError       invalid_cursor       a paging cursor that does not decode
    │   └── InvalidNameError         invalid_name         a tool/action name outside the grammar
    ├── CapacityError                capacity_exceeded    a bound refused the write
    │   └── SessionFullError         session_full         turn/byte/tool bounds of a session
    ├── BackendError                 backend_unavailable  Redis failed after bounded retries;
    │   │                                                 no attempt can have been applied
    │   ├── TransientBackendError    backend_transient    one transient failure (retried)
    │   ├── OutcomeUnknownError      outcome_unknown      an attempt may have been applied (its
    │   │                                                 reply was lost): retry with the same id
    │   ├── BackendRefusedError      backend_refused      Redis refused the command, nothing
    │   │                                                 applied: OOM, MISCONF, NOPERM, NOAUTH
    │   └── BackendBusyError         backend_busy         no free connection within the pool
    │                                                     timeout (back-pressure): nothing sent
    ├── ScriptError                  script_error         a script rejected its ARGV (a bug)
    ├── SnapshotError                snapshot_error       writing/reading a snapshot generation
    └── ConversationError            (threads)            one code per ConversationErrorCode

The code is the contract: HTTP bodies, metric labels and logs carry it.  The
mapping from code to HTTP status lives here and only here
(:func:`http_status_for`).  ``retryable`` is a property of the type, so the
tenacity predicate is one line.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar

__all__ = [
    "BackendBusyError",
    "BackendError",
    "BackendRefusedError",
    "CapacityError",
    "ConfigurationError",
    "ConversationError",
    "ConversationErrorCode",
    "ErrorCode",
    "InvalidCursorError",
    "InvalidNameError",
    "MemtierError",
    "OutcomeUnknownError",
    "ScriptError",
    "SessionFullError",
    "SnapshotError",
    "TransientBackendError",
    "TurnTooLargeError",
    "UnsupportedChannelError",
    "ValidationError",
    "http_status_for",
]


class ErrorCode(StrEnum):
    """Stable error codes of the memory tier (never renamed, only added)."""

    CONFIGURATION_ERROR = "configuration_error"
    INVALID_INPUT = "invalid_input"
    UNSUPPORTED_CHANNEL = "unsupported_channel"
    TURN_TOO_LARGE = "turn_too_large"
    INVALID_CURSOR = "invalid_cursor"
    INVALID_NAME = "invalid_name"
    CAPACITY_EXCEEDED = "capacity_exceeded"
    SESSION_FULL = "session_full"
    BACKEND_UNAVAILABLE = "backend_unavailable"
    BACKEND_TRANSIENT = "backend_transient"
    SCRIPT_ERROR = "script_error"
    SNAPSHOT_ERROR = "snapshot_error"
    OUTCOME_UNKNOWN = "outcome_unknown"
    BACKEND_REFUSED = "backend_refused"
    BACKEND_BUSY = "backend_busy"


class ConversationErrorCode(StrEnum):
    """Stable error codes of the conversation-threads service (spec wire names)."""

    INVALID_REQUEST = "invalid_request"
    UNAUTHORIZED = "unauthorized"
    NOT_FOUND = "not_found"
    THREAD_ARCHIVED = "thread_archived"
    METADATA_CONFLICT = "metadata_conflict"
    BRANCH_LIMIT = "branch_limit"
    UNKNOWN_LEAF = "unknown_leaf"
    INVALID_CURSOR = "invalid_cursor"
    CURSOR_THREAD_MISMATCH = "cursor_thread_mismatch"
    LIMIT_EXCEEDED = "limit_exceeded"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    EXPORT_TOO_LARGE = "export_too_large"
    REQUEST_IN_PROGRESS = "request_in_progress"
    RUNNER_FAILED = "runner_failed"
    BACKEND_UNAVAILABLE = "backend_unavailable"
    THREAD_BUSY = "thread_busy"
    REQUEST_CONFLICT = "request_conflict"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    RUN_CANCELLED = "run_cancelled"


_HTTP_STATUS: dict[str, int] = {
    # memory tier
    ErrorCode.CONFIGURATION_ERROR: 500,
    ErrorCode.INVALID_INPUT: 400,
    ErrorCode.UNSUPPORTED_CHANNEL: 400,
    ErrorCode.TURN_TOO_LARGE: 413,
    ErrorCode.INVALID_CURSOR: 400,
    ErrorCode.INVALID_NAME: 400,
    ErrorCode.CAPACITY_EXCEEDED: 507,
    ErrorCode.SESSION_FULL: 507,
    ErrorCode.BACKEND_UNAVAILABLE: 503,
    ErrorCode.BACKEND_TRANSIENT: 503,
    ErrorCode.SCRIPT_ERROR: 500,
    ErrorCode.SNAPSHOT_ERROR: 500,
    ErrorCode.OUTCOME_UNKNOWN: 503,
    ErrorCode.BACKEND_REFUSED: 507,
    ErrorCode.BACKEND_BUSY: 503,
    # threads
    ConversationErrorCode.INVALID_REQUEST: 400,
    ConversationErrorCode.UNAUTHORIZED: 401,
    ConversationErrorCode.NOT_FOUND: 404,
    ConversationErrorCode.THREAD_ARCHIVED: 409,
    ConversationErrorCode.METADATA_CONFLICT: 409,
    ConversationErrorCode.BRANCH_LIMIT: 409,
    ConversationErrorCode.UNKNOWN_LEAF: 400,
    ConversationErrorCode.INVALID_CURSOR: 400,
    ConversationErrorCode.CURSOR_THREAD_MISMATCH: 400,
    ConversationErrorCode.LIMIT_EXCEEDED: 400,
    ConversationErrorCode.PAYLOAD_TOO_LARGE: 413,
    ConversationErrorCode.EXPORT_TOO_LARGE: 413,
    ConversationErrorCode.REQUEST_IN_PROGRESS: 409,
    ConversationErrorCode.RUNNER_FAILED: 502,
    ConversationErrorCode.BACKEND_UNAVAILABLE: 503,
    ConversationErrorCode.THREAD_BUSY: 409,
    # The IETF Idempotency-Key draft (draft-ietf-httpapi-idempotency-key-header): a key
    # reused with another payload is 422; a request still running under the key is 409.
    ConversationErrorCode.REQUEST_CONFLICT: 422,
    ConversationErrorCode.UNSUPPORTED_MEDIA_TYPE: 415,
    ConversationErrorCode.METHOD_NOT_ALLOWED: 405,
    ConversationErrorCode.RUN_CANCELLED: 409,
}


def http_status_for(code: str) -> int:
    """The one mapping from a stable error code to an HTTP status (500 if unknown)."""
    return _HTTP_STATUS.get(code, 500)


class MemtierError(Exception):
    """Root of every error memtier raises on purpose.

    ``code`` is stable; ``details`` carries structured fields (never content or
    secrets); ``retryable`` says whether the same call may succeed unchanged.
    """

    default_code: ClassVar[str] = "internal_error"
    retryable: ClassVar[bool] = False

    def __init__(self, message: str, *, code: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.code: str = code or self.default_code
        self.details: dict[str, Any] = details

    @property
    def http_status(self) -> int:
        return http_status_for(self.code)

    def to_dict(self) -> dict[str, Any]:
        """The JSON error body: ``{"code": ..., "message": ..., **details}``."""
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        body.update(self.details)
        return body

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class ConfigurationError(MemtierError, ValueError):
    """A setting is invalid: above its hard ceiling, inconsistent, or an unknown DSN scheme.

    Also a ``ValueError``, as pydantic's ValidationError (which it replaces) is.
    """

    default_code = ErrorCode.CONFIGURATION_ERROR


class ValidationError(MemtierError):
    """Caller input was rejected before anything was sent to Redis."""

    default_code = ErrorCode.INVALID_INPUT


class UnsupportedChannelError(ValidationError):
    """Only ``public`` and ``im`` exist; group and conference are not representable."""

    default_code = ErrorCode.UNSUPPORTED_CHANNEL


class TurnTooLargeError(ValidationError):
    """A turn larger than any session may hold: refused rather than evicting everything."""

    default_code = ErrorCode.TURN_TOO_LARGE


class InvalidCursorError(ValidationError):
    """A paging cursor that is malformed or was not minted by this store."""

    default_code = ErrorCode.INVALID_CURSOR


class InvalidNameError(ValidationError):
    """A tool or action name outside the name grammar (see memtier.memory.models)."""

    default_code = ErrorCode.INVALID_NAME


class CapacityError(MemtierError):
    """A bound refused the write; nothing was stored."""

    default_code = ErrorCode.CAPACITY_EXCEEDED


class SessionFullError(CapacityError):
    """The session is at its turn, byte or tool-result bound and could not be compacted."""

    default_code = ErrorCode.SESSION_FULL


class BackendError(MemtierError):
    """Redis could not be reached or kept failing after bounded retries."""

    default_code = ErrorCode.BACKEND_UNAVAILABLE


class TransientBackendError(BackendError):
    """One transient Redis failure: reset, timeout, LOADING, BUSY, TRYAGAIN, CLUSTERDOWN."""

    default_code = ErrorCode.BACKEND_TRANSIENT
    retryable = True


class OutcomeUnknownError(BackendError):
    """Retries ran out after an attempt whose reply was lost: it may have been applied.

    Retrying the same call with the same turn id / request id is safe and tells which
    (a duplicate receipt, or the first result).  Raised instead of
    :class:`BackendError` only when some attempt may have reached Redis.
    """

    default_code = ErrorCode.OUTCOME_UNKNOWN
    retryable = True


class BackendRefusedError(BackendError):
    """Redis refused the command and applied nothing: OOM, MISCONF, NOPERM, NOAUTH.

    Not retryable unchanged: an operator has to act (memory, disk, ACL, credentials).
    """

    default_code = ErrorCode.BACKEND_REFUSED


class BackendBusyError(BackendError):
    """Back-pressure: no connection became free within the pool timeout; nothing was sent."""

    default_code = ErrorCode.BACKEND_BUSY
    retryable = True


class ScriptError(MemtierError):
    """A Lua script rejected its arguments: a bug in memtier, never a caller mistake."""

    default_code = ErrorCode.SCRIPT_ERROR


class SnapshotError(MemtierError):
    """A snapshot generation could not be written or read."""

    default_code = ErrorCode.SNAPSHOT_ERROR


class ConversationError(MemtierError):
    """An error of the conversation-threads service (``code``: a ConversationErrorCode)."""

    default_code = ConversationErrorCode.INVALID_REQUEST

    def __init__(
        self, code: ConversationErrorCode | str, message: str | None = None, **details: Any
    ) -> None:
        super().__init__(message or str(code).replace("_", " "), code=str(code), **details)
