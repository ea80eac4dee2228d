"""memtier's one error vocabulary: one code enum, one table, one class per code.

::

    MemtierError                       code, retryable, http_status, details
    ├── ConfigurationError             configuration_error
    ├── ValidationError                invalid_request      (was invalid_input)
    │   ├── UnsupportedChannelError    unsupported_channel
    │   ├── TurnTooLargeError          turn_too_large
    │   ├── InvalidCursorError         invalid_cursor
    │   └── InvalidNameError           invalid_name
    ├── CapacityError                  capacity_exceeded
    │   └── SessionFullError           session_full
    ├── BackendError                   backend_unavailable
    │   ├── TransientBackendError      backend_transient    (retried by memtier.retry)
    │   ├── OutcomeUnknownError        outcome_unknown
    │   ├── BackendRefusedError        backend_refused
    │   └── BackendBusyError           backend_busy
    ├── ScriptError                    script_error
    ├── SnapshotError                  snapshot_error
    └── ConversationError              the threads service: one subclass per code
        ├── InvalidRequestError        invalid_request
        ├── UnauthorizedError          unauthorized
        ├── NotFoundError              not_found
        ├── ThreadArchivedError        thread_archived
        ├── ...                        (see THREADS_API_CODES)
        └── RunCancelledError          run_cancelled

The code is the contract: HTTP bodies, metric labels and logs carry it.  Everything
else about a code -- its HTTP status, whether the same call may succeed unchanged
(``retryable``) and what it means -- is one row of :data:`ERRORS`
(:mod:`memtier.errorcodes`, re-exported here); the classes, :func:`http_status_for`,
the threads API's OpenAPI document and the docs tables all read that row.

Every class takes the same arguments, ``(message=None, **details)``.
``ConversationError(code, message=None, **details)`` is also a constructor: it builds
the threads class of ``code``, so ``except ThreadBusyError`` catches what the service
raised as ``ConversationError(ErrorCode.THREAD_BUSY, ...)``.

Three codes mean the same in memory and threads (``invalid_request``,
``invalid_cursor``, ``backend_unavailable``); each family has its own class for them
(``ValidationError`` / ``InvalidRequestError``, ...) so that ``except ConversationError``
and ``except ValidationError`` keep catching exactly what they caught before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from memtier.errorcodes import (
    ERRORS,
    HTTP_STATUS_TITLES,
    LEGACY_SPELLINGS,
    THREADS_API_CODES,
    ConversationErrorCode,
    ErrorCode,
    ErrorSpec,
    http_status_for,
)

__all__ = [
    "ERRORS",
    "HTTP_STATUS_TITLES",
    "LEGACY_SPELLINGS",
    "THREADS_API_CODES",
    "BackendBusyError",
    "BackendError",
    "BackendRefusedError",
    "BranchLimitError",
    "CapacityError",
    "ConfigurationError",
    "ConversationBackendError",
    "ConversationError",
    "ConversationErrorCode",
    "CursorThreadMismatchError",
    "ErrorCode",
    "ErrorSpec",
    "ExportTooLargeError",
    "InvalidCursorError",
    "InvalidNameError",
    "InvalidRequestError",
    "InvalidThreadCursorError",
    "LimitExceededError",
    "MemtierError",
    "MetadataConflictError",
    "MethodNotAllowedError",
    "NotFoundError",
    "OutcomeUnknownError",
    "PayloadTooLargeError",
    "RequestConflictError",
    "RequestInProgressError",
    "RunCancelledError",
    "RunnerFailedError",
    "ScriptError",
    "SessionFullError",
    "SnapshotError",
    "ThreadArchivedError",
    "ThreadBusyError",
    "TransientBackendError",
    "TurnTooLargeError",
    "UnauthorizedError",
    "UnknownLeafError",
    "UnsupportedChannelError",
    "UnsupportedMediaTypeError",
    "ValidationError",
    "conversation_error_class",
    "http_status_for",
]


class MemtierError(Exception):
    """Root of every error memtier raises on purpose.

    ``code`` is the class's; ``details`` carries structured fields (never content or
    secrets); ``retryable`` (from :data:`ERRORS`) says whether the same call may
    succeed unchanged -- the retry layer reads it (:func:`memtier.retry.classify`).
    """

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL_ERROR
    retryable: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.retryable = ERRORS[cls.code].retryable

    def __init__(self, message: str | None = None, **details: Any) -> None:
        if "code" in details:
            raise TypeError(f"{type(self).__name__} has the one code {self.code.value!r}")
        message = message or self.code.value.replace("_", " ")
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details

    @property
    def http_status(self) -> int:
        return ERRORS[self.code].status

    def to_dict(self) -> dict[str, Any]:
        """The JSON error body: ``{"code": ..., "message": ..., **details}``."""
        body: dict[str, Any] = {"code": self.code.value, "message": self.message}
        body.update(self.details)
        return body

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code.value!r}, message={self.message!r})"


# --- the memory tier and the Redis layer -----------------------------------------------------


class ConfigurationError(MemtierError, ValueError):
    """A setting is invalid: above its hard ceiling, inconsistent, or an unknown DSN scheme.

    Also a ``ValueError``, as pydantic's ValidationError (which it replaces) is.
    """

    code = ErrorCode.CONFIGURATION_ERROR


class ValidationError(MemtierError):
    """Caller input was rejected before anything was sent to Redis."""

    code = ErrorCode.INVALID_REQUEST


class UnsupportedChannelError(ValidationError):
    """Only ``public`` and ``im`` exist; group and conference are not representable."""

    code = ErrorCode.UNSUPPORTED_CHANNEL


class TurnTooLargeError(ValidationError):
    """A turn larger than any session may hold: refused rather than evicting everything."""

    code = ErrorCode.TURN_TOO_LARGE


class InvalidCursorError(ValidationError):
    """A paging cursor that is malformed or was not minted by this store."""

    code = ErrorCode.INVALID_CURSOR


class InvalidNameError(ValidationError):
    """A tool or action name outside the name grammar (see memtier.memory.models)."""

    code = ErrorCode.INVALID_NAME


class CapacityError(MemtierError):
    """A bound refused the write; nothing was stored."""

    code = ErrorCode.CAPACITY_EXCEEDED


class SessionFullError(CapacityError):
    """The session is at its turn, byte or tool-result bound and could not be compacted."""

    code = ErrorCode.SESSION_FULL


class BackendError(MemtierError):
    """Redis could not be reached or kept failing after bounded retries."""

    code = ErrorCode.BACKEND_UNAVAILABLE


class TransientBackendError(BackendError):
    """One transient failure memtier itself detected, nothing applied: a slot that moved
    under a replicated append, a cluster client that could not initialise.  Retried by
    :mod:`memtier.retry`; past the horizon the caller gets ``backend_unavailable``."""

    code = ErrorCode.BACKEND_TRANSIENT


class OutcomeUnknownError(BackendError):
    """Retries ran out after an attempt whose reply was lost: it may have been applied.

    Retrying the same call with the same turn id / request id is safe and tells which
    (a duplicate receipt, or the first result).  Raised instead of
    :class:`BackendError` only when some attempt may have reached Redis.
    """

    code = ErrorCode.OUTCOME_UNKNOWN


class BackendRefusedError(BackendError):
    """Redis refused the command and applied nothing: OOM, MISCONF, NOPERM, NOAUTH.

    Not retryable unchanged: an operator has to act (memory, disk, ACL, credentials).
    """

    code = ErrorCode.BACKEND_REFUSED


class BackendBusyError(BackendError):
    """Back-pressure: no connection became free within the pool timeout; nothing was sent."""

    code = ErrorCode.BACKEND_BUSY


class ScriptError(MemtierError):
    """A Lua script rejected its arguments: a bug in memtier, never a caller mistake."""

    code = ErrorCode.SCRIPT_ERROR


class SnapshotError(MemtierError):
    """A snapshot generation could not be written or read."""

    code = ErrorCode.SNAPSHOT_ERROR


# --- the conversation-threads service ----------------------------------------------------------

_T = TypeVar("_T")
_THREADS_CLASSES: dict[ErrorCode, type[ConversationError]] = {}


class _ByCode(type):
    """``ConversationError(code, message, **details)`` builds the class of ``code``."""

    def __call__(cls: type[_T], *args: Any, **kwargs: Any) -> _T:
        if cls is ConversationError:
            if not args:
                raise TypeError("ConversationError(code, message=None, **details)")
            return conversation_error_class(args[0])(*args[1:], **kwargs)  # type: ignore[return-value]
        return type.__call__(cls, *args, **kwargs)  # type: ignore[no-any-return]


class ConversationError(MemtierError, metaclass=_ByCode):
    """An error of the conversation-threads service; one subclass per code.

    ``ConversationError(code, message=None, **details)`` returns an instance of the
    subclass for ``code`` (:func:`conversation_error_class`); the subclasses themselves
    take ``(message=None, **details)`` like every memtier error.
    """

    code = ErrorCode.INVALID_REQUEST

    if TYPE_CHECKING:

        def __init__(
            self, code: ErrorCode | str, message: str | None = None, **details: Any
        ) -> None: ...

    def __init_subclass__(cls, register: bool = True, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if register:  # the first class of a code is its class (a host's subclass is not)
            _THREADS_CLASSES.setdefault(cls.code, cls)


class _ThreadsError(ConversationError, register=False):
    # The shared constructor of the per-code classes (ConversationError's own signature
    # is its factory's); no code's class itself.

    def __init__(self, message: str | None = None, **details: Any) -> None:
        MemtierError.__init__(self, message, **details)


def conversation_error_class(code: ErrorCode | str) -> type[ConversationError]:
    """The threads class of ``code`` (``ValueError`` for a code the service never raises)."""
    member = ErrorCode(code)
    try:
        return _THREADS_CLASSES[member]
    except KeyError:
        raise ValueError(f"{member.value!r} is not a conversation-threads code") from None


class InvalidRequestError(_ThreadsError):
    code = ErrorCode.INVALID_REQUEST


class UnauthorizedError(_ThreadsError):
    code = ErrorCode.UNAUTHORIZED


class NotFoundError(_ThreadsError):
    code = ErrorCode.NOT_FOUND


class ThreadArchivedError(_ThreadsError):
    code = ErrorCode.THREAD_ARCHIVED


class MetadataConflictError(_ThreadsError):
    code = ErrorCode.METADATA_CONFLICT


class BranchLimitError(_ThreadsError):
    code = ErrorCode.BRANCH_LIMIT


class UnknownLeafError(_ThreadsError):
    code = ErrorCode.UNKNOWN_LEAF


class InvalidThreadCursorError(_ThreadsError):
    code = ErrorCode.INVALID_CURSOR


class CursorThreadMismatchError(_ThreadsError):
    code = ErrorCode.CURSOR_THREAD_MISMATCH


class LimitExceededError(_ThreadsError):
    code = ErrorCode.LIMIT_EXCEEDED


class PayloadTooLargeError(_ThreadsError):
    code = ErrorCode.PAYLOAD_TOO_LARGE


class ExportTooLargeError(_ThreadsError):
    code = ErrorCode.EXPORT_TOO_LARGE


class RequestInProgressError(_ThreadsError):
    code = ErrorCode.REQUEST_IN_PROGRESS


class RunnerFailedError(_ThreadsError):
    code = ErrorCode.RUNNER_FAILED


class ConversationBackendError(_ThreadsError):
    code = ErrorCode.BACKEND_UNAVAILABLE


class ThreadBusyError(_ThreadsError):
    code = ErrorCode.THREAD_BUSY


class RequestConflictError(_ThreadsError):
    code = ErrorCode.REQUEST_CONFLICT


class UnsupportedMediaTypeError(_ThreadsError):
    code = ErrorCode.UNSUPPORTED_MEDIA_TYPE


class MethodNotAllowedError(_ThreadsError):
    code = ErrorCode.METHOD_NOT_ALLOWED


class RunCancelledError(_ThreadsError):
    code = ErrorCode.RUN_CANCELLED
