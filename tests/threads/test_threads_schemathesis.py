"""The adversary of the wire contract: schemathesis against a real ``memtier serve`` process on
a real redis-server, and the stateful walk through the document's OpenAPI links.

schemathesis runs through its CLI (``st run``, 4.x) in a subprocess: its examples, coverage,
fuzzing and stateful phases, positive and negative data, with the checks the issue names.
Derandomised (``--generation-deterministic``) with a fixed example budget per operation, so
the run is the same every time and finishes well within two minutes on two cores.  Every
failure it found was fixed in the API, none is excluded (its finds are pinned as tests:
the outer 404 shape below, the Allow header and the null optional body in
test_threads_wire.py).  ``schemathesis_hooks.py`` only lets stateful walks start at create.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from httphelpers import serve_process
from servers import RedisServer

pytestmark = pytest.mark.real

BASE = "/memtier/conversations"
TOKEN = "schemathesis-token"
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
    "use_after_free",
    "ensure_resource_availability",
)
MAX_EXAMPLES = 25  # per operation and phase: the fixed budget
RUN_TIMEOUT_S = 240  # a hard stop for a hung run (the budget itself takes about 40 s)


def _keys_file(tmp_path: Path) -> Path:
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    path = tmp_path / "api-keys.toml"
    path.write_text(f'[[keys]]\nsha256 = "{digest}"\ntenant = "acme"\nuser = "st"\n', "utf-8")
    return path


def _st_command() -> list[str]:
    st = Path(sys.executable).with_name("st")
    if st.exists():
        return [str(st)]
    found = shutil.which("st")
    assert found, "schemathesis' `st` command is missing: pip install -e '.[test]'"
    return [found]


FUZZ_RUNNER = """
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from memtier.threads import EchoRunner


class FuzzOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    temperature: float | None = Field(default=None, ge=0, le=2)
    tool_choice: Literal["auto", "none", "required"] | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=100000)


class FuzzRunner(EchoRunner):
    run_options_schema = FuzzOptions


def factory():
    return FuzzRunner()
