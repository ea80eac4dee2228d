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
    DELETE {base}/{id}/runs/{requestId}   cancel  200 CancelResult
    GET    {base}/openapi.json     the OpenAPI document (no authorization)

Order of checks for every API request, before any business rule:

1. ``authorize(request)`` -> :class:`Ownership`, or ``None`` / a raised
   ``ConversationError(unauthorized)``: **401** ``unauthorized``.  It sees the
   headers only; the body has not been read.
2. The body cap (``request_body_bytes``: 64 KiB default, 1 MiB hard cap):
   a ``Content-Length`` above it, or a streamed (chunked) body growing past it,
   is refused with **413** ``payload_too_large`` *before* anything is parsed;
   at most cap + one chunk is ever buffered.
3. The media type: a body (and every request to a route whose body is
   required) must be ``application/json``, else **415** ``unsupported_media_type``.
4. Strict JSON parsing (UTF-8, no ``NaN``/``Infinity``, nesting at most
   ``MAX_JSON_DEPTH``) and strict validation against the request model, and
   of the query string (only the documented parameters, each once; ``limit``
   a decimal integer): **400** ``invalid_request`` (unknown fields are
   refused, there are no snake_case aliases, ``expectedVersion`` is an
   integer only).
5. The service call; every :class:`~memtier.errors.ConversationError` code maps
   to one status through :func:`memtier.errors.http_status_for`.

Error bodies are always ``{"code": "<stable code>", "message": "...", ...}`` --
also for an unknown path (404 ``not_found``) and a wrong method (405
``method_not_allowed``); they never carry the Redis address or other internal
detail.  A thread of another owner and a missing thread give byte-identical 404s.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeAlias, cast

import orjson
from fastapi import APIRouter, Depends, FastAPI, Query, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPBearer
from pydantic import BaseModel, Field, create_model
from pydantic import ValidationError as PydanticValidationError
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
    ValidationError,
    http_status_for,
)
from memtier.threads.aio import AsyncConversationService
from memtier.threads.models import (
    AgentIdentity,
    ArchiveRequest,
    BranchRequest,
    CancelResult,
    ContinueRequest,
    ContinueResult,
    ConversationThread,
    CreateThreadRequest,
    DeleteResult,
    ExportRequest,
    ExportResult,
    Ownership,
    Principal,
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
    "http_error",
    "status_table",
]

DEFAULT_BASE_PATH = "/memtier/conversations"

Authorize: TypeAlias = Callable[
    [Request], "Ownership | Principal | Awaitable[Ownership | Principal | None] | None"
]
Service: TypeAlias = AsyncConversationService | ConversationService

_STATE_KEY = "memtier_ownership"
_BODY_KEY = "memtier_body"
_IDENTITY_KEY = "memtier_identity"
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
MAX_JSON_DEPTH = 64  # deepest JSON nesting a request body may have
BEARER_SCHEME = "bearerAuth"
_JSON_TYPE = "application/json"
_LIMIT_RE = re.compile(r"^[1-9][0-9]{0,8}\Z")


@dataclass(frozen=True, slots=True)
class _BodySpec:
    """What one route accepts: its body model (or none), whether the body is required,
    and its query parameters."""

    model: type[BaseModel] | None = None
    required: bool = False
    query: frozenset[str] = frozenset()


_PAGED = frozenset({"cursor", "limit"})
_ROUTE_SPECS: dict[str, _BodySpec] = {
    "createConversation": _BodySpec(CreateThreadRequest),
    "listConversations": _BodySpec(query=_PAGED),
    "getConversation": _BodySpec(),
    "deleteConversation": _BodySpec(),
    "continueConversation": _BodySpec(ContinueRequest, required=True),
    "branchConversation": _BodySpec(BranchRequest, required=True),
    "archiveConversation": _BodySpec(ArchiveRequest),
    "exportConversation": _BodySpec(ExportRequest),
    "replayConversation": _BodySpec(query=_PAGED),
    "cancelConversationRun": _BodySpec(),
}


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


def _invalid(message: str) -> JSONResponse:
    return error_response(ConversationError(ConversationErrorCode.INVALID_REQUEST, message))


