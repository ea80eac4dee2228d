"""Smoke test of ``bench.threadsprobe`` (issue 12, threads): it runs in seconds, writes
strict JSON of the expected shape and reports the request counts of each operation --
never a speed (figures on a shared machine are the probe's output, not a test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from servers import require_real_redis

ROOT = Path(__file__).resolve().parent.parent


def test_threadsprobe_runs_and_reports_round_trips(tmp_path: Path) -> None:
    require_real_redis("redis-server")
    out = tmp_path / "probe.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.threadsprobe",
            "--rounds",
            "1",
            "--ops",
            "4",
            "--prefill",
            "1",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    rows = data["rows"]
    # replay_cold: the same page with the served-rows memo emptied before each read
    assert set(rows) == {"raw", "continue", "replay", "export", "replay_cold"}
    assert data["prefill"] == 1
    # the echo runner's continue: claim, its one emit, commit (the hand-off is no request)
    assert rows["continue"]["requests"] == {
        "Handoff": 1.0,
        "events_append": 1.0,
        "run_claim": 1.0,
        "run_commit": 1.0,
    }
    assert rows["replay"]["requests"] == {"read_events": 1.0}
    assert rows["replay_cold"]["requests"] == {"read_events": 1.0}
    for row in rows.values():
        assert row["wall_us"]["median"] > 0 and row["cpu_us"]["median"] >= 0
    assert data["continue_vs_raw"]["median"] > 0
