"""The strict wire contract over real HTTP (uvicorn on a loopback port): exactly what the
served OpenAPI document says, every error a documented ``{code, message}``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from httphelpers import ALICE, MALLORY, api_server

from memtier.errors import http_status_for

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:websockets.*")
JSON = {"content-type": "application/json"}


@pytest.fixture
def api(backend: Any) -> Iterator[Any]:
    with api_server(backend) as server:
        yield server


def _error(response: httpx.Response, code: str) -> dict[str, Any]:
    assert response.headers["content-type"] == "application/json", response.headers
    body: dict[str, Any] = response.json()
    assert body["code"] == code, response.text
    assert isinstance(body["message"], str) and body["message"]
    assert response.status_code == http_status_for(code), (code, response.status_code)
    return body


def _thread(c: httpx.Client, url: str) -> tuple[str, dict[str, Any]]:
    created = c.post(url, json={"title": "t"}, headers=ALICE)
    tid = created.json()["id"]
    turn = c.post(f"{url}/{tid}/continue", json={"message": "m"}, headers=ALICE).json()
    return tid, turn


@pytest.mark.parametrize(
    ("suffix", "body"),
    [
        ("", {"request_id": "r1"}),  # snake_case aliases are not the wire format
        ("", {"title": "t", "unknown": 1}),
        ("", {"title": 5}),
        ("", {"metadata": [1]}),
        ("", {"id": "."}),
        ("", {"id": ".."}),
        ("", {"id": "openapi.json"}),
        ("", {"id": "events"}),
        ("/continue", {"message": "m", "leaf_id": "e2"}),
        ("/continue", {"message": "m", "extra": True}),
        ("/continue", {}),
        ("/branch", {"leaf_id": "e2"}),
        ("/branch", {"leafId": "e2", "expected_version": 1}),
        ("/branch", {"leafId": "e2", "expectedVersion": True}),
        ("/branch", {"leafId": "e2", "expectedVersion": "1"}),
        ("/branch", {"leafId": "e2", "expectedVersion": 1.0}),
        ("/branch", {"leafId": "e2", "expectedVersion": -1}),
        ("/archive", {"expectedVersion": "2"}),
        ("/archive", {"expectedVersion": False}),
        ("/export", {"cursor": 7}),
    ],
)
def test_bodies_outside_the_document_are_invalid_request(
    api: Any, suffix: str, body: dict[str, Any]
) -> None:
    with httpx.Client(timeout=60) as c:
        tid, _ = _thread(c, api.url)
        before = c.get(f"{api.url}/{tid}", headers=ALICE).json()
        target = api.url if suffix == "" else f"{api.url}/{tid}{suffix}"
        _error(c.post(target, json=body, headers=ALICE), "invalid_request")
        assert c.get(f"{api.url}/{tid}", headers=ALICE).json() == before  # nothing written
        assert len(c.get(api.url, headers=ALICE).json()["items"]) == 1


@pytest.mark.parametrize(
    "raw",
    [
        b'{"metadata": {"x": NaN}}',
        b'{"metadata": {"x": Infinity}}',
        b'{"metadata": {"x": -Infinity}}',
        b'{"title": "\xff\xfe"}',  # not UTF-8
        b'{"title": "a"',  # malformed
        b'{"title": "a"} {"title": "b"}',  # trailing data
        b"[]",
        b'"just a string"',
        b'{"metadata": ' + b'{"a": ' * 70 + b"1" + b"}" * 71,  # too deep
        b'{"metadata": {"a": ' + b"[" * 5000 + b"]" * 5000 + b"}}",  # far too deep
        b"\xef\xbb\xbf{}",  # a BOM is not JSON
    ],
)
def test_json_that_is_not_strict_json_is_invalid_request(api: Any, raw: bytes) -> None:
    with httpx.Client(timeout=60) as c:
        _error(c.post(api.url, content=raw, headers={**ALICE, **JSON}), "invalid_request")
        assert c.get(api.url, headers=ALICE).json() == {"items": []}


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "application/json; charset=latin-1"],
)
@pytest.mark.parametrize("suffix", ["", "/continue", "/branch", "/archive", "/export"])
def test_a_body_that_is_not_application_json_is_415(
    api: Any, content_type: str | None, suffix: str
) -> None:
    with httpx.Client(timeout=60) as c:
        tid, _ = _thread(c, api.url)
        target = api.url if suffix == "" else f"{api.url}/{tid}{suffix}"
        headers = dict(ALICE)
        if content_type is not None:
            headers["content-type"] = content_type
        body = _error(
            c.post(target, content=b'{"message": "m", "leafId": "e2"}', headers=headers),
            "unsupported_media_type",
        )
        assert "application/json" in body["message"]


def test_required_bodies_need_json_and_optional_bodies_may_be_absent(api: Any) -> None:
    with httpx.Client(timeout=60) as c:
        tid, _ = _thread(c, api.url)
        _error(c.post(f"{api.url}/{tid}/continue", headers=ALICE), "unsupported_media_type")
        _error(c.post(f"{api.url}/{tid}/branch", headers={**ALICE, **JSON}), "invalid_request")
        assert c.post(f"{api.url}/{tid}/export", headers=ALICE).status_code == 200
        ok = c.post(f"{api.url}/{tid}/archive", headers={**ALICE, **JSON})
        assert ok.status_code == 200
        # the document allows `null` for an optional body (found by schemathesis)
        assert c.post(f"{api.url}/{tid}/export", content=b"null", headers={**ALICE, **JSON})
        assert c.post(api.url, content=b"null", headers={**ALICE, **JSON}).status_code == 201
        _error(
            c.post(f"{api.url}/{tid}/branch", content=b"null", headers={**ALICE, **JSON}),
            "invalid_request",
        )
        charset = {"content-type": "application/json; charset=utf-8"}
        assert c.post(api.url, content=b"{}", headers={**ALICE, **charset}).status_code == 201


@pytest.mark.parametrize(
    ("suffix", "params"),
    [
        ("", {"limit": "1.0"}),
        ("", {"limit": "0"}),
        ("", {"limit": "-1"}),
        ("", {"limit": "ten"}),
        ("", {"page": "2"}),
        ("/{tid}/events", {"limit": "1e1"}),
        ("/{tid}/events", {"offset": "0"}),
        ("/{tid}", {"x": "1"}),
    ],
)
def test_query_strings_outside_the_document_are_invalid_request(
    api: Any, suffix: str, params: dict[str, str]
) -> None:
    with httpx.Client(timeout=60) as c:
        tid, _ = _thread(c, api.url)
        target = api.url + suffix.replace("{tid}", tid)
        _error(c.get(target, params=params, headers=ALICE), "invalid_request")


def test_framework_responses_keep_the_error_shape(api: Any) -> None:
    with httpx.Client(timeout=60) as c:
        _error(c.get(api.root + "/nowhere", headers=ALICE), "not_found")
        _error(c.get(api.url + "/x/y/z", headers=ALICE), "not_found")
        wrong = c.put(api.url, headers=ALICE)
        _error(wrong, "method_not_allowed")
        assert wrong.headers["allow"] == "GET, POST"  # every documented method (found by st)
        other = c.request("OPTIONS", api.url + "/some-id", headers=ALICE)
        _error(other, "method_not_allowed")
        assert other.headers["allow"] == "DELETE, GET"
        _error(c.patch(api.url + "/some-id/events", headers=ALICE), "method_not_allowed")


def test_create_answers_201_then_200_with_the_winner_unchanged(api: Any) -> None:
    with httpx.Client(timeout=60) as c:
        first = c.post(api.url, json={"id": "plan-1", "title": "one"}, headers=ALICE)
        assert first.status_code == 201
        for body in ({"id": "plan-1"}, {"id": "plan-1", "title": "two", "metadata": {"a": 1}}):
            again = c.post(api.url, json=body, headers=ALICE)
            assert again.status_code == 200 and again.json() == first.json(), again.text
        derived = c.post(api.url, json={"requestId": "ui-1", "title": "x"}, headers=ALICE)
        repeat = c.post(api.url, json={"requestId": "ui-1", "title": "y"}, headers=ALICE)
        assert (derived.status_code, repeat.status_code) == (201, 200)
        assert repeat.json() == derived.json()


def test_a_503_never_shows_the_redis_address(backend: Any) -> None:
    from test_threads_http import _dead_backend

    dead = _dead_backend(backend)
    with api_server(dead) as server, httpx.Client(timeout=120) as c:
        body = _error(c.get(server.url, headers=ALICE), "backend_unavailable")
        text = c.get(server.url, headers=ALICE).text
    host_port = dead.url.removeprefix("redis://").removesuffix("/0")
    assert host_port not in text and "redis" not in text.lower(), text
    assert set(body) == {"code", "message"}


def test_wrong_owner_is_identical_to_missing_on_the_new_error_paths(api: Any) -> None:
    """Every refusal before the thread is looked up is the same for a wrong owner and a
    missing thread; after it, both are the same 404."""
    with httpx.Client(timeout=60) as c:
        tid, _ = _thread(c, api.url)
        cases: list[tuple[str, str, dict[str, Any]]] = [
            ("POST", "/continue", {"content": b"{}", "headers": {"content-type": "text/plain"}}),
            ("POST", "/branch", {"content": b"{bad", "headers": JSON}),
            ("POST", "/branch", {"json": {"leafId": "e2", "expectedVersion": "1"}}),
            ("POST", "/branch", {"json": {"leaf_id": "e2"}}),
            ("POST", "/archive", {"content": b'{"expectedVersion": NaN}', "headers": JSON}),
            ("POST", "/export", {"json": {"cursor": "bogus"}}),
            ("POST", "/export", {"content": b"\xff", "headers": JSON}),
            ("GET", "/events", {"params": {"limit": "x"}}),
            ("GET", "/events", {"params": {"cursor": "bogus"}}),
            ("GET", "", {"params": {"unknown": "1"}}),
            ("PUT", "", {}),
            ("PATCH", "/events", {}),
            ("POST", "/continue", {"json": {"message": "hi", "leafId": "e2"}}),
            ("POST", "/branch", {"json": {"leafId": "e2", "expectedVersion": 1}}),
            ("POST", "/archive", {"json": {"expectedVersion": 1}}),
        ]
        for method, suffix, kw in cases:
            headers = {**kw.pop("headers", {})}
            wrong = c.request(
                method, f"{api.url}/{tid}{suffix}", headers={**MALLORY, **headers}, **kw
            )
            missing = c.request(
                method, f"{api.url}/conv_missing{suffix}", headers={**ALICE, **headers}, **kw
            )
            assert wrong.status_code == missing.status_code, (method, suffix, wrong.text)
            assert wrong.content == missing.content, (method, suffix)
            assert wrong.headers["content-type"] == missing.headers["content-type"]
            assert wrong.json()["code"] in http_status_codes(), wrong.text
        assert c.get(f"{api.url}/{tid}", headers=ALICE).json()["version"] == 1  # untouched


def http_status_codes() -> set[str]:
    from memtier.threads.http import status_table

    return set(status_table())
