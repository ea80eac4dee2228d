"""The benchmark's own ``redis-server``: the tests' launcher, with the harness's extras.

The harness never talks to a server it did not start.  :class:`BenchRedis` runs one
:class:`tests.servers.RedisServer` -- the repository's one Redis launcher: ``redis-server``
from ``PATH`` bound to 127.0.0.1 on a port that was free a moment ago (retried if
another process wins the race), persistence off, in a fresh temporary directory,
stopped with ``SHUTDOWN NOSAVE``, then SIGTERM, then SIGKILL (also from an ``atexit``
hook; the kernel sends it SIGTERM if the harness dies).  On top of it the harness
gets one database, the server version, its resident size, and plain clients (no
retry or timeout defaults: what is measured is redis-py as a user gets it).
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any

import redis

from tests.servers import HOST, RedisServer, RedisUnavailableError, ServerStartError

__all__ = ["HOST", "BenchRedis", "ServerError"]


class ServerError(RuntimeError):
    """``redis-server`` is missing or did not come up (the message has its log tail)."""


class BenchRedis:
    """One throw-away ``redis-server`` for one benchmark run."""

    def __init__(self, extra: dict[str, str] | None = None) -> None:
        self._server = RedisServer(extra_config={"databases": "1", **(extra or {})})
        self.version = ""

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def url(self) -> str:
        return self._server.url

    @property
    def workdir(self) -> Path:
        return self._server.workdir

    def client(self, **kwargs: Any) -> redis.Redis:
        return redis.Redis(host=HOST, port=self.port, **kwargs)

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self) -> BenchRedis:
        try:
            self._server.start()
        except (RedisUnavailableError, ServerStartError) as exc:
            raise ServerError(str(exc)) from None
        with self.client(socket_timeout=5) as probe:
            self.version = str(probe.info("server").get("redis_version", ""))
        return self

    def stop(self) -> None:
        """Stop the server (idempotent) and remove its directory."""
        self._server.stop()

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
        return self._server.pid

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
