"""The HTTP API with real requests: uvicorn on a free loopback port, httpx against it, on
fakeredis, a real Redis and a real Redis Cluster."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from httphelpers import ALICE, MALLORY, api_server
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate
from threadhelpers import CountingRunner

from memtier.errors import ConversationErrorCode, http_status_for
from memtier.threads import AgentDenied, RunnerEvent
from memtier.threads.http import status_table

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:websockets.*")

KiB = 1024


@pytest.fixture
def api(backend: Any) -> Iterator[Any]:
    with api_server(backend) as server:
        yield server


def _thread(client: httpx.Client, url: str, turns: int = 1) -> str:
    created = client.post(url, json={"title": "t"}, headers=ALICE)
    assert created.status_code == 201, created.text
    tid: str = created.json()["id"]
    for i in range(turns):
        r = client.post(f"{url}/{tid}/continue", json={"message": f"m{i}"}, headers=ALICE)
        assert r.status_code == 200, r.text
    return tid


def _error(response: httpx.Response, code: str) -> None:
    assert response.json()["code"] == code, response.text
    assert isinstance(response.json()["message"], str)
    assert response.status_code == http_status_for(code), (code, response.status_code)


# --- every route ---------------------------------------------------------------------------------


def test_every_route(api: Any) -> None:
    with httpx.Client(timeout=60) as client:
        url = api.url
        assert client.get(api.root + "/host/ping").text == "host says pong"  # host route beside
        r = client.post(url, json={"title": "Q3 planning", "metadata": {"k": 1}}, headers=ALICE)
        assert r.status_code == 201
        thread = r.json()
        assert set(thread) >= {"id", "title", "state", "branches", "createdAt", "updatedAt"}
        assert (thread["tenantId"], thread["userId"], thread["state"]) == (
            "acme",
            "alice",
            "active",
        )
        tid = thread["id"]
        assert client.post(url, headers=ALICE).status_code == 201  # an empty body is fine
        listing = client.get(url, params={"limit": 1}, headers=ALICE)
        assert listing.status_code == 200 and len(listing.json()["items"]) == 1
        second = client.get(url, params={"cursor": listing.json()["nextCursor"]}, headers=ALICE)
        assert len(second.json()["items"]) == 1 and "nextCursor" not in second.json()
        assert client.get(f"{url}/{tid}", headers=ALICE).json() == thread
        turn = client.post(
            f"{url}/{tid}/continue", json={"message": "hello", "requestId": "r1"}, headers=ALICE
        )
        assert turn.status_code == 200
        body = turn.json()
        assert (body["threadId"], body["requestId"], body["status"]) == (tid, "r1", "completed")
        assert [e["role"] for e in body["entries"]] == ["user", "assistant"]
        branched = client.post(
            f"{url}/{tid}/branch", json={"leafId": body["leafId"]}, headers=ALICE
        )
        assert branched.status_code == 200
        assert branched.json()["branches"][0]["leafId"] == body["leafId"]
        fork = client.post(
            f"{url}/{tid}/continue",
            json={"message": "fork", "leafId": body["leafId"]},
            headers=ALICE,
        )
        assert fork.json()["entries"][0]["parentId"] == body["leafId"]
        events = client.get(f"{url}/{tid}/events", params={"limit": 100}, headers=ALICE)
        assert events.status_code == 200
        page = events.json()
        assert page["terminal"] is True and "nextCursor" not in page
        assert [r["type"] for r in page["records"]][:2] == ["agent_started", "user_message"]
        assert all(r["redacted"] is True and r["threadId"] == tid for r in page["records"])
        exported = client.post(f"{url}/{tid}/export", json={}, headers=ALICE)
        assert exported.status_code == 200
        assert exported.json()["truncated"] is False and len(exported.json()["events"]) == 10
        archived = client.post(f"{url}/{tid}/archive", headers=ALICE)
        assert archived.status_code == 200 and archived.json()["state"] == "archived"
        deleted = client.delete(f"{url}/{tid}", headers=ALICE)
        assert deleted.status_code == 200 and deleted.json() == {"deleted": True, "held": False}
        _error(client.get(f"{url}/{tid}", headers=ALICE), "not_found")


def test_a_configured_base_path(backend: Any) -> None:
    with api_server(backend, base_path="/api/v2/threads") as server, httpx.Client() as client:
        assert server.url.endswith("/api/v2/threads")
        assert client.post(server.url, json={}, headers=ALICE).status_code == 201
        assert client.get(server.root + "/memtier/conversations", headers=ALICE).status_code == 404
        assert client.get(server.url + "/openapi.json").status_code == 200


# --- every error code and its status -----------------------------------------------------------


def test_every_error_code_has_one_documented_status() -> None:
    table = status_table()
    assert set(table) == {code.value for code in ConversationErrorCode}
    assert table == {
        "invalid_request": 400,
        "unauthorized": 401,
        "not_found": 404,
        "thread_archived": 409,
        "metadata_conflict": 409,
        "branch_limit": 409,
        "unknown_leaf": 400,
        "invalid_cursor": 400,
        "cursor_thread_mismatch": 400,
        "limit_exceeded": 400,
        "payload_too_large": 413,
        "export_too_large": 413,
        "request_in_progress": 409,
        "runner_failed": 502,
        "backend_unavailable": 503,
        "thread_busy": 409,
        "request_conflict": 422,
        "unsupported_media_type": 415,
        "method_not_allowed": 405,
        "run_cancelled": 409,
    }


def test_every_error_code_over_http(backend: Any) -> None:
    """Each code, provoked through real requests, answers with its one status."""
    seen: set[str] = set()

    def check(response: httpx.Response, code: str) -> None:
        _error(response, code)
        seen.add(code)

    gate = threading.Event()
    runner = CountingRunner(gate=gate)
    options: dict[str, Any] = {"runner": runner, "busy_wait_s": 0.0, "inflight_wait_s": 0.0}
    limits = {"max_active_branches": 1, "export_bytes": 1024}
    with (
        api_server(backend, threads=limits, **options) as api,
        httpx.Client(timeout=60) as c,
        _opens(gate),
    ):
        url = api.url
        check(c.get(url), "unauthorized")
        check(c.get(url, headers={"Authorization": "Bearer nope"}), "unauthorized")
        check(
            c.post(url, content=b"{nope", headers={**ALICE, "content-type": "application/json"}),
            "invalid_request",
        )
        check(c.post(url, json={"title": "x" * 257}, headers=ALICE), "limit_exceeded")
        check(c.post(url, content=b" " * (65 * KiB), headers=ALICE), "payload_too_large")
        check(c.get(f"{url}/missing", headers=ALICE), "not_found")
        created = c.post(url, json={"id": "fixed", "title": "a"}, headers=ALICE)
        assert created.status_code == 201
        again = c.post(url, json={"id": "fixed", "title": "b", "metadata": {"x": 1}}, headers=ALICE)
        assert again.status_code == 200 and again.json() == created.json()  # get-or-create
        check(c.post(url, content=b'{"title": "x"}', headers=ALICE), "unsupported_media_type")
        check(c.put(url, headers=ALICE), "method_not_allowed")
        gate.set()
        tid = _thread(c, url, turns=2)
        gate.clear()
        check(c.post(f"{url}/{tid}/branch", json={"leafId": "e9"}, headers=ALICE), "unknown_leaf")
        assert c.post(f"{url}/{tid}/branch", json={"leafId": "e2"}, headers=ALICE).is_success
        check(c.post(f"{url}/{tid}/branch", json={"leafId": "e4"}, headers=ALICE), "branch_limit")
        check(
            c.post(
                f"{url}/{tid}/branch", json={"leafId": "e4", "expectedVersion": 1}, headers=ALICE
            ),
            "metadata_conflict",
        )
        check(
            c.get(f"{url}/{tid}/events", params={"cursor": "bogus"}, headers=ALICE),
            "invalid_cursor",
        )
        other = _thread(c, url, turns=0)
        cursor = c.get(f"{url}/{tid}/events", params={"limit": 1}, headers=ALICE).json()
        check(
            c.get(f"{url}/{other}/events", params={"cursor": cursor["nextCursor"]}, headers=ALICE),
            "cursor_thread_mismatch",
        )
        check(c.get(f"{url}/{tid}/events", params={"limit": 101}, headers=ALICE), "limit_exceeded")
        check(c.post(f"{url}/{tid}/export", headers=ALICE), "export_too_large")
        # a turn that blocks in the runner: duplicates and other requests meet it in flight
        holder = threading.Thread(
            target=lambda: httpx.post(
                f"{url}/{other}/continue",
                json={"message": "slow", "requestId": "dup"},
                headers=ALICE,
                timeout=120,
            )
        )
        runner.entered.clear()
        holder.start()
        assert runner.entered.wait(60)
        check(
            c.post(
                f"{url}/{other}/continue",
                json={"message": "slow", "requestId": "dup"},
                headers=ALICE,
            ),
            "request_in_progress",
        )
        check(
            c.post(
                f"{url}/{other}/continue",
                json={"message": "other", "requestId": "x"},
                headers=ALICE,
            ),
            "thread_busy",
        )
        gate.set()
        holder.join(120)
        check(
            c.post(
                f"{url}/{other}/continue",
                json={"message": "changed", "requestId": "dup"},
                headers=ALICE,
            ),
            "request_conflict",
        )
        # a turn cancelled by its caller (DELETE .../runs/<requestId>) answers run_cancelled
        gate.clear()
        runner.entered.clear()
        answers: dict[str, httpx.Response] = {}
        cancelled = threading.Thread(
            target=lambda: answers.update(
                r=httpx.post(
                    f"{url}/{other}/continue",
                    json={"message": "slow", "requestId": "cx"},
                    headers=ALICE,
                    timeout=120,
                )
            )
        )
        cancelled.start()
        assert runner.entered.wait(60)
        cancel = c.delete(f"{url}/{other}/runs/cx", headers=ALICE)
        assert cancel.status_code == 200 and cancel.json()["status"] == "cancelling", cancel.text
        cancelled.join(120)
        check(answers["r"], "run_cancelled")
        gate.set()
        runner.fail = RuntimeError("model exploded")
        check(
            c.post(f"{url}/{other}/continue", json={"message": "boom"}, headers=ALICE),
            "runner_failed",
        )
        runner.fail = None
        assert c.post(f"{url}/{tid}/archive", headers=ALICE).is_success
        check(
            c.post(f"{url}/{tid}/continue", json={"message": "late"}, headers=ALICE),
            "thread_archived",
        )
    # Redis gone: bounded retries, then 503 backend_unavailable
    dead = _dead_backend(backend)
    with api_server(dead) as api, httpx.Client(timeout=120) as c:
        check(c.get(api.url, headers=ALICE), "backend_unavailable")
    assert seen == {code.value for code in ConversationErrorCode}


@contextlib.contextmanager
def _opens(gate: threading.Event) -> Iterator[None]:
    """Whatever happens, the runner's gate opens (so the server can drain and stop)."""
    try:
        yield
    finally:
        gate.set()


