"""The conversation-threads HTTP API: an ASGI app (FastAPI) a host mounts beside its own routes.

Why FastAPI (over plain Starlette): the OpenAPI document is generated from
the very pydantic models that define the wire format (:mod:`memtier.threads.models`),
so the served schema cannot drift from what the handlers accept and return;
request bodies are validated by the same models.  FastAPI is a thin layer
over Starlette, which a Starlette host can mount as any ASGI app.  FastAPI's
built-in OpenTelemetry hooks (recent versions) are switched off: memtier
reports through its own Prometheus metrics.

Routes (``{base}`` = ``/memtier/conversations`` unless configured)::

    POST   {base}                  create          201 ConversationThread
    GET    {base}?cursor=&limit=   list            200 ThreadPage
    GET    {base}/{id}             get             200 ConversationThread
    DELETE {base}/{id}             delete          200 {deleted, held}
    POST   {base}/{id}/continue    continue        200 ContinueResult
    POST   {base}/{id}/branch      branch          200 ConversationThread
    POST   {base}/{id}/archive     archive         200 ConversationThread
    POST   {base}/{id}/export      export          200 ExportResult
    GET    {base}/{id}/events?cursor=&limit=       200 ReplayPage (replay)
    GET    {base}/openapi.json     the OpenAPI document (no authorization)

Order of checks for every API request, before any business rule:

1. ``authorize(request)`` -> :class:`Ownership`, or ``None`` / a raised
   ``ConversationError(unauthorized)``: **401** ``unauthorized``.  It sees the
   headers only; the body has not been read.
2. The body cap (``request_body_bytes``: 64 KiB default, 1 MiB hard cap):
   a ``Content-Length`` above it, or a streamed (chunked) body growing past it,
   is refused with **413** ``payload_too_large`` *before* anything is parsed;
   at most cap + one chunk is ever buffered.
3. JSON parsing and validation against the request model: **400**
   ``invalid_request`` (unknown fields are refused).
4. The service call; every :class:`~memtier.errors.ConversationError` code maps
   to one status through :func:`memtier.errors.http_status_for`.

Error bodies are always ``{"code": "<stable code>", "message": "...", ...}``.
A thread of another owner and a missing thread give byte-identical 404s.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeAlias, cast

from fastapi import APIRouter, Depends, FastAPI, Query
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive

from memtier.config import ThreadsConfig
from memtier.errors import (
    ConfigurationError,
    ConversationError,
    ConversationErrorCode,
    MemtierError,
    http_status_for,
)
from memtier.threads.aio import AsyncConversationService
from memtier.threads.models import (
    ArchiveRequest,
    BranchRequest,
    ContinueRequest,
    ContinueResult,
    ConversationThread,
    CreateThreadRequest,
    DeleteResult,
    ErrorBody,
    ExportRequest,
    ExportResult,
    Ownership,
    ReplayPage,
    ThreadPage,
)
from memtier.threads.service import ConversationService

__all__ = [
    "DEFAULT_BASE_PATH",
    "Authorize",
    "create_conversation_app",
    "create_conversation_router",
    "error_response",
    "status_table",
]

DEFAULT_BASE_PATH = "/memtier/conversations"

Authorize: TypeAlias = Callable[[Request], "Ownership | Awaitable[Ownership | None] | None"]
Service: TypeAlias = AsyncConversationService | ConversationService

_STATE_KEY = "memtier_ownership"
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def status_table() -> dict[str, int]:
    """Every conversation error code and its HTTP status (the documented mapping)."""
    return {code.value: http_status_for(code) for code in ConversationErrorCode}


def error_response(exc: MemtierError, headers: dict[str, str] | None = None) -> JSONResponse:
    """The JSON error body ``{"code", "message", ...}`` with the code's one status."""
    return JSONResponse(exc.to_dict(), status_code=exc.http_status, headers=headers)


def _unauthorized() -> JSONResponse:
    exc = ConversationError(ConversationErrorCode.UNAUTHORIZED, "authorization required")
    return error_response(exc, {"WWW-Authenticate": "Bearer"})


def _payload_too_large(cap: int) -> JSONResponse:
    exc = ConversationError(
        ConversationErrorCode.PAYLOAD_TOO_LARGE,
        f"request body larger than {cap} bytes",
        limit=cap,
    )
    return error_response(exc)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        loc = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
        msg = str(error.get("msg", "invalid"))
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "invalid request: " + "; ".join(parts)


class _BodyTooLarge(Exception):
    pass