def _validation_message(exc: RequestValidationError | PydanticValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        loc = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
        msg = str(error.get("msg", "invalid"))
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "invalid request: " + "; ".join(parts)


class _BodyTooLarge(Exception):
    pass


def _json_depth_ok(value: Any, limit: int) -> bool:
    """True when ``value`` nests at most ``limit`` containers deep (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > limit:
                return False
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)
    return True


def _is_json_media_type(header: str | None) -> bool:
    if header is None:
        return False
    media_type, _, params = header.partition(";")
    if media_type.strip().lower() != _JSON_TYPE:
        return False
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in (
            "utf-8",
            "utf8",
        ):
            return False
    return True


def _parse_body(
    spec: _BodySpec, body: bytes, content_type: str | None
) -> BaseModel | Response | None:
    """The validated request model (or None for an absent optional body), or the error."""
    if spec.model is None:
        if body:
            return _invalid("invalid request: this operation takes no request body")
        return None
    if (body or spec.required) and not _is_json_media_type(content_type):
        exc = ConversationError(
            ConversationErrorCode.UNSUPPORTED_MEDIA_TYPE,
            f"unsupported media type: the request body must be {_JSON_TYPE} (UTF-8)",
        )
        return error_response(exc)
    if not body:
        if spec.required:
            return _invalid("invalid request: a JSON object body is required")
        return None
    try:
        parsed = orjson.loads(body)  # strict: UTF-8 only, no NaN/Infinity, no trailing data
    except orjson.JSONDecodeError:
        return _invalid("invalid request: the body is not valid JSON (UTF-8, no NaN/Infinity)")
    if parsed is None and not spec.required:
        return None  # the document allows `null` for an optional body: the same as none
    if not isinstance(parsed, dict):
        return _invalid("invalid request: the body must be a JSON object")
    if not _json_depth_ok(parsed, MAX_JSON_DEPTH):
        return _invalid(f"invalid request: JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        # strict in JSON mode all the way down (the host's run-options schema included)
        return spec.model.model_validate_json(body, strict=True)
    except PydanticValidationError as exc:
        return _invalid(_validation_message(exc))


def _check_query(spec: _BodySpec, request: Request) -> Response | None:
    names = [name for name, _ in request.query_params.multi_items()]
    for name in names:
        if name not in spec.query:
            return _invalid(f"invalid request: unknown query parameter {name[:64]!r}")
        if names.count(name) > 1:
            return _invalid(f"invalid request: query parameter {name!r} given more than once")
    limit = request.query_params.get("limit")
    if limit is not None and not _LIMIT_RE.match(limit):
        return _invalid("invalid request: limit must be a positive decimal integer")
    return None


def _public_error(exc: MemtierError) -> MemtierError:
    """What a client may see of an error: conversation errors as they are; anything else
    (Redis down, a script bug) without its internal detail (addresses, key names)."""
    if isinstance(exc, ConversationError):
        return exc
    if isinstance(exc, ValidationError):
        return ConversationError(ConversationErrorCode.INVALID_REQUEST, "invalid request")
    return ConversationError(
        ConversationErrorCode.BACKEND_UNAVAILABLE,
        "the storage backend is unavailable; retry later",
    )


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


def continue_request_model(schema: type[BaseModel] | None) -> type[ContinueRequest]:
    """The continue body: ``runOptions`` exists (typed by the host's schema) only when the
    service declares run options; otherwise it is an unknown field, refused."""
    if schema is None:
        return ContinueRequest
    field: Any = (schema | None, Field(default=None, alias="runOptions"))
    return create_model("ContinueRequest", __base__=ContinueRequest, run_options=field)


def _guarded_route_class(
    authorize: Authorize, body_cap: int, specs: dict[str, _BodySpec]
) -> type[APIRoute]:
    """An APIRoute that authorizes, then caps the body, before FastAPI parses anything."""

    class GuardedRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            spec = specs.get(self.operation_id or "", _BodySpec())

            async def guarded(request: Request) -> Response:
                try:
                    owner = authorize(request)
                    if inspect.isawaitable(owner):
                        owner = await owner
                except ConversationError as exc:
                    if exc.code == ConversationErrorCode.UNAUTHORIZED:
                        return _unauthorized()
                    return error_response(exc)
                identity: Any = None
                if isinstance(owner, Principal):
                    identity = owner.identity
                    owner = owner.ownership
                if not isinstance(owner, Ownership):
                    return _unauthorized()
                if identity is not None and not (
                    isinstance(identity, AgentIdentity) and identity.projects_onto(owner)
                ):
                    return _unauthorized()  # an identity never widens the ownership
                body = b""
                if request.method in _BODY_METHODS:
                    try:
                        body = await _read_capped(request, body_cap)
                    except _BodyTooLarge:
                        return _payload_too_large(body_cap)
                parsed = _parse_body(spec, body, request.headers.get("content-type"))
                if isinstance(parsed, Response):
                    return parsed
                refused = _check_query(spec, request)
                if refused is not None:
                    return refused
                if request.method in _BODY_METHODS:
                    # FastAPI sees only what passed the strict checks above (it re-reads
                    # the body for its own, lax, parsing; the handlers use `parsed`).
                    replay = body if parsed is not None else b""
                    request = Request(request.scope, receive=_replay_receive(replay))
                request.state.__setattr__(_STATE_KEY, owner)
                request.state.__setattr__(_IDENTITY_KEY, identity)
                request.state.__setattr__(_BODY_KEY, parsed)
                try:
                    return await handler(request)
                except RequestValidationError as exc:
                    return _invalid(_validation_message(exc))
                except MemtierError as exc:
                    return error_response(_public_error(exc))

            return guarded

    return GuardedRoute


def _ownership(request: Request) -> Ownership:
    return cast(Ownership, getattr(request.state, _STATE_KEY))


def _identity(request: Request) -> AgentIdentity | None:
    return cast("AgentIdentity | None", getattr(request.state, _IDENTITY_KEY, None))


def _body(request: Request) -> Any:
    return getattr(request.state, _BODY_KEY, None)


_C = ConversationErrorCode
_STATUS_DESCRIPTIONS: dict[int, str] = {
    400: "Invalid request",
    401: "Authorization required (Bearer token)",
    404: "No such thread for this owner (also a thread of another owner)",
    409: "Conflict",
    413: "Too large",
    415: "Unsupported media type (send application/json)",
    422: "The request id was already used for a different request (do not retry as is)",
    502: "The agent runner failed",
    503: "The storage backend is unavailable; retry later",
}
# The codes each operation can answer with, besides 401 unauthorized, 503
# backend_unavailable and 400 invalid_request, which every operation can.
_ROUTE_ERRORS: dict[str, tuple[ConversationErrorCode, ...]] = {
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
_ALWAYS = (_C.INVALID_REQUEST, _C.UNAUTHORIZED, _C.BACKEND_UNAVAILABLE)


def route_error_codes(operation_id: str) -> dict[int, list[str]]:
    """Status -> the error codes ``operation_id`` can answer with (what its document says)."""
    by_status: dict[int, list[str]] = {}
    for code in (*_ALWAYS, *_ROUTE_ERRORS[operation_id]):
        by_status.setdefault(http_status_for(code), []).append(code.value)
    return dict(sorted(by_status.items()))


def _errors(operation_id: str) -> dict[int | str, dict[str, Any]]:
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
            "description": f"{_STATUS_DESCRIPTIONS[status]}: {', '.join(codes)}",
            "content": {_JSON_TYPE: {"schema": schema}},
        }
    return responses


def _links(*targets: tuple[str, str]) -> dict[str, Any]:
    """OpenAPI links: (name, operationId) pairs, the thread id taken from this response."""
    return {
        name: {"operationId": operation_id, "parameters": {"thread_id": "$response.body#/id"}}
        for name, operation_id in targets
    }


_THREAD_LINKS = (
    ("GetConversation", "getConversation"),
    ("ContinueConversation", "continueConversation"),
    ("BranchConversation", "branchConversation"),
    ("ArchiveConversation", "archiveConversation"),
    ("ExportConversation", "exportConversation"),
    ("ReplayConversation", "replayConversation"),
    ("DeleteConversation", "deleteConversation"),
)


def _thread_links(*names: str) -> dict[str, Any]:
    return _links(*(t for t in _THREAD_LINKS if t[0] in names))


def _success(
    description: str, links: dict[str, Any], status: int = 200
) -> dict[int | str, dict[str, Any]]:
    return {status: {"description": description, "links": links}}


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
    Every route declares the Bearer security scheme (``bearerAuth``), so that
    generated clients send the token; ``authorize`` decides what it means.
    """
    base = _base(base_path)
    cap = service.limits.request_body_bytes
    if limits is not None:
        cap = min(cap, limits.request_body_bytes)
    bearer = HTTPBearer(auto_error=False, scheme_name=BEARER_SCHEME)
    continue_model = continue_request_model(service.core.run_options_schema)
    specs = dict(_ROUTE_SPECS)
    specs["continueConversation"] = _BodySpec(continue_model, required=True)
    router = APIRouter(
        route_class=_guarded_route_class(authorize, cap, specs), dependencies=[Security(bearer)]
    )
    owner_dep = Depends(_ownership)
    body_dep = Depends(_body)
    identity_dep = Depends(_identity)
    # The document states the configured caps; the service answers a value past them
    # with limit_exceeded (so they are documented here, not enforced by FastAPI).
    list_doc: dict[str, Any] = {"maximum": service.limits.list_page}
    replay_doc: dict[str, Any] = {"maximum": service.limits.replay_page_rows}
    cursor_doc: dict[str, Any] = {"maxLength": service.limits.cursor_bytes}
    every_link = tuple(name for name, _ in _THREAD_LINKS)

    async def call(name: str, *args: Any, **kwargs: Any) -> Any:
        method = getattr(service, name)
        if isinstance(service, AsyncConversationService):
            return await method(*args, **kwargs)
        return await run_in_threadpool(method, *args, **kwargs)

    thread_links = _thread_links(*every_link)

    @router.post(
        base,
        status_code=201,
        response_model=ConversationThread,
        response_model_exclude_none=True,
        responses={
            **_success("Created", thread_links, 201),
            200: {
                "model": ConversationThread,
                "description": "The thread already existed (get-or-create): returned unchanged",
                "links": thread_links,
            },
            **_errors("createConversation"),
        },
        summary="Create a thread (get-or-create when an id is given or derived)",
        operation_id="createConversation",
    )
    async def create(
        body: CreateThreadRequest | None = None,
        owner: Ownership = owner_dep,
        parsed: CreateThreadRequest | None = body_dep,
    ) -> Response:
        req = parsed or CreateThreadRequest()
        thread, created = await call(
            "create_or_get",
            owner,
            title=req.title,
            thread_id=req.id,
            request_id=req.request_id,
            metadata=req.metadata,
        )
        return JSONResponse(thread.to_wire(), status_code=201 if created else 200)

    @router.get(
        base,
        response_model=ThreadPage,
        response_model_exclude_none=True,
        responses=_errors("listConversations"),
        summary="List the caller's threads, newest first",
        operation_id="listConversations",
    )
    async def list_threads(
        cursor: str | None = Query(default=None, min_length=1, json_schema_extra=cursor_doc),
        limit: int | None = Query(default=None, ge=1, json_schema_extra=list_doc),
        owner: Ownership = owner_dep,
    ) -> ThreadPage:
        result: ThreadPage = await call("list", owner, cursor=cursor, limit=limit)
        return result

    @router.get(
        base + "/{thread_id}",
        response_model=ConversationThread,
        response_model_exclude_none=True,
        responses={**_success("The thread", thread_links), **_errors("getConversation")},
        summary="Get one thread",
        operation_id="getConversation",
    )
    async def get(thread_id: str, owner: Ownership = owner_dep) -> ConversationThread:
        result: ConversationThread = await call("get", owner, thread_id)
        return result

    @router.delete(
        base + "/{thread_id}",
        response_model=DeleteResult,
        responses=_errors("deleteConversation"),
        summary="Delete a thread and everything it owns (unless under legal hold)",
        operation_id="deleteConversation",
    )
    async def delete(thread_id: str, owner: Ownership = owner_dep) -> DeleteResult:
        result: DeleteResult = await call("delete", owner, thread_id)
        return result

    continue_links = {
        "BranchFromTurn": {
            "operationId": "branchConversation",
            "parameters": {"thread_id": "$response.body#/threadId"},
            "requestBody": {"leafId": "$response.body#/leafId"},
        },
        "ContinueFromBranch": {
            "operationId": "continueConversation",
            "parameters": {"thread_id": "$response.body#/threadId"},
        },
        "CancelRun": {
            "operationId": "cancelConversationRun",
            "parameters": {
                "thread_id": "$response.body#/threadId",
                "request_id": "$response.body#/requestId",
            },
        },
        **{
            name: {"operationId": op, "parameters": {"thread_id": "$response.body#/threadId"}}
            for name, op in _THREAD_LINKS
            if name in ("ArchiveConversation", "ExportConversation", "ReplayConversation")
        },
    }

    async def continue_(
        thread_id: str,
        body: ContinueRequest,
        owner: Ownership = owner_dep,
        parsed: ContinueRequest = body_dep,
        identity: AgentIdentity | None = identity_dep,
    ) -> ContinueResult:
        options = getattr(parsed, "run_options", None)
        result: ContinueResult = await call(
            "continue_",
            owner,
            thread_id,
            parsed.message,
            request_id=parsed.request_id,
            leaf_id=parsed.leaf_id,
            run_options=(
                None
                if options is None
                else options.model_dump(mode="json", by_alias=True, exclude_unset=True)
            ),
            identity=identity,
        )
        return result

    # The body's type is the service's continue model (with the host's runOptions schema):
    # set on the function before FastAPI reads its signature.
    continue_.__annotations__["body"] = continue_model
    router.post(
        base + "/{thread_id}/continue",
        response_model=ContinueResult,
        response_model_exclude_none=True,
        responses={
            **_success("The turn's result", continue_links),
            **_errors("continueConversation"),
        },
        summary="Run one agent turn on the thread (idempotent by requestId)",
        operation_id="continueConversation",
    )(continue_)

    @router.delete(
        base + "/{thread_id}/runs/{request_id:path}",
        response_model=CancelResult,
        responses=_errors("cancelConversationRun"),
        summary="Cancel a run by its requestId (owner-only, idempotent; commits nothing)",
        operation_id="cancelConversationRun",
    )
    async def cancel_run(
        thread_id: str, request_id: str, owner: Ownership = owner_dep
    ) -> CancelResult:
        result: CancelResult = await call("cancel_run", owner, thread_id, request_id)
        return result

    @router.post(
        base + "/{thread_id}/branch",
        response_model=ConversationThread,
        response_model_exclude_none=True,
        responses={
            **_success("The thread with the branch ref", thread_links),
            **_errors("branchConversation"),
        },
        summary="Record a branch ref (compare-and-swap on the thread version)",
        operation_id="branchConversation",
    )
    async def branch(
        thread_id: str,
        body: BranchRequest,
        owner: Ownership = owner_dep,
        parsed: BranchRequest = body_dep,
    ) -> ConversationThread:
        result: ConversationThread = await call(
            "branch", owner, thread_id, parsed.leaf_id, expected_version=parsed.expected_version
        )
        return result

    @router.post(
        base + "/{thread_id}/archive",
        response_model=ConversationThread,
        response_model_exclude_none=True,
        responses={
            **_success(
                "The archived thread",
                _thread_links(
                    "GetConversation",
                    "ExportConversation",
                    "ReplayConversation",
                    "DeleteConversation",
                ),
            ),
            **_errors("archiveConversation"),
        },
        summary="Archive the thread (compare-and-swap; a no-op if archived)",
        operation_id="archiveConversation",
    )
    async def archive(
        thread_id: str,
        body: ArchiveRequest | None = None,
        owner: Ownership = owner_dep,
        parsed: ArchiveRequest | None = body_dep,
    ) -> ConversationThread:
        version = parsed.expected_version if parsed is not None else None
        result: ConversationThread = await call(
            "archive", owner, thread_id, expected_version=version
        )
        return result

    export_links = {
        name: {"operationId": op, "parameters": {"thread_id": "$response.body#/thread/id"}}
        for name, op in _THREAD_LINKS
        if name in ("ReplayConversation", "DeleteConversation")
    }

    @router.post(
        base + "/{thread_id}/export",
        response_model=ExportResult,
        response_model_exclude_none=True,
        responses={
            **_success("The thread and its redacted ledger", export_links),
            **_errors("exportConversation"),
        },
        summary="Export the thread and its redacted ledger (capped, resumable)",
        operation_id="exportConversation",
    )
    async def export(
        thread_id: str,
        body: ExportRequest | None = None,
        owner: Ownership = owner_dep,
        parsed: ExportRequest | None = body_dep,
    ) -> ExportResult:
        cursor = parsed.cursor if parsed is not None else None
        result: ExportResult = await call("export", owner, thread_id, cursor=cursor)
        return result

    @router.get(
        base + "/{thread_id}/events",
        response_model=ReplayPage,
        response_model_exclude_none=True,
        responses=_errors("replayConversation"),
        summary="Replay durable redacted events (reconnect with the last nextCursor)",
        operation_id="replayConversation",
    )
    async def events(
        thread_id: str,
        cursor: str | None = Query(default=None, min_length=1, json_schema_extra=cursor_doc),
        limit: int | None = Query(default=None, ge=1, json_schema_extra=replay_doc),
        owner: Ownership = owner_dep,
    ) -> ReplayPage:
        result: ReplayPage = await call("replay", owner, thread_id, cursor=cursor, limit=limit)
        return result

    return router


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

    async def validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return _invalid(_validation_message(exc))

    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _finish_document(generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def _finish_document(document: dict[str, Any]) -> dict[str, Any]:
    """The generated document, made exact: FastAPI's 422 (the API answers 400
    ``invalid_request`` instead) is removed, and every error code with its one status is
    listed under ``x-memtier-error-codes`` (docs/threads.md has the same table)."""
    for path in document.get("paths", {}).values():
        for operation in path.values():
            responses = operation.get("responses", {})
            if "HTTPValidationError" in str(responses.get("422", "")):  # FastAPI's, not ours
                responses.pop("422")
    schemas = document.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    document["x-memtier-error-codes"] = status_table()
    return document