class _DeadBackend:
    """A backend whose Redis URL points at a loopback port nobody listens on."""

    is_fake = False

    def __init__(self, namespace: str) -> None:
        from servers import HOST, free_ports

        (port,) = free_ports(1)
        self.url = f"redis://{HOST}:{port}/0"
        self.namespace = namespace

    def config(self, **kw: Any) -> Any:
        from memtier.config import MemtierConfig

        return MemtierConfig.load(redis_url=self.url, namespace=self.namespace, **kw)


def _dead_backend(backend: Any) -> Any:
    return _DeadBackend(backend.namespace)


def test_denied_turns_over_http(backend: Any) -> None:
    runner = CountingRunner(fail=AgentDenied("not allowed"))
    with api_server(backend, runner=runner) as api, httpx.Client() as c:
        tid = c.post(api.url, json={}, headers=ALICE).json()["id"]
        r = c.post(f"{api.url}/{tid}/continue", json={"message": "x"}, headers=ALICE)
        assert r.status_code == 200 and r.json()["status"] == "denied"
        assert r.json()["reason"] == "not allowed" and r.json()["entries"] == []


# --- ownership ---------------------------------------------------------------------------------


def test_wrong_owner_is_identical_to_missing_on_every_route(api: Any) -> None:
    with httpx.Client(timeout=60) as c:
        url = api.url
        tid = _thread(c, url, turns=1)
        cursor = c.get(f"{url}/{tid}/events", params={"limit": 1}, headers=ALICE).json()
        routes = [
            ("GET", "", None, None),
            ("DELETE", "", None, None),
            ("POST", "/continue", {"message": "hi"}, None),
            ("POST", "/branch", {"leafId": "e2"}, None),
            ("POST", "/archive", {}, None),
            ("DELETE", "/runs/r1", None, None),
            ("POST", "/export", {}, None),
            ("GET", "/events", None, None),
            ("GET", "/events", None, {"cursor": cursor["nextCursor"]}),
        ]
        for method, suffix, body, params in routes:
            wrong = c.request(
                method, f"{url}/{tid}{suffix}", json=body, params=params, headers=MALLORY
            )
            missing = c.request(
                method, f"{url}/conv_missing{suffix}", json=body, params=params, headers=ALICE
            )
            assert wrong.status_code == missing.status_code == 404, (method, suffix)
            assert wrong.content == missing.content, (method, suffix)
            assert wrong.headers["content-type"] == missing.headers["content-type"]
        assert c.get(url, headers=MALLORY).json() == {"items": []}
        assert c.get(f"{url}/{tid}", headers=ALICE).status_code == 200  # untouched