async def _read_capped(request: Request, cap: int) -> bytes:
    """The whole body, or _BodyTooLarge as soon as it passes ``cap`` (never buffers more)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > cap:
                raise _BodyTooLarge
        except ValueError:
            raise _BodyTooLarge from None  # unparseable length: refuse, do not guess
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise _BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _replay_receive(body: bytes) -> Receive:
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    return receive


def _guarded_route_class(authorize: Authorize, body_cap: int) -> type[APIRoute]:
    """An APIRoute that authorizes, then caps the body, before FastAPI parses anything."""

    class GuardedRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def guarded(request: Request) -> Response:
                try:
                    owner = authorize(request)
                    if inspect.isawaitable(owner):
                        owner = await owner
                except ConversationError as exc:
                    if exc.code == ConversationErrorCode.UNAUTHORIZED:
                        return _unauthorized()
                    return error_response(exc)
                if not isinstance(owner, Ownership):
                    return _unauthorized()
                if request.method in _BODY_METHODS:
                    try:
                        body = await _read_capped(request, body_cap)
                    except _BodyTooLarge:
                        return _payload_too_large(body_cap)
                    request = Request(request.scope, receive=_replay_receive(body))
                request.state.__setattr__(_STATE_KEY, owner)
                try:
                    return await handler(request)
                except RequestValidationError as exc:
                    error = ConversationError(
                        ConversationErrorCode.INVALID_REQUEST, _validation_message(exc)
                    )
                    return error_response(error)
                except MemtierError as exc:
                    return error_response(exc)

            return guarded

    return GuardedRoute


def _ownership(request: Request) -> Ownership:
    return cast(Ownership, getattr(request.state, _STATE_KEY))


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    described = {
        400: "invalid_request, limit_exceeded, unknown_leaf, invalid_cursor, "
        "cursor_thread_mismatch",
        401: "unauthorized",
        404: "not_found (also for a thread of another owner)",
        409: "metadata_conflict, thread_archived, branch_limit, thread_busy, "
        "request_in_progress, request_conflict",
        413: "payload_too_large, export_too_large",
        502: "runner_failed",
        503: "backend_unavailable",
    }
    return {
        status: {"model": ErrorBody, "description": described[status]}
        for status in (401, 503, *statuses)
    }


_BASE_PATH_RE = re.compile(r"^(/[A-Za-z0-9_.~-]+)+\Z")


def _base(base_path: str) -> str:
    """``/a/b`` (no trailing slash); anything else is a configuration error."""
    base = base_path.rstrip("/")
    if not _BASE_PATH_RE.match(base):
        raise ConfigurationError(f"base path {base_path!r} must look like /memtier/conversations")
    return base


def create_conversation_router(
    service: Service,
    authorize: Authorize,
    *,
    base_path: str = DEFAULT_BASE_PATH,
    limits: ThreadsConfig | None = None,
) -> APIRouter:
    """The API's routes, for a FastAPI host: ``host.include_router(router)``.

    ``service`` is an :class:`AsyncConversationService` (preferred) or a sync
    :class:`ConversationService` (its calls then run in Starlette's threadpool).
    ``limits`` may lower the service's ``request_body_bytes``, never raise it.
    """
    base = _base(base_path)
    cap = service.limits.request_body_bytes
    if limits is not None:
        cap = min(cap, limits.request_body_bytes)
    router = APIRouter(route_class=_guarded_route_class(authorize, cap))
    owner_dep = Depends(_ownership)

    async def call(name: str, *args: Any, **kwargs: Any) -> Any:
        method = getattr(service, name)
        if isinstance(service, AsyncConversationService):
            return await method(*args, **kwargs)
        return await run_in_threadpool(method, *args, **kwargs)

    @router.post(
        base,
        status_code=201,
        response_model=ConversationThread,
        response_model_exclude_none=True,
        responses=_errors(400, 409, 413),
        summary="Create a thread (create-only; an identical repeat returns it)",
        operation_id="createConversation",
    )
    async def create(
        body: CreateThreadRequest | None = None, owner: Ownership = owner_dep
    ) -> ConversationThread:
        req = body or CreateThreadRequest()
        result: ConversationThread = await call(
            "create",
            owner,
            title=req.title,
            thread_id=req.id,
            request_id=req.request_id,
            metadata=req.metadata,
        )
        return result

    @router.get(
        base,
        response_model=ThreadPage,
        response_model_exclude_none=True,
        responses=_errors(400),
        summary="List the caller's threads, newest first",
        operation_id="listConversations",
    )
    async def list_threads(
        cursor: str | None = Query(default=None),
        limit: int | None = Query(default=None),
        owner: Ownership = owner_dep,
    ) -> ThreadPage:
        result: ThreadPage = await call("list", owner, cursor=cursor, limit=limit)
        return result

    @router.get(
        base + "/{thread_id}",
        response_model=ConversationThread,
        response_model_exclude_none=True,
        responses=_errors(404),
        summary="Get one thread",
        operation_id="getConversation",
    )
    async def get(thread_id: str, owner: Ownership = owner_dep) -> ConversationThread:
        result: ConversationThread = await call("get", owner, thread_id)
        return result

    @router.delete(
        base + "/{thread_id}",
        response_model=DeleteResult,
        responses=_errors(404),
        summary="Delete a thread and everything it owns (unless under legal hold)",
        operation_id="deleteConversation",
    )
    async def delete(thread_id: str, owner: Ownership = owner_dep) -> DeleteResult:
        result: DeleteResult = await call("delete", owner, thread_id)
        return result

    @router.post(
        base + "/{thread_id}/continue",
        response_model=ContinueResult,
        response_model_exclude_none=True,
        responses=_errors(400, 404, 409, 413, 502),
        summary="Run one agent turn on the thread (idempotent by requestId)",
        operation_id="continueConversation",
    )
    async def continue_(
        thread_id: str, body: ContinueRequest, owner: Ownership = owner_dep
    ) -> ContinueResult:
        result: ContinueResult = await call(
            "continue_",
            owner,
            thread_id,
            body.message,
            request_id=body.request_id,
            leaf_id=body.leaf_id,
        )
        return result

    @router.post(
        base + "/{thread_id}/branch",
        response_model=ConversationThread,
        response_model_exclude_none=True,
        responses=_errors(400, 404, 409, 413),
        summary="Record a branch ref (compare-and-swap on the thread version)",
        operation_id="branchConversation",
    )
    async def branch(
        thread_id: str, body: BranchRequest, owner: Ownership = owner_dep
    ) -> ConversationThread:
        result: ConversationThread = await call(
            "branch", owner, thread_id, body.leaf_id, expected_version=body.expected_version
        )
        return result

    @router.post(
        base + "/{thread_id}/archive",
        response_model=ConversationThread,
        response_model_exclude_none=True,
        responses=_errors(400, 404, 409, 413),
        summary="Archive the thread (compare-and-swap; a no-op if archived)",
        operation_id="archiveConversation",
    )
    async def archive(
        thread_id: str, body: ArchiveRequest | None = None, owner: Ownership = owner_dep
    ) -> ConversationThread:
        version = body.expected_version if body is not None else None
        result: ConversationThread = await call(
            "archive", owner, thread_id, expected_version=version
        )
        return result

    @router.post(
        base + "/{thread_id}/export",
        response_model=ExportResult,
        response_model_exclude_none=True,
        responses=_errors(400, 404, 413),
        summary="Export the thread and its redacted ledger (capped, resumable)",
        operation_id="exportConversation",
    )
    async def export(
        thread_id: str, body: ExportRequest | None = None, owner: Ownership = owner_dep
    ) -> ExportResult:
        cursor = body.cursor if body is not None else None
        result: ExportResult = await call("export", owner, thread_id, cursor=cursor)
        return result

    @router.get(
        base + "/{thread_id}/events",
        response_model=ReplayPage,
        response_model_exclude_none=True,
        responses=_errors(400, 404),
        summary="Replay durable redacted events (reconnect with the last nextCursor)",
        operation_id="replayConversation",
    )
    async def events(
        thread_id: str,
        cursor: str | None = Query(default=None),
        limit: int | None = Query(default=None),
        owner: Ownership = owner_dep,
    ) -> ReplayPage:
        result: ReplayPage = await call("replay", owner, thread_id, cursor=cursor, limit=limit)
        return result

    return router


def _fastapi_options() -> dict[str, Any]:
    # Recent FastAPI versions ship OpenTelemetry hooks; memtier reports via Prometheus.
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters:
        return {
            "telemetry": {
                "tracing": False,
                "metrics": False,
                "logs": False,
                "operation_spans": False,
                "auto_configure": False,
            }
        }
    return {}


def create_conversation_app(
    service: Service,
    authorize: Authorize,
    *,
    base_path: str = DEFAULT_BASE_PATH,
    limits: ThreadsConfig | None = None,
) -> FastAPI:
    """An ASGI app serving the API under ``base_path`` (absolute paths).

    Mount it beside host routes, e.g. in Starlette
    ``Mount("/", app=create_conversation_app(...))`` after the host's own
    routes, or include :func:`create_conversation_router` in a FastAPI host.
    The OpenAPI document is served at ``{base_path}/openapi.json``.
    """
    base = _base(base_path)
    app = FastAPI(
        title="memtier conversation threads",
        version="1",
        openapi_url=f"{base}/openapi.json",
        docs_url=None,
        redoc_url=None,
        **_fastapi_options(),
    )
    app.include_router(
        create_conversation_router(service, authorize, base_path=base_path, limits=limits)
    )

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse(
            {"code": code, "message": str(exc.detail)},
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    app.add_exception_handler(StarletteHTTPException, http_error)
    return app
