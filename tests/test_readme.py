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
        name: (float(default), float(ceiling))
        for name, default, ceiling in _rows(r"^\| `(\w+)` \| ([\d.]+) \| ([\d.]+) \|$")
    }
    for name, bound in ConversationConfig.BOUNDS.items():
        assert rows.get(name) == (bound.default, bound.ceiling), name


def test_error_table_matches_http_mapping() -> None:
    rows = _rows(r"^\| `\w+Error` \| `(\w+)` \| (\d{3}) \|$")
    assert len(rows) >= 10
    for code, status in rows:
        assert http_status_for(code) == int(status), code


def test_every_reason_code_is_documented() -> None:
    for reason in ReasonCode:
        assert f"`{reason.value}`" in README, reason
