"""HTTP metrics of ``memtier serve``: an ASGI middleware over the whole app.

``memtier_http_requests_total{method, route, status}`` and
``memtier_http_request_duration_seconds{method, route}``.  ``route`` is the route
*template* (``/memtier/conversations/{thread_id}``), never the raw path, so the label
set stays bounded: a path no route matches is counted as ``<unmatched>``, a method
outside the usual verbs as ``OTHER``.  The collectors are prometheus-client's, so with
``PROMETHEUS_MULTIPROC_DIR`` set (``--workers`` > 1) every process writes its own files
and ``/metrics`` sums them.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

from memtier import metrics

__all__ = ["HttpMetricsMiddleware", "route_template"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

UNMATCHED: Final = "<unmatched>"
METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def route_template(scope: Scope, routes: list[Any]) -> str:
    """The template of the route that served ``scope`` (after the app ran)."""
    route = scope.get("route")  # set by FastAPI's APIRoute: its path carries the prefix
    path = getattr(route, "path", None)
    if isinstance(path, str) and path:
        return path
    endpoint = scope.get("endpoint")
    if endpoint is not None:
        for candidate in routes:
            if getattr(candidate, "endpoint", None) is endpoint:
                found = getattr(candidate, "path", None)
                if isinstance(found, str) and found:
                    return found
    return UNMATCHED


class HttpMetricsMiddleware:
    """Count and time every HTTP request of the wrapped app (``routes``: its top level)."""

    def __init__(self, app: ASGIApp, routes: list[Any]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # an exception before the response started

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message.get("type") == "http.response.start":
                status = int(message.get("status", 500))
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            method = str(scope.get("method", "OTHER")).upper()
            method = method if method in METHODS else "OTHER"
            route = route_template(scope, self.routes)
            metrics.HTTP_REQUESTS.labels(method, route, str(status)).inc()
            metrics.HTTP_REQUEST_DURATION.labels(method, route).observe(
                time.perf_counter() - started
            )
