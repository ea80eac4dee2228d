"""`memtier worker --metrics-port`: a real worker process, scraped over HTTP like Prometheus."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_worker_serves_metrics_for_prometheus(redis_server: Any, tmp_path: Path) -> None:
    port = _free_port()
    env = {**os.environ, "MEMTIER_REDIS_URL": redis_server.url, "MEMTIER_NAMESPACE": "wmetrics"}
    log = (tmp_path / "worker.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "memtier",
            "worker",
            "--metrics-port",
            str(port),
            "--sweep-interval",
            "0.2",
            "--deadline",
            "60",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        body = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # bounded poll until the worker has swept once
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    body = r.read().decode()
                # The scrape itself runs partition_stats (the session/byte gauges are
                # read at scrape time): wait for the worker's own sweep instead.
                if 'script="sweep_expired"' in body:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        names = {f.name for f in text_string_to_metric_families(body)}
        worker_log = (tmp_path / "worker.log").read_text(errors="replace")
        assert "memtier_script_duration_seconds" in names, worker_log[-2000:]
        assert {"memtier_compactions", "memtier_snapshot_flushes", "memtier_expiries"} <= names
        assert 'script="sweep_expired"' in body  # the worker's own sweeps are measured
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
