"""The checks every API request passes before its handler (see :mod:`memtier.threads.http`):
authorization, the body cap, the media type, strict JSON and query validation.

:func:`guarded_route_class` makes an ``APIRoute`` that runs them before FastAPI parses
anything and hands the handler what passed (ownership, identity, the parsed body) on
``request.state``.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final, TypeAlias, cast

import orjson
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field, create_model
from pydantic import ValidationError as PydanticValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive

from memtier.errors import ConversationError, ErrorCode, MemtierError
from memtier.threads.http.errormap import (
    JSON_TYPE,
    error_response,
    invalid,
    payload_too_large,
    public_error,
    unauthorized,
    unsupported_media_type,
    validation_message,
)
from memtier.threads.models import (
    AgentIdentity,
    ArchiveRequest,
    BranchRequest,
    ContinueRequest,
    CreateThreadRequest,
    ExportRequest,
    Ownership,
    Principal,
)

__all__ = [
    "MAX_JSON_DEPTH",
    "ROUTE_SPECS",
    "Authorize",
    "BodySpec",
    "body_of",
    "continue_request_model",
    "guarded_route_class",
    "identity_of",
    "ownership_of",
]

Authorize: TypeAlias = Callable[
    [Request], "Ownership | Principal | Awaitable[Ownership | Principal | None] | None"
]

_STATE_KEY: Final = "memtier_ownership"
_BODY_KEY: Final = "memtier_body"
_IDENTITY_KEY: Final = "memtier_identity"
_BODY_METHODS: Final = frozenset({"POST", "PUT", "PATCH"})
MAX_JSON_DEPTH: Final = 64  # deepest JSON nesting a request body may have
_LIMIT_RE: Final = re.compile(r"^[1-9][0-9]{0,8}\Z")


@dataclass(frozen=True, slots=True)
class BodySpec:
    """What one route accepts: its body model (or none), whether the body is required,
    and its query parameters."""

    model: type[BaseModel] | None = None
    required: bool = False
    query: frozenset[str] = frozenset()


_PAGED: Final = frozenset({"cursor", "limit"})
ROUTE_SPECS: Final[dict[str, BodySpec]] = {
    "createConversation": BodySpec(CreateThreadRequest),
    "listConversations": BodySpec(query=_PAGED),
    "getConversation": BodySpec(),
    "deleteConversation": BodySpec(),
    "continueConversation": BodySpec(ContinueRequest, required=True),
    "branchConversation": BodySpec(BranchRequest, required=True),
    "archiveConversation": BodySpec(ArchiveRequest),
    "exportConversation": BodySpec(ExportRequest),
    "replayConversation": BodySpec(query=_PAGED),
    "cancelConversationRun": BodySpec(),
}


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
    if media_type.strip().lower() != JSON_TYPE:
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
    spec: BodySpec, body: bytes, content_type: str | None
) -> BaseModel | Response | None:
    """The validated request model (or None for an absent optional body), or the error."""
    if spec.model is None:
        if body:
            return invalid("invalid request: this operation takes no request body")
        return None
    if (body or spec.required) and not _is_json_media_type(content_type):
        return unsupported_media_type()
    if not body:
        if spec.required:
            return invalid("invalid request: a JSON object body is required")
        return None
    try:
        parsed = orjson.loads(body)  # strict: UTF-8 only, no NaN/Infinity, no trailing data
    except orjson.JSONDecodeError:
        return invalid("invalid request: the body is not valid JSON (UTF-8, no NaN/Infinity)")
    if parsed is None and not spec.required:
        return None  # the document allows `null` for an optional body: the same as none
    if not isinstance(parsed, dict):
        return invalid("invalid request: the body must be a JSON object")
    if not _json_depth_ok(parsed, MAX_JSON_DEPTH):
        return invalid(f"invalid request: JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        # strict in JSON mode all the way down (the host's run-options schema included)
        return spec.model.model_validate_json(body, strict=True)
    except PydanticValidationError as exc:
        return invalid(validation_message(exc))


def _check_query(spec: BodySpec, request: Request) -> Response | None:
    names = [name for name, _ in request.query_params.multi_items()]
    for name in names:
        if name not in spec.query:
            return invalid(f"invalid request: unknown query parameter {name[:64]!r}")
        if names.count(name) > 1:
            return invalid(f"invalid request: query parameter {name!r} given more than once")
    limit = request.query_params.get("limit")
    if limit is not None and not _LIMIT_RE.match(limit):
        return invalid("invalid request: limit must be a positive decimal integer")
    return None


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


def guarded_route_class(
    authorize: Authorize, body_cap: int, specs: dict[str, BodySpec]
) -> type[APIRoute]:
    """An APIRoute that authorizes, then caps the body, before FastAPI parses anything."""

    class GuardedRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            spec = specs.get(self.operation_id or "", BodySpec())

            async def guarded(request: Request) -> Response:
                try:
                    owner = authorize(request)
                    if inspect.isawaitable(owner):
                        owner = await owner
                except ConversationError as exc:
                    if exc.code == ErrorCode.UNAUTHORIZED:
                        return unauthorized()
                    return error_response(exc)
                identity: Any = None
                if isinstance(owner, Principal):
                    identity = owner.identity
                    owner = owner.ownership
                if not isinstance(owner, Ownership):
                    return unauthorized()
                if identity is not None and not (
                    isinstance(identity, AgentIdentity) and identity.projects_onto(owner)
                ):
                    return unauthorized()  # an identity never widens the ownership
                body = b""
                if request.method in _BODY_METHODS:
                    try:
                        body = await _read_capped(request, body_cap)
                    except _BodyTooLarge:
                        return payload_too_large(body_cap)
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
                    return invalid(validation_message(exc))
                except MemtierError as exc:
                    return error_response(public_error(exc))

            return guarded

    return GuardedRoute


def ownership_of(request: Request) -> Ownership:
    """Dependency: the ownership the guard verified."""
    return cast(Ownership, getattr(request.state, _STATE_KEY))


def identity_of(request: Request) -> AgentIdentity | None:
    """Dependency: the agent identity verified with it (or None)."""
    return cast("AgentIdentity | None", getattr(request.state, _IDENTITY_KEY, None))


def body_of(request: Request) -> Any:
    """Dependency: the request body the guard parsed strictly (or None)."""
    return getattr(request.state, _BODY_KEY, None)
