"""Private Redis servers for fault injection: our own pids, our own temp dirs.

A fault test never touches the session-wide fixture servers: it starts its own
server here (free loopback port, temp dir), keeps the pid, and checks with
``INFO server`` that the process it is about to ``DEBUG``/``CONFIG``/``CLIENT
KILL``/``SHUTDOWN`` is the one it launched (:meth:`FaultRedis.admin`).

Unlike ``servers.RedisServer``, a restart keeps the data directory (AOF
durability can be judged), :meth:`kill9` / :meth:`sigstop` crash and stall it,
and ``tmpfs_bytes`` runs it in its own mount namespace (``unshare -m``, as
root) with its data directory on a tmpfs of that size: a real ENOSPC.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from servers import (
    HOST,
    START_TIMEOUT_S,
    ServerStartError,
    find_binary,
    free_ports,
    write_redis_config,
)

__all__ = ["AOF_ALWAYS", "FaultRedis", "fault_redis"]

# AOF with fsync on every write: an acknowledged write survives a SIGKILL of Redis.
AOF_ALWAYS = {
    "appendonly": "yes",
    "appendfsync": "always",
    "appenddirname": "aof",
    "aof-use-rdb-preamble": "no",  # a plain command log: the truncation row cuts inside it
    "auto-aof-rewrite-percentage": "0",
}
STOP_TIMEOUT_S = 20.0

_LIVE: set[FaultRedis] = set()
_LIVE_LOCK = threading.Lock()
_OWNER = os.getpid()


@atexit.register
def _stop_leftovers() -> None:
    if os.getpid() != _OWNER:
        return
    with _LIVE_LOCK:
        leftovers = list(_LIVE)
    for server in leftovers:
        server.stop()


class FaultRedis:
    """One standalone redis-server whose data directory outlives restarts."""

    def __init__(
        self,
        config: dict[str, str] | None = None,
        *,
        tmpfs_bytes: int | None = None,
        password: str | None = None,
    ) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="memtier-fault-"))
        self.datadir = self.workdir / "data"
        self.datadir.mkdir()
        self.config = dict(config or {})
        self.tmpfs_bytes = tmpfs_bytes
        self.password = password  # of the `default` user, for admin()
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.launched_pid: int | None = None

    # --- life cycle -------------------------------------------------------------------------
    def _write_config(self) -> Path:
        return write_redis_config(
            self.workdir / "redis.conf",
            port=self.port,
            data_dir=self.datadir,
            log_path=self.workdir / "redis.log",
            extra=self.config,
        )

    def start(self) -> FaultRedis:
        find_binary("redis-server")
        (self.port,) = free_ports(1)
        self._spawn()
        return self

    def _spawn(self) -> None:
        conf = self._write_config()
        command = [find_binary("redis-server"), str(conf)]
        if self.tmpfs_bytes is not None:
            mount = f"mount -t tmpfs -o size={self.tmpfs_bytes} memtier-fault {self.datadir}"
            command = [
                "unshare", "-m", "--propagation", "private",
                "sh", "-c", f'{mount} && exec "$0" "$1"', *command,
            ]  # fmt: skip
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.launched_pid = self.proc.pid  # `exec` keeps the pid through unshare and sh
        with _LIVE_LOCK:
            _LIVE.add(self)
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc is None or self.proc.poll() is not None:
                raise ServerStartError(f"fault redis exited\n{self.log_tail}")
            try:
                with self.client(socket_timeout=2) as conn:
                    if conn.ping():
                        return
            except redis.AuthenticationError:
                return  # answering, and asking for a password: ready
            except (redis.RedisError, OSError) as exc:
                if "LOADING" not in str(exc) and time.monotonic() > deadline:
                    raise ServerStartError(
                        f"fault redis not ready: {exc}\n{self.log_tail}"
                    ) from exc
            if time.monotonic() > deadline:
                raise ServerStartError(f"fault redis not ready\n{self.log_tail}")
            time.sleep(0.05)

    def restart(self, *, extra_config: dict[str, str] | None = None) -> None:
        """Start again on the same port and data directory (after a crash or a stop)."""
        if self.proc is not None and self.proc.poll() is None:
            self._terminate()
        if extra_config:
            self.config.update(extra_config)
        self._spawn()

    def kill9(self) -> None:
        """SIGKILL the server we launched and reap it (no SHUTDOWN, no save)."""
        proc = self._running()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def sigstop(self) -> None:
        os.kill(self._running().pid, signal.SIGSTOP)

    def sigcont(self) -> None:
        os.kill(self._running().pid, signal.SIGCONT)

    def exited(self) -> bool:
        return self.proc is None or self.proc.poll() is not None

    def _terminate(self) -> None:
        proc = self.proc
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)  # a stopped process cannot shut down
        for escalate in (proc.terminate, proc.kill):
            with contextlib.suppress(ProcessLookupError):
                escalate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=STOP_TIMEOUT_S)
                return
        proc.wait()

    def stop(self) -> None:
        try:
            self._terminate()
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(self)
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _running(self) -> subprocess.Popen[bytes]:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError("the fault server is not running")
        return self.proc

    def __enter__(self) -> FaultRedis:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- access -----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    @property
    def log_tail(self) -> str:
        try:
            lines = (self.workdir / "redis.log").read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-40:])

    def client(self, **kwargs: Any) -> redis.Redis:
        kwargs.setdefault("socket_connect_timeout", 5)
        kwargs.setdefault("socket_timeout", 15)
        kwargs.setdefault("retry", Retry(NoBackoff(), 0))
        if self.password is not None:
            kwargs.setdefault("password", self.password)
        return redis.Redis(host=HOST, port=self.port, **kwargs)

    @contextmanager
    def admin(self) -> Iterator[redis.Redis]:
        """A client to *our* server, checked by pid before any destructive command."""
        with self.client() as conn:
            pid = int(conn.info("server")["process_id"])
            if pid != self.launched_pid:
                raise ServerStartError(
                    f"port {self.port} answers as pid {pid}, not our {self.launched_pid}"
                )
            yield conn

    def aof_dir(self) -> Path:
        return self.datadir / self.config.get("appenddirname", "appendonlydir")


@contextmanager
def fault_redis(config: dict[str, str] | None = None, **options: Any) -> Iterator[FaultRedis]:
    with FaultRedis(config, **options) as server:
        yield server