# --- request body caps ---------------------------------------------------------------------------


def _padded(size: int) -> bytes:
    body = b'{"title": "padded"}'
    return body + b" " * (size - len(body))  # JSON allows trailing whitespace


@pytest.mark.parametrize("cap", [None, 1024 * KiB])
def test_request_body_cap_at_default_and_ceiling(backend: Any, cap: int | None) -> None:
    limit = cap or 64 * KiB
    threads = {"request_body_bytes": cap} if cap else None
    headers = {**ALICE, "content-type": "application/json"}
    with api_server(backend, threads=threads) as api, httpx.Client(timeout=60) as c:
        ok = c.post(api.url, content=_padded(limit), headers=headers)
        assert ok.status_code == 201, ok.text
        over = c.post(api.url, content=_padded(limit + 1), headers=headers)
        _error(over, "payload_too_large")
        assert over.json()["limit"] == limit

        def stream(total: int) -> Iterator[bytes]:  # chunked: no Content-Length at all
            data = _padded(total)
            for i in range(0, len(data), 8 * KiB):
                yield data[i : i + 8 * KiB]

        chunked = c.post(api.url, content=stream(limit + 1), headers=headers)
        _error(chunked, "payload_too_large")
        assert c.post(api.url, content=stream(limit), headers=headers).status_code == 201


