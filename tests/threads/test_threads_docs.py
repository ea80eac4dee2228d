"""docs/threads.md is checked against the code, so it cannot drift."""

from __future__ import annotations

import hashlib
import re
import uuid
from pathlib import Path
from typing import Any

from memtier.config import ThreadsConfig
from memtier.errors import ConversationErrorCode, http_status_for

DOC = (Path(__file__).resolve().parents[2] / "docs" / "threads.md").read_text(encoding="utf-8")


def test_status_table_lists_every_code_with_its_status() -> None:
    section = DOC.split("Every code and its one status:", 1)[1].split("## Limits", 1)[0]
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| (\d{3}) \|", section, flags=re.MULTILINE))
    assert set(rows) == {code.value for code in ConversationErrorCode}
    for code, status in rows.items():
        assert http_status_for(code) == int(status), code


def test_limits_table_matches_defaults_and_hard_caps() -> None:
    rows = {
        name: (int(default), int(cap))
        for name, default, cap in re.findall(
            r"^\| `(\w+)` \| (\d+) \| (\d+) \|", DOC, flags=re.MULTILINE
        )
    }
    assert set(rows) == set(ThreadsConfig.BOUNDS)
    for name, bound in ThreadsConfig.BOUNDS.items():
        assert rows[name] == (bound.default, bound.ceiling), name


def test_the_api_keys_example_digest_is_a_real_sha256() -> None:
    (digest,) = re.findall(r'^sha256 = "([0-9a-f]{64})"$', DOC, flags=re.MULTILINE)
    assert digest == hashlib.sha256(b"test").hexdigest()  # the example token is "test"


def test_the_python_example_runs(monkeypatch: Any, capsys: Any) -> None:
    """The first example, as written, on the embedded Redis."""
    monkeypatch.delenv("MEMTIER_REDIS_URL", raising=False)
    monkeypatch.setenv("MEMTIER_NAMESPACE", "docs" + uuid.uuid4().hex[:8])
    (code,) = re.findall(r"```python\n(.*?)```", DOC, flags=re.DOTALL)[:1]
    exec(compile(code, "docs/threads.md", "exec"), {})
    out = capsys.readouterr().out
    assert "deleted=True held=False" in out and "agent_finished" in out


async def _served_document() -> dict[str, Any]:
    import fakeredis
    import httpx

    from memtier.config import MemtierConfig
    from memtier.threads import ConversationService
    from memtier.threads.http import create_conversation_app

    service = ConversationService(fakeredis.FakeRedis(), MemtierConfig.load())
    app = create_conversation_app(service, lambda request: None)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        response = await client.get("/memtier/conversations/openapi.json")
    assert response.status_code == 200
    document: dict[str, Any] = response.json()
    return document


async def test_the_error_table_is_the_served_documents() -> None:
    """docs/threads.md's error table == the served OpenAPI document's codes and statuses."""
    section = DOC.split("Every code and its one status:", 1)[1].split("## Limits", 1)[0]
    table = {c: int(s) for c, s in re.findall(r"^\| `([a-z_]+)` \| (\d{3}) \|", section, re.M)}
    document = await _served_document()
    assert document["x-memtier-error-codes"] == table
    served: dict[str, int] = {}
    route_statuses: dict[str, list[int]] = {}
    for path in document["paths"].values():
        for operation in path.values():
            route_statuses[operation["operationId"]] = sorted(map(int, operation["responses"]))
            for status, response in operation["responses"].items():
                schema = response.get("content", {}).get("application/json", {}).get("schema", {})
                for code in schema.get("properties", {}).get("code", {}).get("enum", []):
                    assert table[code] == int(status), (operation["operationId"], code, status)
                    served[code] = int(status)
    # every code is answered by some route, but for the framework's own 405
    assert set(served) == set(table) - {"method_not_allowed"}
    rows = re.findall(r"^\| `(\w+Conversations?\w*)` \| ([\d, ]+) \|", DOC, flags=re.MULTILINE)
    documented = {op: sorted(int(s) for s in statuses.split(", ")) for op, statuses in rows}
    assert documented == route_statuses
    for path in document["paths"].values():
        for operation in path.values():
            assert operation["security"] == [{"bearerAuth": []}]
