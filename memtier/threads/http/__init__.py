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
5. The service call; every error code maps to one status through the one table,
   :data:`memtier.errors.ERRORS`.

Error bodies are always ``{"code": "<stable code>", "message": "...", ...}`` --
also for an unknown path (404 ``not_found``) and a wrong method (405
``method_not_allowed``); they never carry the Redis address or other internal
detail.  A thread of another owner and a missing thread give byte-identical 404s.

Modules: :mod:`.routes` (the routes and their OpenAPI entries), :mod:`.guard` (the
checks above), :mod:`.errormap` (error bodies, codes per operation, the framework's
own errors), :mod:`.asyncapi` (the service as the routes call it), :mod:`.openapi`
(finishing the served document).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from memtier.config import ThreadsConfig
from memtier.threads.http.asyncapi import Service
from memtier.threads.http.errormap import (
    error_response,
    http_error,
    invalid,
    status_table,
    validation_message,
)
from memtier.threads.http.guard import MAX_JSON_DEPTH, Authorize, continue_request_model
from memtier.threads.http.openapi import fastapi_options, finish_document
from memtier.threads.http.routes import (
    BEARER_SCHEME,
    DEFAULT_BASE_PATH,
    base_path_of,
    create_conversation_router,
)

__all__ = [
    "BEARER_SCHEME",
    "DEFAULT_BASE_PATH",
    "MAX_JSON_DEPTH",
    "Authorize",
    "Service",
    "continue_request_model",
    "create_conversation_app",
    "create_conversation_router",
    "error_response",
    "http_error",
    "status_table",
]


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
    base = base_path_of(base_path)
    app = FastAPI(
        title="memtier conversation threads",
        version="1",
        openapi_url=f"{base}/openapi.json",
        docs_url=None,
        redoc_url=None,
        **fastapi_options(),
    )
    app.include_router(
        create_conversation_router(service, authorize, base_path=base_path, limits=limits)
    )

    async def validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return invalid(validation_message(exc))

    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = finish_document(generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
