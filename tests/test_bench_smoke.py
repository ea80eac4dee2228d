"""Smoke test of the benchmark harness: ``python -m bench.run --tiny`` runs end to end.

It asserts that the documented command works at a tiny size -- starts its own
redis-server, measures every section, prints the table, writes strict JSON and
Markdown, and stops the server it started -- and never asserts a figure (the
machine is shared and noisy; speeds are the harness's output, not a test).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ALLOW_SKIP_ENV = "MEMTIER_ALLOW_SKIP_REAL"


def _require_redis_binaries() -> None:
    missing = [b for b in ("redis-server", "redis-benchmark") if shutil.which(b) is None]
    if not missing:
        return
    message = f"{', '.join(missing)} not on PATH: the benchmark harness needs a real Redis"
    if os.environ.get(ALLOW_SKIP_ENV) == "1" and not os.environ.get("CI"):
        pytest.skip(message)
    pytest.fail(message, pytrace=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


@pytest.mark.real
@pytest.mark.slow
def test_tiny_run_writes_table_json_and_stops_its_server(tmp_path: Path) -> None:
    _require_redis_binaries()
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--tiny", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    # The table: one block per section and the targets, printed on stdout.
    for heading in ("== append, sync, one connection [300B]", "== scale", "== targets"):
        assert heading in proc.stdout, heading

    data = json.loads((out / "latest-tiny.json").read_text())  # strict JSON (no NaN)
    results = {r["key"]: r for r in data["results"]}
    assert not data["meta"]["section_errors"]
    # Every measured row has rounds, a median and spread; candidates carry same-run ratios.
    for key in (
        "base.append.300B.redispy",
        "memtier.append.300B.sync",
        "memtier.read20.300B.sync",
        "memtier.append.300B.asyncio",
        "memtier.metadata.page100",
        "procs.memtier-shared",
        "memory.turn.300B",
        "langgraph.put.memtier",
        "langgraph.get_tuple.memtier",
    ):
        row = results[key]
        assert row["status"] == "ok", row
        assert row["values"] and row["summary"]["median"] > 0, row
    assert results["memtier.append.300B.sync"]["baseline"] == "base.append.300B.redispy"
    assert len(results["memtier.append.300B.sync"]["ratios"]) == data["meta"]["settings"]["rounds"]
    for op in ("put", "get_tuple"):  # LangGraph checkpointers: same-run ratios vs SQLite
        for peer in ("memtier", "inmemory"):
            row = results[f"langgraph.{op}.{peer}"]
            assert row["baseline"] == f"langgraph.{op}.sqlite" and row["ratios"], row
    levels = data["meta"]["settings"]["scale_levels"]
    assert results[f"scale.append.p50.{levels[-1]}"]["ratios"]
    # Not-yet-measurable figures are reported as such, never as numbers.
    for row in data["results"]:
        if row["status"] != "ok":
            assert not row["values"] and row["note"], row
    targets = {t["name"]: t for t in data["targets"]}
    assert targets["context in one round trip"]["value"] == 1.0
    assert (out / "latest-tiny.md").read_text().count("| ") > 10

    # The harness stopped the server it started, and removed its directory.
    pid = data["meta"]["server_pid"]
    assert isinstance(pid, int) and not _alive(pid)
    assert not Path(data["meta"]["server_dir"]).exists()
