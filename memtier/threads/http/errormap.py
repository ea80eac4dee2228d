"""Errors on the threads HTTP API: the JSON error body, what a client may see of an
error, which codes each operation documents, and the framework's own errors.

Every status comes from the one table, :data:`memtier.errors.ERRORS`; every code
emitted here is an :class:`~memtier.errors.ErrorCode` member.
"""

from __future__ import annotations

import re
from typing import Any, Final

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError as PydanticValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from memtier.errors import (
    ERRORS,
    HTTP_STATUS_TITLES,
    THREADS_API_CODES,
    ConversationError,
    ErrorCode,
    MemtierError,
    ValidationError,
)

__all__ = [
    "JSON_TYPE",
    "error_response",
    "http_error",
    "invalid",
    "openapi_error_responses",
    "payload_too_large",
    "public_error",
    "route_error_codes",
    "status_table",
    "unauthorized",
    "unsupported_media_type",
    "validation_message",
]

JSON_TYPE: Final = "application/json"
_C = ErrorCode


def status_table() -> dict[str, int]:
    """Every conversation error code and its HTTP status (the documented mapping)."""
    return {code.value: ERRORS[code].status for code in THREADS_API_CODES}


def error_response(exc: MemtierError, headers: dict[str, str] | None = None) -> JSONResponse:
    """The JSON error body ``{"code", "message", ...}`` with the code's one status."""
    return JSONResponse(exc.to_dict(), status_code=exc.http_status, headers=headers)


def unauthorized() -> JSONResponse:
    exc = ConversationError(_C.UNAUTHORIZED, "authorization required")
    return error_response(exc, {"WWW-Authenticate": "Bearer"})


def payload_too_large(cap: int) -> JSONResponse:
    exc = ConversationError(
        _C.PAYLOAD_TOO_LARGE, f"request body larger than {cap} bytes", limit=cap
    )
    return error_response(exc)


def invalid(message: str) -> JSONResponse:
    return error_response(ConversationError(_C.INVALID_REQUEST, message))


def unsupported_media_type() -> JSONResponse:
    exc = ConversationError(
        _C.UNSUPPORTED_MEDIA_TYPE,
        f"unsupported media type: the request body must be {JSON_TYPE} (UTF-8)",
    )
    return error_response(exc)


