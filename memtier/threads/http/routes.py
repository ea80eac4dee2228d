"""The API's routes (:func:`create_conversation_router`) and their OpenAPI entries:
success responses with links for stateful clients, error responses per operation."""

from __future__ import annotations

import re
from typing import Any, Final

from fastapi import APIRouter, Depends, Query, Security
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer
from starlette.responses import Response

from memtier.config import ThreadsConfig
from memtier.errors import ConfigurationError
from memtier.threads.http.asyncapi import Service, async_api
from memtier.threads.http.errormap import openapi_error_responses
from memtier.threads.http.guard import (
    ROUTE_SPECS,
    Authorize,
    BodySpec,
    body_of,
    continue_request_model,
    guarded_route_class,
    identity_of,
    ownership_of,
)
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
    ReplayPage,
    ThreadPage,
)

__all__ = ["BEARER_SCHEME", "DEFAULT_BASE_PATH", "base_path_of", "create_conversation_router"]

DEFAULT_BASE_PATH: Final = "/memtier/conversations"
BEARER_SCHEME: Final = "bearerAuth"
_BASE_PATH_RE: Final = re.compile(r"^(/[A-Za-z0-9_.~-]+)+\Z")


def base_path_of(base_path: str) -> str:
    """``/a/b`` (no trailing slash); anything else is a configuration error."""
    base = base_path.rstrip("/")
    if not _BASE_PATH_RE.match(base):
        raise ConfigurationError(f"base path {base_path!r} must look like /memtier/conversations")
    return base


def _links(*targets: tuple[str, str]) -> dict[str, Any]:
    """OpenAPI links: (name, operationId) pairs, the thread id taken from this response."""
    return {
        name: {"operationId": operation_id, "parameters": {"thread_id": "$response.body#/id"}}
        for name, operation_id in targets
    }


_THREAD_LINKS: Final = (
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


def _continue_links() -> dict[str, Any]:
    return {
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


def _export_links() -> dict[str, Any]:
    return {
        name: {"operationId": op, "parameters": {"thread_id": "$response.body#/thread/id"}}
        for name, op in _THREAD_LINKS
        if name in ("ReplayConversation", "DeleteConversation")
    }


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
    base = base_path_of(base_path)
    cap = service.limits.request_body_bytes
    if limits is not None:
        cap = min(cap, limits.request_body_bytes)
    bearer = HTTPBearer(auto_error=False, scheme_name=BEARER_SCHEME)
    continue_model = continue_request_model(service.core.run_options_schema)
    specs = dict(ROUTE_SPECS)
    specs["continueConversation"] = BodySpec(continue_model, required=True)
    router = APIRouter(
        route_class=guarded_route_class(authorize, cap, specs), dependencies=[Security(bearer)]
    )
    api = async_api(service)
    owner_dep = Depends(ownership_of)
    body_dep = Depends(body_of)
    identity_dep = Depends(identity_of)
    # The document states the configured caps; the service answers a value past them
    # with limit_exceeded (so they are documented here, not enforced by FastAPI).
    list_doc: dict[str, Any] = {"maximum": service.limits.list_page}
    replay_doc: dict[str, Any] = {"maximum": service.limits.replay_page_rows}
    cursor_doc: dict[str, Any] = {"maxLength": service.limits.cursor_bytes}
    every_link = tuple(name for name, _ in _THREAD_LINKS)
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
            **openapi_error_responses("createConversation"),
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
        thread, created = await api.create_or_get(
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
        responses=openapi_error_responses("listConversations"),
        summary="List the caller's threads, newest first",
        operation_id="listConversations",
    )
    async def list_threads(
        cursor: str | None = Query(default=None, min_length=1, json_schema_extra=cursor_doc),
        limit: int | None = Query(default=None, ge=1, json_schema_extra=list_doc),
        owner: Ownership = owner_dep,
    ) -> ThreadPage:
        return await api.list(owner, cursor=cursor, limit=limit)

    @router.get(
        base + "/{thread_id}",
        response_model=ConversationThread,
        response_model_exclude_none=True,
        responses={
            **_success("The thread", thread_links),
            **openapi_error_responses("getConversation"),
        },
        summary="Get one thread",
        operation_id="getConversation",
    )
    async def get(thread_id: str, owner: Ownership = owner_dep) -> ConversationThread:
        return await api.get(owner, thread_id)

    @router.delete(
        base + "/{thread_id}",
        response_model=DeleteResult,
        responses=openapi_error_responses("deleteConversation"),
        summary="Delete a thread and everything it owns (unless under legal hold)",
        operation_id="deleteConversation",
    )
    async def delete(thread_id: str, owner: Ownership = owner_dep) -> DeleteResult:
        return await api.delete(owner, thread_id)

    async def continue_(
        thread_id: str,
        body: ContinueRequest,
        owner: Ownership = owner_dep,
        parsed: ContinueRequest = body_dep,
        identity: AgentIdentity | None = identity_dep,
    ) -> ContinueResult:
        options = getattr(parsed, "run_options", None)
        return await api.continue_(
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

    # The body's type is the service's continue model (with the host's runOptions schema):
    # set on the function before FastAPI reads its signature.
    continue_.__annotations__["body"] = continue_model
    router.post(
        base + "/{thread_id}/continue",
        response_model=ContinueResult,
        response_model_exclude_none=True,
        responses={
            **_success("The turn's result", _continue_links()),
            **openapi_error_responses("continueConversation"),
        },
        summary="Run one agent turn on the thread (idempotent by requestId)",
        operation_id="continueConversation",
    )(continue_)

    @router.delete(
        base + "/{thread_id}/runs/{request_id:path}",
        response_model=CancelResult,
        responses=openapi_error_responses("cancelConversationRun"),
        summary="Cancel a run by its requestId (owner-only, idempotent; commits nothing)",
        operation_id="cancelConversationRun",
    )
    async def cancel_run(
        thread_id: str, request_id: str, owner: Ownership = owner_dep
    ) -> CancelResult:
        return await api.cancel_run(owner, thread_id, request_id)

    @router.post(
        base + "/{thread_id}/branch",
        response_model=ConversationThread,
        response_model_exclude_none=True,
        responses={
            **_success("The thread with the branch ref", thread_links),
            **openapi_error_responses("branchConversation"),
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
        return await api.branch(
            owner, thread_id, parsed.leaf_id, expected_version=parsed.expected_version
        )

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
            **openapi_error_responses("archiveConversation"),
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
        return await api.archive(owner, thread_id, expected_version=version)

    @router.post(
        base + "/{thread_id}/export",
        response_model=ExportResult,
        response_model_exclude_none=True,
        responses={
            **_success("The thread and its redacted ledger", _export_links()),
            **openapi_error_responses("exportConversation"),
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
        return await api.export(owner, thread_id, cursor=cursor)

    @router.get(
        base + "/{thread_id}/events",
        response_model=ReplayPage,
        response_model_exclude_none=True,
        responses=openapi_error_responses("replayConversation"),
        summary="Replay durable redacted events (reconnect with the last nextCursor)",
        operation_id="replayConversation",
    )
    async def events(
        thread_id: str,
        cursor: str | None = Query(default=None, min_length=1, json_schema_extra=cursor_doc),
        limit: int | None = Query(default=None, ge=1, json_schema_extra=replay_doc),
        owner: Ownership = owner_dep,
    ) -> ReplayPage:
        return await api.replay(owner, thread_id, cursor=cursor, limit=limit)

    return router
