"""memtier.httpmetrics: requests counted by route *template* and status, and timed."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client import REGISTRY
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from memtier.httpmetrics import UNMATCHED, HttpMetricsMiddleware


def _count(method: str, route: str, status: str) -> float:
    labels = {"method": method, "route": route, "status": status}
    return REGISTRY.get_sample_value("memtier_http_requests_total", labels) or 0.0


def _timed(method: str, route: str) -> float:
    labels = {"method": method, "route": route}
    return REGISTRY.get_sample_value("memtier_http_request_duration_seconds_count", labels) or 0.0


def _app() -> Any:
    async def item(request: Request) -> Response:
        if request.path_params["item_id"] == "boom":
            raise RuntimeError("a handler bug")
        return JSONResponse({"id": request.path_params["item_id"]})

    routes = [Route("/things/{item_id}", item)]
    app = Starlette(routes=routes)
    app.add_middleware(HttpMetricsMiddleware, routes=routes)
    return app


async def test_routes_are_templates_statuses_and_errors_are_counted() -> None:
    before = {
        "ok": _count("GET", "/things/{item_id}", "200"),
        "boom": _count("GET", "/things/{item_id}", "500"),
        "missing": _count("GET", UNMATCHED, "404"),
        "other": _count("OTHER", "/things/{item_id}", "405"),
        "timed": _timed("GET", "/things/{item_id}"),
    }
    transport = httpx.ASGITransport(app=_app(), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        for n in range(3):
            assert (await client.get(f"/things/{n}")).status_code == 200
        assert (await client.get("/things/boom")).status_code == 500
        assert (await client.get("/nowhere/at/all")).status_code == 404
        assert (await client.request("BREW", "/things/1")).status_code == 405
    assert _count("GET", "/things/{item_id}", "200") - before["ok"] == 3
    assert _count("GET", "/things/{item_id}", "500") - before["boom"] == 1
    assert _count("GET", UNMATCHED, "404") - before["missing"] == 1
    assert _count("OTHER", "/things/{item_id}", "405") - before["other"] == 1
    assert _timed("GET", "/things/{item_id}") - before["timed"] == 4
    raw_paths = [
        sample.labels.get("route", "")
        for family in REGISTRY.collect()
        if family.name == "memtier_http_requests"
        for sample in family.samples
    ]
    assert not any("/things/0" in route or "/nowhere" in route for route in raw_paths)
