"""The README's tables are checked against the code, so the docs cannot drift."""

from __future__ import annotations

import re
from pathlib import Path

from memtier.config import ConversationConfig
from memtier.errors import http_status_for
from memtier.memory.models import ReasonCode

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


def _rows(pattern: str) -> list[tuple[str, ...]]:
    return re.findall(pattern, README, flags=re.MULTILINE)


def test_limits_table_matches_hard_ceilings() -> None:
    rows = {
        name: (float(default), float(minimum), float(ceiling))
        for name, default, minimum, ceiling in _rows(
            r"^\| `(\w+)` \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$"
        )
    }
    for name, bound in ConversationConfig.BOUNDS.items():
        assert rows.get(name) == (bound.default, bound.minimum, bound.ceiling), name


def test_error_table_matches_http_mapping() -> None:
    rows = _rows(r"^\| `\w+Error` \| `(\w+)` \| (\d{3}) \|$")
    assert len(rows) >= 10
    for code, status in rows:
        assert http_status_for(code) == int(status), code


def test_every_reason_code_is_documented() -> None:
    for reason in ReasonCode:
        assert f"`{reason.value}`" in README, reason


def _python_block_after(heading: str) -> str:
    start = README.index(heading)
    match = re.search(r"```python\n(.*?)```", README[start:], flags=re.DOTALL)
    assert match is not None, heading
    return match.group(1)


def test_memory_example_runs_on_a_real_server(redis_server: object) -> None:
    code = _python_block_after("## Conversation memory")
    code = code.replace("redis://127.0.0.1:6379/0", redis_server.url)  # type: ignore[attr-defined]
    code = code.replace(
        "MemtierConfig.load(redis_url=", 'MemtierConfig.load(namespace="readme", redis_url='
    )
    scope: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["receipt"].seq == 1  # type: ignore[attr-defined]
    assert scope["messages"][0]["role"] == "user"  # type: ignore[index]


def test_threads_example_runs() -> None:
    scope: dict[str, object] = {}
    exec(compile(_python_block_after("## Conversation threads"), "README.md", "exec"), scope)
    assert scope["page"].records  # type: ignore[attr-defined]