def test_an_unauthorized_body_is_never_read(api: Any) -> None:
    with httpx.Client() as c:
        r = c.post(api.url, content=b"{" + b" " * (200 * KiB) + b"}")
        _error(r, "unauthorized")  # 401 before the 413: strangers' bodies are not read


# --- replay over HTTP: drop and reconnect --------------------------------------------------------


def test_replay_reconnect_over_http_sees_every_event_once(backend: Any) -> None:
    runner = CountingRunner(events=[RunnerEvent("step", {"i": i}) for i in range(7)])
    with api_server(backend, runner=runner) as api:
        url = api.url
        with httpx.Client() as setup:
            tid = _thread(setup, url, turns=3)
            everything = setup.get(f"{url}/{tid}/events", headers=ALICE).json()["records"]
        assert len(everything) == 33
        seen: dict[str, Any] = {}
        last_cursor = None
        client = httpx.Client()
        for _ in range(3):  # three pages, then the connection drops mid-stream
            params = {"limit": 4, **({"cursor": last_cursor} if last_cursor else {})}
            page = client.get(f"{url}/{tid}/events", params=params, headers=ALICE).json()
            for record in page["records"]:
                seen.setdefault(record["id"], record)
            last_cursor = page["nextCursor"]
        client.close()
        with pytest.raises(RuntimeError):
            client.get(f"{url}/{tid}/events", headers=ALICE)  # that connection is gone
        with httpx.Client() as resumed:
            cursor = last_cursor
            while cursor:
                page = resumed.get(
                    f"{url}/{tid}/events", params={"cursor": cursor, "limit": 5}, headers=ALICE
                ).json()
                for record in page["records"]:
                    assert record["id"] not in seen  # resuming from the last cursor: no repeats
                    seen[record["id"]] = record
                cursor = page.get("nextCursor")
        assert list(seen) == [r["id"] for r in everything]
        assert list(seen.values()) == everything
        assert runner.calls == 3  # replay never reran a turn


