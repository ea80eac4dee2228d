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
from servers import unavailable

ROOT = Path(__file__).resolve().parent.parent


def _require_redis_binaries() -> None:
    missing = [b for b in ("redis-server", "redis-benchmark") if shutil.which(b) is None]
    if not missing:
        return
    unavailable(
        f"{', '.join(missing)} not on PATH: the benchmark harness needs a real Redis",
        skip_needs_opt_in=True,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


@pytest.fixture(scope="module")
def tiny_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """One ``python -m bench.run --tiny`` for this module (the figures draw from its JSON)."""
    _require_redis_binaries()
    out = tmp_path_factory.mktemp("bench") / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--tiny", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    return proc, out


@pytest.mark.real
@pytest.mark.slow
def test_tiny_run_writes_table_json_and_stops_its_server(
    tiny_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    proc, out = tiny_run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    # The table: one block per section and the targets, printed on stdout.
    for heading in ("== append, sync, one connection [300B]", "== scale", "== targets"):
        assert heading in proc.stdout, heading

    data = json.loads((out / "latest-tiny.json").read_text())  # strict JSON (no NaN)
    results = {r["key"]: r for r in data["results"]}
    assert not data["meta"]["section_errors"]
    # The tree measured, "+dirty" when it had uncommitted changes (bench.probe.git_commit).
    from bench.probe import git_commit

    assert data["meta"]["git_commit"] == git_commit()
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
    # The floors: the commands the semantics require, from redis-benchmark, with their
    # server cost; each server-side target carries the floor's ratio next to its own.
    for key in (
        "floor.append.300B.redis-benchmark",
        "floor.read20.300B.redis-benchmark",
        "procs.floor-own",
    ):
        row = results[key]
        assert row["status"] == "ok" and row["summary"]["median"] > 0, row
        assert row["server_us_per_op"] and row["cmds_per_op"] >= 3, row
    assert results["procs.floor-own"]["baseline"] == "procs.base-own"
    script_own = results["procs.script-own"]  # the processes' Python floor
    assert script_own["status"] == "ok" and script_own["summary"]["median"] > 0, script_own
    assert script_own["baseline"] == "procs.base-own" and script_own["ratios"], script_own
    # The continue's floors: the C client's and Python's (the same 3 scripts, pre-encoded
    # socket), each a ratio against the threads group's raw script, named in the target.
    # memtier's own three scripts, recorded from real continues and replayed (every reply
    # compared with the recorded one), are a row of the same group, named in the target.
    for key in (
        "threads.floor.continue.redis-benchmark",
        "threads.floor.continue.python",
        "threads.continue.scripts.python",
    ):
        row = results[key]
        assert row["status"] == "ok" and row["summary"]["median"] > 0, row
        assert row["baseline"] == "threads.base.append.300B.redispy" and row["ratios"], row
    own = results["threads.continue.scripts.python"]
    assert own["cmds_per_op"] >= 9 and own["server_us_per_op"], own  # the scripts' commands
    threads_target = targets["threads continue (echo runner) vs raw minimal script"]
    assert "Python floor (the floor's 3 scripts" in threads_target["detail"], threads_target
    assert "memtier's own 3 scripts" in threads_target["detail"], threads_target
    # Targets added for issue 12: same-run ratios with a spread; Redis CPU from per-round
    # INFO commandstats; the 8-process target is not judged on the 2-process tiny run.
    for name in (
        "threads continue (echo runner) vs raw minimal script",
        "Redis CPU per append vs the minimal script [300B]",
        "Redis CPU per append, stretch [300B]",
    ):
        t = targets[name]
        assert t["value"] is not None and t["met"] in (True, False), t
        assert t["low"] is not None and t["low"] <= t["value"] <= t["high"], t
    rounds = data["meta"]["settings"]["rounds"]
    for key in ("memtier.append.300B.sync", "base.append.300B.redispy"):
        assert len(results[key]["extra"]["server_us_per_round"]) == rounds
        top = results[key]["extra"]["server_top_us_per_round"]  # scripts counted once
        assert len(top) == rounds
        summed = results[key]["extra"]["server_us_per_round"]
        assert all(0 < t <= s for t, s in zip(top, summed, strict=True))
    assert targets["Redis CPU per append vs the minimal script [300B]"]["floor"] is not None
    procs_target = targets["8 processes appending, one shard, vs raw minimal script from 8"]
    assert data["meta"]["settings"]["procs"] == 2
    assert procs_target["met"] is None and "not measured" in procs_target["detail"]
    assert procs_target["floor"] is not None
    assert "Python floor (memtier's script from 2 processes" in procs_target["detail"]
    assert (out / "latest-tiny.md").read_text().count("| ") > 10

    # The harness stopped the server it started, and removed its directory.
    pid = data["meta"]["server_pid"]
    assert isinstance(pid, int) and not _alive(pid)
    assert not Path(data["meta"]["server_dir"]).exists()


@pytest.mark.real
@pytest.mark.slow
def test_figures_draw_from_the_tiny_run(
    tiny_run: tuple[subprocess.CompletedProcess[str], Path], tmp_path: Path
) -> None:
    """``python -m bench.figures`` draws both figures from the tiny run's JSON."""
    proc, out = tiny_run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    from bench.figures import draw_scale, draw_targets

    results_json = out / "latest-tiny.json"
    figures = tmp_path / "figures"
    cli = subprocess.run(
        [sys.executable, "-m", "bench.figures", str(results_json), "--out", str(figures)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert cli.returncode == 0, cli.stdout + cli.stderr
    for name in ("scale-latency.png", "targets.png"):
        png = (figures / name).read_bytes()
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000, name

    data = json.loads(results_json.read_text())
    levels = data["meta"]["settings"]["scale_levels"]
    series = draw_scale(data, tmp_path / "again" / "scale.png")
    # memtier append, context and the raw script, p50 and p99, at every level of the run.
    assert sorted(series) == sorted(
        f"{op}.{q}" for op in ("append", "context", "reference") for q in ("p50", "p99")
    )
    for points in series.values():
        assert [lv for lv, _ in points] == levels and all(us > 0 for _, us in points)
    points = draw_targets(data, tmp_path / "again" / "targets.png")
    assert [p.name for p in points] == [t["name"] for t in data["targets"]]
    for p, t in zip(points, data["targets"], strict=True):
        if t["met"] is None:  # drawn as not measured, never as a value
            assert p.score is None and p.label.startswith("not measured"), (p, t)
        else:
            assert p.score is not None and p.met is t["met"], (p, t)