"""


@pytest.fixture
def served(tmp_path: Path, redis_server: RedisServer) -> Any:
    env = {"MEMTIER_NAMESPACE": "st" + str(time.monotonic_ns())[-8:]}
    # The echo runner with a run-options schema, so that `runOptions` is in the document
    # (and fuzzed: positive and negative data against the host's schema).
    (tmp_path / "fuzz_runner.py").write_text(FUZZ_RUNNER, encoding="utf-8")
    args = ["--redis-url", redis_server.url, "--api-keys", str(_keys_file(tmp_path))]
    args += ["--runner", "fuzz_runner:factory"]
    with serve_process(args, tmp_path, env=env) as serve:
        serve.wait_status("/readyz", 200)
        yield serve


def test_schemathesis_finds_nothing_against_the_real_server(served: Any, tmp_path: Path) -> None:
    command = [
        *_st_command(),
        "run",
        f"{served.url}{BASE}/openapi.json",
        "--header",
        f"Authorization: Bearer {TOKEN}",
        "--checks",
        ",".join(CHECKS),
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--mode",
        "all",  # positive and negative data
        "--generation-deterministic",
        "--max-examples",
        str(MAX_EXAMPLES),
        "--workers",
        "1",
        "--request-timeout",
        "60",
        "--no-color",
        "--report",
        "ndjson",
        "--report-dir",
        str(tmp_path / "report"),
    ]
    hooks = Path(__file__).with_name("schemathesis_hooks.py")
    env = {**os.environ, "NO_COLOR": "1", "SCHEMATHESIS_HOOKS": str(hooks)}
    done = subprocess.run(
        command,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output + "\n--- server log ---\n" + served.log()
    assert "10 selected / 10 total" in output, output
    for phase in ("Coverage", "Fuzzing", "Stateful"):
        assert re.search(rf"✅\s+{phase}", output), (phase, output)
    assert re.search(r"Test cases:\s+\d+ generated, \d+ passed", output), output
    assert "failed" not in output.split("SUMMARY", 1)[-1].lower(), output
    covered = re.search(r"API Links:\s+(\d+) covered", output)
    assert covered and int(covered.group(1)) >= 10, output  # the stateful walk used the links
    assert "Traceback" not in served.log()
    # The stateful phase walked from create through the document's own links.
    walked = _transitions(next((tmp_path / "report").glob("*.ndjson")))
    from_create = {t for t in walked if t.startswith("POST /memtier/conversations -> [201]")}
    assert from_create, walked
    documented = {t.split(" -> ")[1].split("] ", 1)[1] for t in walked}
    assert len(documented & set(DOCUMENTED_LINKS)) >= 4, walked


DOCUMENTED_LINKS = (
    "GetConversation",
    "ContinueConversation",
    "BranchConversation",
    "ArchiveConversation",
    "ExportConversation",
    "ReplayConversation",
    "DeleteConversation",
    "BranchFromTurn",
    "ContinueFromBranch",
)


def _transitions(report: Path) -> set[str]:
    """Every stateful transition ("<source> -> [<status>] <link> -> <target>") in an ndjson
    report of ``st run``."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            transition = node.get("transition")
            if isinstance(transition, dict) and isinstance(transition.get("id"), str):
                found.add(transition["id"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for line in report.read_text(encoding="utf-8").splitlines():
        if '"transition"' in line:
            walk(json.loads(line))
    return found


def _resolve(expression: str, response: dict[str, Any]) -> Any:
    """An OpenAPI runtime expression ``$response.body#/a/b`` against a JSON response."""
    assert expression.startswith("$response.body#/"), expression
    value: Any = response
    for part in expression.removeprefix("$response.body#/").split("/"):
        value = value[part]
    return value


def test_the_documented_links_walk_create_to_delete(served: Any) -> None:
    """create -> continue -> branch -> archive -> export -> replay -> delete, each step
    addressed only through the link the previous response's document entry declares."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=served.url, headers=headers, timeout=60) as c:
        doc = c.get(BASE + "/openapi.json").json()
        operations = {
            op["operationId"]: (method.upper(), path)
            for path, item in doc["paths"].items()
            for method, op in item.items()
        }

        def links_of(operation_id: str, status: str) -> dict[str, Any]:
            method, path = operations[operation_id]
            links: dict[str, Any] = doc["paths"][path][method.lower()]["responses"][status]["links"]
            return links

        def follow(link: dict[str, Any], response: dict[str, Any], **body: Any) -> Any:
            method, path = operations[link["operationId"]]
            for name, expression in link["parameters"].items():
                path = path.replace("{" + name + "}", str(_resolve(expression, response)))
            for name, expression in link.get("requestBody", {}).items():
                body[name] = _resolve(expression, response)
            sent = c.request(method, path, json=body if method == "POST" else None)
            assert sent.status_code == 200, (link, sent.text)
            return sent.json()

        created = c.post(BASE, json={"title": "walk"})
        assert created.status_code == 201
        thread = created.json()
        turn = follow(
            links_of("createConversation", "201")["ContinueConversation"], thread, message="hello"
        )
        branched = follow(links_of("continueConversation", "200")["BranchFromTurn"], turn)
        assert [b["leafId"] for b in branched["branches"]] == [turn["leafId"]]
        archived = follow(links_of("branchConversation", "200")["ArchiveConversation"], branched)
        assert archived["state"] == "archived"
        exported = follow(links_of("archiveConversation", "200")["ExportConversation"], archived)
        assert exported["thread"]["id"] == thread["id"]
        replayed = follow(links_of("exportConversation", "200")["ReplayConversation"], exported)
        assert replayed["terminal"] is True
        deleted = follow(links_of("exportConversation", "200")["DeleteConversation"], exported)
        assert deleted == {"deleted": True, "held": False}
        gone = c.get(f"{BASE}/{thread['id']}")
        assert gone.status_code == 404 and gone.json()["code"] == "not_found"


def test_paths_no_route_matches_keep_the_error_shape_on_the_served_app(served: Any) -> None:
    """Found by schemathesis: a thread id with a newline never matches the API's mount, and
    the outer app answered a text/plain 404."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=served.url, headers=headers, timeout=60) as c:
        for path in (f"{BASE}/a%0Ab/export", f"{BASE}/%0Ax", "/nowhere%0Ax"):
            response = c.post(path, json={})
            assert response.status_code == 404, (path, response.text)
            assert response.headers["content-type"] == "application/json"
            assert response.json() == {"code": "not_found", "message": "no such path"}
        assert c.get("/healthz").json()["status"] == "ok"