def validation_message(exc: RequestValidationError | PydanticValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        loc = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
        msg = str(error.get("msg", "invalid"))
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "invalid request: " + "; ".join(parts)


def public_error(exc: MemtierError) -> MemtierError:
    """What a client may see of an error: conversation errors as they are; anything else
    (Redis down, a script bug) without its internal detail (addresses, key names)."""
    if isinstance(exc, ConversationError):
        return exc
    if isinstance(exc, ValidationError):
        return ConversationError(_C.INVALID_REQUEST, "invalid request")
    return ConversationError(
        _C.BACKEND_UNAVAILABLE, "the storage backend is unavailable; retry later"
    )


# The codes each operation can answer with, besides 401 unauthorized, 503
# backend_unavailable and 400 invalid_request, which every operation can.
_ROUTE_ERRORS: Final[dict[str, tuple[ErrorCode, ...]]] = {
    "createConversation": (
        _C.LIMIT_EXCEEDED,
        _C.METADATA_CONFLICT,
        _C.PAYLOAD_TOO_LARGE,
        _C.UNSUPPORTED_MEDIA_TYPE,
    ),
    "listConversations": (_C.LIMIT_EXCEEDED, _C.INVALID_CURSOR),
    "getConversation": (_C.NOT_FOUND,),
    "deleteConversation": (_C.NOT_FOUND,),
    "continueConversation": (
        _C.LIMIT_EXCEEDED,
        _C.UNKNOWN_LEAF,
        _C.NOT_FOUND,
        _C.THREAD_ARCHIVED,
        _C.THREAD_BUSY,
        _C.REQUEST_IN_PROGRESS,
        _C.REQUEST_CONFLICT,
        _C.PAYLOAD_TOO_LARGE,
        _C.UNSUPPORTED_MEDIA_TYPE,
        _C.RUNNER_FAILED,
        _C.RUN_CANCELLED,
    ),
    "cancelConversationRun": (_C.LIMIT_EXCEEDED, _C.NOT_FOUND),
    "branchConversation": (
        _C.UNKNOWN_LEAF,
        _C.NOT_FOUND,
        _C.METADATA_CONFLICT,
        _C.THREAD_ARCHIVED,
        _C.BRANCH_LIMIT,
        _C.PAYLOAD_TOO_LARGE,
        _C.UNSUPPORTED_MEDIA_TYPE,
    ),
    "archiveConversation": (
        _C.NOT_FOUND,
        _C.METADATA_CONFLICT,
        _C.PAYLOAD_TOO_LARGE,
        _C.UNSUPPORTED_MEDIA_TYPE,
    ),
    "exportConversation": (
        _C.LIMIT_EXCEEDED,
        _C.INVALID_CURSOR,
        _C.CURSOR_THREAD_MISMATCH,
        _C.NOT_FOUND,
        _C.PAYLOAD_TOO_LARGE,
        _C.EXPORT_TOO_LARGE,
        _C.UNSUPPORTED_MEDIA_TYPE,
    ),
    "replayConversation": (
        _C.LIMIT_EXCEEDED,
        _C.INVALID_CURSOR,
        _C.CURSOR_THREAD_MISMATCH,
        _C.NOT_FOUND,
    ),
}
_ALWAYS: Final = (_C.INVALID_REQUEST, _C.UNAUTHORIZED, _C.BACKEND_UNAVAILABLE)


def route_error_codes(operation_id: str) -> dict[int, list[str]]:
    """Status -> the error codes ``operation_id`` can answer with (what its document says)."""
    by_status: dict[int, list[str]] = {}
    for code in (*_ALWAYS, *_ROUTE_ERRORS[operation_id]):
        by_status.setdefault(ERRORS[code].status, []).append(code.value)
    return dict(sorted(by_status.items()))


def openapi_error_responses(operation_id: str) -> dict[int | str, dict[str, Any]]:
    """The error responses of ``operation_id`` in its OpenAPI entry (one per status)."""
    responses: dict[int | str, dict[str, Any]] = {}
    for status, codes in route_error_codes(operation_id).items():
        schema = {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string", "enum": codes},
                "message": {"type": "string"},
            },
            "additionalProperties": True,
        }
        responses[status] = {
            "description": f"{HTTP_STATUS_TITLES[status]}: {', '.join(codes)}",
            "content": {JSON_TYPE: {"schema": schema}},
        }
    return responses


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette/FastAPI's own errors (unknown path, wrong method) in the API's
    ``{code, message}`` shape with a documented code.  ``memtier serve`` installs it on
    its outer app too (a path its routes cannot match, e.g. one with a newline, never
    reaches the mounted API); a host mounting the API can do the same."""
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 405:
        code, message = _C.METHOD_NOT_ALLOWED, "method not allowed on this path"
    elif exc.status_code == 404:
        code, message = _C.NOT_FOUND, "no such path"
    else:
        code, message = _C.INVALID_REQUEST, "invalid request"
    error = error_response(ConversationError(code, message))
    if exc.status_code == 405:
        # Starlette names only the first route of the path: list every documented method.
        allow = _documented_methods(request) or (exc.headers or {}).get("Allow", "")
        if allow:
            error.headers["allow"] = allow
    return error


def _documented_methods(request: Request) -> str:
    """``Allow`` for the request's path: the methods its OpenAPI document lists for it."""
    openapi = getattr(request.app, "openapi", None)
    if openapi is None:
        return ""
    path = request.url.path
    methods: set[str] = set()
    for template, item in openapi().get("paths", {}).items():
        pattern = "".join(
            "[^/]+" if part.startswith("{") else re.escape(part)
            for part in re.split(r"(\{[^}]*\})", template)
        )
        if re.fullmatch(pattern, path):
            methods |= {method.upper() for method in item}
    return ", ".join(sorted(methods))