# --- OpenAPI -------------------------------------------------------------------------------------


def test_openapi_document_is_served_valid_and_matches_responses(api: Any) -> None:
    with httpx.Client() as c:
        doc = c.get(api.url + "/openapi.json").json()  # served without authorization
        validate(doc)  # a valid OpenAPI document
        base = "/memtier/conversations"
        assert {path: sorted(ops) for path, ops in doc["paths"].items()} == {
            base: ["get", "post"],
            base + "/{thread_id}": ["delete", "get"],
            base + "/{thread_id}/continue": ["post"],
            base + "/{thread_id}/branch": ["post"],
            base + "/{thread_id}/archive": ["post"],
            base + "/{thread_id}/export": ["post"],
            base + "/{thread_id}/events": ["get"],
            base + "/{thread_id}/runs/{request_id}": ["delete"],
        }
        schemas = doc["components"]["schemas"]
        thread_props = set(schemas["ConversationThread"]["properties"])
        assert {"id", "createdAt", "updatedAt", "tenantId", "userId", "branches"} <= thread_props
        for path in doc["paths"].values():
            for op in path.values():
                assert {"400", "401", "503"} <= set(op["responses"])
                # FastAPI's validation 422 is gone (the API answers 400 invalid_request);
                # the only 422 is request_conflict, the IETF Idempotency-Key status.
                if "422" in op["responses"]:
                    assert "request_conflict" in op["responses"]["422"]["description"]
                    assert "HTTPValidationError" not in str(op["responses"]["422"])
                assert op["security"] == [{"bearerAuth": []}]
        assert doc["components"]["securitySchemes"]["bearerAuth"] == {
            "type": "http",
            "scheme": "bearer",
        }

        def check(instance: Any, schema_name: str) -> None:
            schema = {**schemas[schema_name], "components": doc["components"]}
            OAS31Validator(schema).validate(instance)

        created = c.post(api.url, json={"title": "schema"}, headers=ALICE).json()
        check(created, "ConversationThread")
        tid = created["id"]
        turn = c.post(f"{api.url}/{tid}/continue", json={"message": "hi"}, headers=ALICE).json()
        check(turn, "ContinueResult")
        check(c.get(f"{api.url}/{tid}/events", headers=ALICE).json(), "ReplayPage")
        check(c.get(api.url, headers=ALICE).json(), "ThreadPage")
        check(c.post(f"{api.url}/{tid}/export", headers=ALICE).json(), "ExportResult")
        error = c.get(f"{api.url}/nope", headers=ALICE)
        op = doc["paths"][base + "/{thread_id}"]["get"]
        schema = op["responses"]["404"]["content"]["application/json"]["schema"]
        OAS31Validator(schema).validate(error.json())


# --- in-process (ASGI transport): a sync service, and configuration errors -----------------------


async def test_a_sync_service_behind_the_app(make_service: Any) -> None:
    from httphelpers import authorize

    from memtier.threads.http import create_conversation_app

    service = make_service()  # sync: its calls run in Starlette's threadpool
    app = create_conversation_app(service, authorize, base_path="/threads/")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as c:
        created = await c.post("/threads", json={"title": "sync"}, headers=ALICE)
        assert created.status_code == 201
        tid = created.json()["id"]
        turn = await c.post(f"/threads/{tid}/continue", json={"message": "x"}, headers=ALICE)
        assert turn.json()["status"] == "completed"
        assert (await c.get(f"/threads/{tid}", headers=MALLORY)).status_code == 404
        assert (await c.get("/threads/openapi.json")).status_code == 200


@pytest.mark.parametrize("base_path", ["", "/", "relative", "/a b", "/a//b", "/{x}"])
def test_bad_base_paths_are_refused(base_path: str) -> None:
    import fakeredis
    from httphelpers import authorize

    from memtier.config import MemtierConfig
    from memtier.errors import ConfigurationError
    from memtier.threads import ConversationService
    from memtier.threads.http import create_conversation_app

    service = ConversationService(fakeredis.FakeRedis(), MemtierConfig.load())
    with pytest.raises(ConfigurationError):
        create_conversation_app(service, authorize, base_path=base_path)
