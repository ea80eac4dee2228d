"""The benchmark's own ``redis-server``: free loopback port, temp dir, always stopped.

The harness never talks to a server it did not start: :class:`BenchRedis`
launches ``redis-server`` from ``PATH`` bound to 127.0.0.1 on a port that was
free a moment ago (probed by binding a socket to port 0, retried if another
process wins the race), with persistence off, in a fresh temporary directory.
``stop()`` sends ``SHUTDOWN NOSAVE``, then SIGTERM, then SIGKILL, and removes
the directory; it runs from ``__exit__`` (also on error), from an ``atexit``
hook, and the kernel sends the server SIGTERM if the harness dies
(``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

__all__ = ["HOST", "BenchRedis", "ServerError", "free_port"]

HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0  # generous: a loaded two-core machine is slow, never flaky
STOP_TIMEOUT_S = 20.0  # per escalation step
PORT_ATTEMPTS = 3

_PR_SET_PDEATHSIG = 1
_LIBC: Any = None
with contextlib.suppress(OSError, TypeError):
    _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class ServerError(RuntimeError):
    """``redis-server`` is missing or did not come up (the message has its log tail)."""


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:  # in the child, between fork and exec
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class BenchRedis:
    """One throw-away ``redis-server`` for one benchmark run."""

    def __init__(self, binary: str = "redis-server", extra: dict[str, str] | None = None) -> None:
        found = shutil.which(binary)
        if found is None:
            raise ServerError(
                f"{binary!r} not found on PATH: install Debian's redis-server"
                " (`apt-get install -y redis-server`)"
            )
        self.binary = found
        self.extra = dict(extra or {})
        self.port = 0
        self.workdir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.version = ""

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def client(self, **kwargs: Any) -> redis.Redis:
        return redis.Redis(host=HOST, port=self.port, **kwargs)

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self) -> BenchRedis:
        self.workdir = Path(tempfile.mkdtemp(prefix="memtier-bench-"))
        atexit.register(self.stop)
        last = ""
        for _ in range(PORT_ATTEMPTS):
            self.port = free_port()
            self._spawn()
            try:
                self._wait_ready()
                return self
            except ServerError as exc:
                last = str(exc)
                self._kill()
                if "Address already in use" not in last:
                    break
        self.stop()
        raise ServerError(last)

    def _config(self) -> Path:
        assert self.workdir is not None
        lines = {
            "bind": HOST,
            "port": str(self.port),
            "protected-mode": "yes",
            "daemonize": "no",
            "dir": str(self.workdir),
            "logfile": str(self.workdir / "redis.log"),
            "save": '""',
            "appendonly": "no",
            "databases": "1",
            **self.extra,
        }
        path = self.workdir / "redis.conf"
        path.write_text("".join(f"{k} {v}\n" for k, v in lines.items()), encoding="utf-8")
        return path

    def _spawn(self) -> None:
        conf = self._config()
        self.proc = subprocess.Popen(
            [self.binary, str(conf)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )

    def _log_tail(self) -> str:
        if self.workdir is None:
            return ""
        path = self.workdir / "redis.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-15:])

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise ServerError(f"redis-server exited at start:\n{self._log_tail()}")
            try:
                with self.client(socket_timeout=2) as probe:
                    if probe.ping():
                        self.version = str(probe.info("server").get("redis_version", ""))
                        return
            except redis.exceptions.RedisError:
                pass
            time.sleep(0.05)
        raise ServerError(f"redis-server did not answer PING in time:\n{self._log_tail()}")

    def _kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        if self.port:
            with (
                contextlib.suppress(redis.exceptions.RedisError),
                self.client(socket_timeout=5) as admin,
            ):
                admin.shutdown(nosave=True)
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None and proc.poll() is None:
                proc.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=STOP_TIMEOUT_S)
                return

    def stop(self) -> None:
        """Stop the server (idempotent) and remove its directory."""
        self._kill()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> BenchRedis:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- introspection -------------------------------------------------------------------------
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def rss_bytes(self) -> int:
        """Resident set size of the server process (from /proc), 0 if unknown."""
        pid = self.pid()
        if pid is None:
            return 0
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return 0
        return 0


def kill_pid_quietly(pid: int) -> None:
    """SIGTERM one process we started (used for our own worker processes only)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
