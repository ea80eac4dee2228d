"""A real ``memtier worker`` process: every clean exit flushes a final generation.

SIGTERM, SIGINT, ``--deadline`` and ``--drain`` each end the worker cleanly; with
persistence on (and no periodic flush, so only the final one can write) the newest
generation must hold the last appends.  Checked end to end: the namespace is wiped in
Redis and recovered from the files, and the last turn is there.  Also: the worker's
INFO lines (one per action), ``--log-format json``, and session/byte gauges read at
scrape time on ``--metrics-port``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from servers import RedisServer

from memtier import AvatarMessage, ConversationKey, ConversationStore
from memtier.config import MemtierConfig

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0
EXIT_TIMEOUT_S = 60.0
KEYS = [ConversationKey(f"00000000-0000-4000-8000-0000000000{n:02d}", "im") for n in range(5)]


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "MEMTIER_CONVERSATION__PERSISTENCE_ENABLED": "true",
        "MEMTIER_CONVERSATION__STORAGE_PATH": str(tmp_path / "data"),
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }


def _config(server: RedisServer, namespace: str, tmp_path: Path) -> MemtierConfig:
    return MemtierConfig.load(
        redis_url=server.url,
        namespace=namespace,
        conversation={"persistence_enabled": True, "storage_path": str(tmp_path / "data")},
    )


def _append(store: ConversationStore, label: str) -> None:
    for k in KEYS:
        store.append(k, AvatarMessage(text=f"{label} for {k.avatar}"))


def _wipe(server: RedisServer, namespace: str) -> None:
    with server.client() as raw:
        keys = list(raw.scan_iter(match=f"*{namespace}*", count=1000))
        if keys:
            raw.delete(*keys)


def _wait_for_line(log_path: Path, needle: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:  # bounded by the deadline
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        if needle in text:
            return
        assert proc.poll() is None, f"worker exited early ({proc.returncode}):\n{text[-3000:]}"
        assert time.monotonic() < deadline, f"no {needle!r} in the worker log:\n{text[-3000:]}"
        time.sleep(0.05)


def _worker(namespace: str, server: RedisServer, tmp_path: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "memtier",
        "worker",
        "--redis-url",
        server.url,
        "--namespace",
        namespace,
        "--flush-interval",
        "0",  # no periodic flush: only the final one can write a generation
        "--block-ms",
        "50",
        "--sweep-interval",
        "3600",
        *extra,
    ]


@pytest.mark.parametrize("exit_path", ["SIGTERM", "SIGINT", "deadline", "drain"])
def test_every_clean_exit_flushes_the_last_appends(
    exit_path: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    namespace = "wl" + os.urandom(4).hex()
    config = _config(redis_server, namespace, tmp_path)
    log_path = tmp_path / "worker.log"
    extra = {
        "SIGTERM": ["--log-format", "json"],
        "SIGINT": [],
        "deadline": ["--deadline", "3"],
        "drain": ["--drain", "--deadline", "120"],
    }[exit_path]
    store = ConversationStore.from_config(config, recover=False)
    try:
        _append(store, "first")
        if exit_path in ("deadline", "drain"):
            _append(store, "last")  # before the worker starts: it must exit by itself
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                _worker(namespace, redis_server, tmp_path, *extra),
                cwd=REPO,
                env=_env(tmp_path),
                stdout=subprocess.PIPE,
                stderr=log,
            )
            try:
                _wait_for_line(log_path, "started", proc)
                if exit_path.startswith("SIG"):
                    _append(store, "last")  # while it runs; then the signal
                    proc.send_signal(getattr(signal, exit_path))
                out, _ = proc.communicate(timeout=EXIT_TIMEOUT_S)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        text = log_path.read_text(errors="replace")
        assert proc.returncode == 0, text[-3000:]
        stats = json.loads(out.decode().splitlines()[-1])
        assert stats["flushes"] == 1 and stats["flush_errors"] == 0, (stats, text[-3000:])

        # The final generation holds the last appends: wipe Redis, recover, read back.
        _wipe(redis_server, namespace)
        report = store.recover()
        assert report.outcome == "restored", report
        for k in KEYS:
            texts = [m.content for m in store.context(k).messages]
            assert any(f"last for {k.avatar}" in t for t in texts), texts

        if exit_path == "SIGTERM":  # --log-format json: every line one JSON object
            lines = [json.loads(line) for line in text.splitlines() if line.strip()]
            actions = [line.get("action") for line in lines]
            assert "start" in actions and "stop" in actions and "flush" in actions
            flush = next(line for line in lines if line.get("action") == "flush")
            assert flush["sessions"] == len(KEYS) and flush["bytes"] > 0
            assert flush["level"] == "INFO" and flush["reason"] == "final, stop"
        else:
            assert "INFO memtier.worker: snapshot flush (final," in text, text[-3000:]
    finally:
        _wipe(redis_server, namespace)
        store.close()


def test_quiet_worker_logs_nothing_at_info(redis_server: RedisServer, tmp_path: Path) -> None:
    namespace = "wq" + os.urandom(4).hex()
    done = subprocess.run(
        [*_worker(namespace, redis_server, tmp_path, "--drain", "--deadline", "60"), "-q"],
        cwd=REPO,
        env=_env(tmp_path),
        capture_output=True,
        timeout=EXIT_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert b"INFO" not in done.stderr, done.stderr
    _wipe(redis_server, namespace)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_worker_metrics_gauges_are_read_at_scrape_time(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """``memtier_active_sessions`` / ``memtier_stored_bytes`` follow Redis between scrapes."""
    namespace = "wg" + os.urandom(4).hex()
    config = _config(redis_server, namespace, tmp_path)
    port = _free_port()
    log_path = tmp_path / "worker.log"
    store = ConversationStore.from_config(config, recover=False)

    def scrape() -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            body = reply.read().decode()
        return {
            sample.name: sample.value
            for family in text_string_to_metric_families(body)
            for sample in family.samples
            if sample.name in ("memtier_active_sessions", "memtier_stored_bytes")
        }

    def scrape_until(sessions: int) -> dict[str, float]:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:  # bounded: refreshes at most once a second, so poll a little
            values = scrape()
            if values.get("memtier_active_sessions") == sessions:
                return values
            assert time.monotonic() < deadline, values
            time.sleep(0.2)

    try:
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                _worker(namespace, redis_server, tmp_path, "--metrics-port", str(port)),
                cwd=REPO,
                env=_env(tmp_path),
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
            try:
                _wait_for_line(log_path, "started", proc)
                assert scrape_until(0)["memtier_stored_bytes"] == 0
                _append(store, "hello")
                expected: Any = store.stats()
                values = scrape_until(len(KEYS))
                assert values["memtier_stored_bytes"] == expected["bytes"] > 0
                store.delete(KEYS[0])
                assert scrape_until(len(KEYS) - 1)["memtier_stored_bytes"] < expected["bytes"]
            finally:
                proc.terminate()
                try:
                    proc.wait(timeout=EXIT_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    finally:
        _wipe(redis_server, namespace)
        store.close()
