"""``memtier serve``: the threads HTTP API, ``/metrics``, ``/healthz`` and ``/readyz`` on uvicorn.

::

    memtier serve --api-keys keys.toml [--host 127.0.0.1] [--port 8080 | --fd N]
                  [--redis-url redis://... | redis+cluster://...] [--config memtier.toml]
                  [--runner package.module:factory] [--base-path /memtier/conversations]
                  [--workers N]
    memtier serve --insecure-dev-auth     # loopback only; every request is tenant/user "dev"

* Redis: ``--redis-url``, else ``MEMTIER_REDIS_URL`` (or the config file), else
  the embedded in-process Redis -- which it says, loudly (data dies with the
  process; not with ``--workers`` > 1).
* Listening: ``--host``/``--port``, or ``--fd N``: a TCP socket the parent bound and
  handed down (a supervisor, socket activation, the test suite), so nothing else can
  take the port between choosing and binding it; one process.
* Authentication: ``Authorization: Bearer <token>`` checked against the
  API-keys file (:mod:`memtier.threads.apikeys`: SHA-256 digests only).
  Without ``--api-keys`` it refuses to start unless ``--insecure-dev-auth``.
* Runner: ``--runner package.module:factory`` calls ``factory()`` once per
  process and uses what it returns (an async or sync runner, see
  :mod:`memtier.threads.runner`); default: the deterministic echo runner.
* ``/metrics``: :func:`memtier.metrics.render`; with ``--workers`` > 1 the
  collectors are multiprocess (``PROMETHEUS_MULTIPROC_DIR``; a private temporary
  directory is used when it is unset).
* ``/healthz``: the process serves (200).  ``/readyz``: 200 only when Redis
  answers ``PING`` and ``SCRIPT EXISTS`` is true for every thread script (on
  a Cluster: on every primary).  When scripts are missing (a restart, a
  failover) it loads them and still answers 503 for that probe.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib
import ipaddress
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from memtier.errors import ConfigurationError

__all__ = ["ServeOptions", "build_app", "load_runner", "main", "worker_app"]

log = logging.getLogger("memtier.serve")

OPTIONS_ENV = "MEMTIER_SERVE_OPTIONS"  # hands the options to --workers processes
READY_TIMEOUT_S = 5.0
DEV_OWNER = ("dev", "dev")
INSECURE_BANNER = """\
memtier serve: *** INSECURE DEVELOPMENT AUTHENTICATION ***
memtier serve: --insecure-dev-auth: EVERY request is accepted as tenant "dev", user "dev",
memtier serve: without any credential. Never use this outside a development machine;
memtier serve: use --api-keys FILE instead."""


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8080
    fd: int | None = None
    redis_url: str | None = None
    config_file: str | None = None
    api_keys: str | None = None
    insecure_dev_auth: bool = False
    runner: str | None = None
    agent: str | None = None
    base_path: str | None = None
    workers: int = 1
    log_level: str = "info"
    namespace: str | None = None
    verbose: int = 0
    quiet: int = 0
    log_format: str = "text"


def _parser() -> argparse.ArgumentParser:
    from memtier.clicommon import CliParser

    p = CliParser(
        prog="memtier serve",
        description="Run the conversation-threads HTTP API and /metrics with uvicorn.",
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="TCP port (default 8080)")
    p.add_argument(
        "--fd",
        type=int,
        help="serve on this inherited, already bound TCP socket (a supervisor's or socket"
        " activation's) instead of binding --host/--port; one process",
    )
    p.add_argument(
        "--redis-url",
        help="redis://, rediss://, unix:// or redis+cluster:// (default: MEMTIER_REDIS_URL,"
        " else the embedded in-process Redis)",
    )
    p.add_argument("--config", dest="config_file", help="memtier TOML config file")
    p.add_argument(
        "--api-keys", help="TOML file of [[keys]] with sha256 (hex digest of a token), tenant, user"
    )
    p.add_argument(
        "--insecure-dev-auth",
        action="store_true",
        help="no authentication: every request is tenant 'dev', user 'dev' (loopback only)",
    )
    p.add_argument("--runner", help="agent runner factory, package.module:factory (default: echo)")
    p.add_argument(
        "--agent",
        help="package.module:attribute of an agent object handed to the --runner factory"
        " (factory(agent=...)), e.g. an OpenAI Agents SDK Agent",
    )
    p.add_argument("--base-path", help="API base path (default /memtier/conversations)")
    p.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    # The flags every memtier subcommand shares (memtier.clicommon).
    p.add_argument("--namespace", help="key namespace (overrides MEMTIER_NAMESPACE and the file)")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log output")
    p.add_argument("-q", "--quiet", action="count", default=0, help="less log output")
    p.add_argument("--log-format", choices=("text", "json"), default="text")
    return p


def parse_args(argv: Sequence[str]) -> ServeOptions:
    ns = _parser().parse_args(list(argv))
    return ServeOptions(**vars(ns))


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_options(options: ServeOptions) -> None:
    """Refuse unsafe or contradictory options (ConfigurationError)."""
    if options.api_keys and options.insecure_dev_auth:
        raise ConfigurationError("give either --api-keys FILE or --insecure-dev-auth, not both")
    if not options.api_keys and not options.insecure_dev_auth:
        raise ConfigurationError(
            "refusing to start without authentication: give --api-keys FILE (TOML [[keys]]"
            " with sha256, tenant, user), or --insecure-dev-auth for local development"
        )
    if options.insecure_dev_auth and not _is_loopback(options.host):
        raise ConfigurationError(
            f"--insecure-dev-auth only binds loopback addresses, not {options.host!r}"
        )
    if not 0 < options.port < 65536:
        raise ConfigurationError(f"--port {options.port} is not a TCP port")
    if not 1 <= options.workers <= 64:
        raise ConfigurationError("--workers must be within 1..64")
    if options.fd is not None and options.workers != 1:
        raise ConfigurationError("--fd serves in one process; --workers > 1 binds --host/--port")


def inherited_socket(options: ServeOptions) -> socket.socket:
    """The TCP socket ``--fd`` names (bound by the parent; uvicorn listens on it), with
    the same loopback rule as ``--host`` under ``--insecure-dev-auth``."""
    assert options.fd is not None
    try:
        sock = socket.socket(fileno=options.fd)  # family and type read from the descriptor
    except OSError as exc:
        raise ConfigurationError(f"--fd {options.fd} is not a socket ({exc.strerror})") from None
    if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
        sock.detach()  # not ours to close
        raise ConfigurationError(f"--fd {options.fd} is not a TCP socket")
    host = sock.getsockname()[0]
    if options.insecure_dev_auth and not _is_loopback(host):
        sock.detach()
        raise ConfigurationError(f"--insecure-dev-auth only binds loopback addresses, not {host!r}")
    return sock


def _import_object(flag: str, spec: str) -> Any:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        form = "package.module:factory" if flag == "--runner" else "package.module:attribute"
        raise ConfigurationError(f"{flag} {spec!r}: expected {form}")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"{flag} {spec!r}: {exc}") from exc
    return target


def load_runner(spec: str, agent: str | None = None) -> Any:
    """``package.module:factory`` -> ``factory()`` (``factory(agent=obj)`` with ``--agent``,
    ``obj`` imported from ``package.module:attribute``); the result must be callable."""
    target = _import_object("--runner", spec)
    if not callable(target):
        raise ConfigurationError(f"--runner {spec!r}: not callable")
    if agent is not None:
        try:
            runner = target(agent=_import_object("--agent", agent))
        except TypeError as exc:
            raise ConfigurationError(f"--runner {spec!r} does not take --agent: {exc}") from exc
    else:
        runner = target()
    if not callable(runner):
        raise ConfigurationError(f"--runner {spec!r}: the factory returned {runner!r}")
    return runner


def _config(options: ServeOptions) -> Any:
    from memtier.config import MemtierConfig

    overrides: dict[str, Any] = {}
    if options.redis_url:
        overrides["redis_url"] = options.redis_url
    if options.namespace:
        overrides["namespace"] = options.namespace
    if options.config_file:
        return MemtierConfig.from_toml(options.config_file, **overrides)
    return MemtierConfig.load(**overrides)


def build_app(options: ServeOptions) -> Any:
    """The ASGI app of one serve process (raises ConfigurationError for bad options)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Mount, Route

    from memtier import metrics
    from memtier.connection import EMBEDDED_NOTICE, connect_async
    from memtier.httpmetrics import HttpMetricsMiddleware
    from memtier.memory.aio import AsyncConversationStore
    from memtier.threads.aio import AsyncConversationService
    from memtier.threads.apikeys import ApiKeys
    from memtier.threads.http import create_conversation_app, http_error
    from memtier.threads.models import Ownership

    check_options(options)
    config = _config(options)
    if options.api_keys:
        authorize: Any = ApiKeys.load(options.api_keys).authorize
    else:
        dev = Ownership(*DEV_OWNER)

        def authorize(request: Request) -> Ownership:
            return dev

    if options.agent and not options.runner:
        raise ConfigurationError("--agent needs --runner (the factory the agent is handed to)")
    runner = load_runner(options.runner, options.agent) if options.runner else None
    client, embedded = connect_async(config)
    if embedded:
        print(f"memtier serve: {EMBEDDED_NOTICE}", file=sys.stderr, flush=True)
    service = AsyncConversationService(client, config, runner=runner, embedded=embedded)
    base_path = options.base_path or config.threads.base_path
    conversations = create_conversation_app(service, authorize, base_path=base_path)

    async def healthz(request: Request) -> Response:
        return JSONResponse(
            {"status": "ok", "embedded": embedded, "insecureDevAuth": options.insecure_dev_auth}
        )

    async def readyz(request: Request) -> Response:
        try:
            await asyncio.wait_for(service.client.ping(), READY_TIMEOUT_S)
            if await asyncio.wait_for(service.scripts_loaded(), READY_TIMEOUT_S):
                return JSONResponse({"status": "ready"})
        except Exception as exc:  # any failure means "not ready", with its type
            return JSONResponse(
                {"status": "not ready", "reason": f"redis: {type(exc).__name__}"}, status_code=503
            )
        try:  # the scripts are missing (restart, failover): load them for the next probe
            await asyncio.wait_for(service.load_scripts(), READY_TIMEOUT_S)
        except Exception as exc:
            log.warning("readyz: SCRIPT LOAD failed: %s", type(exc).__name__)
        return JSONResponse(
            {"status": "not ready", "reason": "thread scripts were not loaded"}, status_code=503
        )

    # memtier_active_sessions / memtier_stored_bytes: read from the partition metas at
    # scrape time (bounded: one script call per partition, at most once a second).
    memory = AsyncConversationStore(client, config, embedded=embedded)

    async def metrics_endpoint(request: Request) -> Response:
        if metrics.STORE_GAUGES.due():
            try:
                await asyncio.wait_for(memory.stats(), READY_TIMEOUT_S)
            except Exception as exc:  # the scrape still answers, with the last values
                log.warning("metrics: session/byte gauges not refreshed: %s", type(exc).__name__)
        return Response(metrics.render(), media_type=metrics.CONTENT_TYPE_LATEST)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        try:
            await asyncio.wait_for(service.load_scripts(), READY_TIMEOUT_S * 4)
        except Exception as exc:  # /readyz reports it and retries
            log.warning("memtier serve: could not load the thread scripts yet: %r", exc)
        yield
        with contextlib.suppress(Exception):
            await service.aclose()

    routes = [
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", metrics_endpoint),
        Mount("/", app=conversations),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        # A path no route matches (one with a newline never matches the mount) still
        # answers in the API's {code, message} shape.
        exception_handlers={StarletteHTTPException: http_error},
    )
    # HTTP metrics by route template and status (memtier.httpmetrics), outermost.
    app.add_middleware(HttpMetricsMiddleware, routes=routes)
    return app


def worker_app() -> Any:
    """uvicorn factory of the ``--workers`` processes (options from the environment)."""
    options = ServeOptions(**json.loads(os.environ[OPTIONS_ENV]))
    return build_app(options)


def main(argv: Sequence[str]) -> int:
    """Entry point of ``memtier serve``; returns the exit code."""
    try:
        options = parse_args(argv)
    except SystemExit as exc:  # --help or a usage error
        return int(exc.code or 0)
    if options.verbose or options.quiet:  # -v/-q move --log-level, as on every subcommand
        levels = ["debug", "info", "warning", "error"]
        index = levels.index(options.log_level) - options.verbose + options.quiet
        options = dataclasses.replace(options, log_level=levels[max(0, min(index, 3))])
    if not logging.getLogger().handlers:
        from memtier.clicommon import JsonFormatter

        logging.basicConfig(
            level=options.log_level.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        if options.log_format == "json":
            for handler in logging.getLogger().handlers:
                handler.setFormatter(JsonFormatter())
    try:
        import uvicorn
    except ImportError:  # pragma: no cover - depends on the install
        print("memtier serve: needs `pip install 'memtier[http]'`", file=sys.stderr)
        return 2
    try:
        check_options(options)
        _config(options)  # a bad setting fails here, in one line, before any banner
        if options.insecure_dev_auth:
            print(INSECURE_BANNER, file=sys.stderr, flush=True)
            log.warning("insecure development authentication: every request is dev/dev")
        if options.workers > 1:
            if _config(options).redis_url is None:
                raise ConfigurationError(
                    "--workers > 1 needs a Redis URL: the embedded Redis lives in one process"
                )
            return _run_workers(options, uvicorn)
        sock = None if options.fd is None else inherited_socket(options)
        app = build_app(options)
    except ConfigurationError as exc:
        print(f"memtier serve: {exc.message}", file=sys.stderr)
        return 2
    if sock is None:
        print(f"memtier serve: listening on http://{options.host}:{options.port}", file=sys.stderr)
        uvicorn.run(app, host=options.host, port=options.port, log_level=options.log_level)
        return 0
    host, port = sock.getsockname()[:2]
    where = f"[{host}]" if ":" in host else host
    print(f"memtier serve: listening on http://{where}:{port} (--fd {options.fd})", file=sys.stderr)
    # uvicorn.run minus the binding: the socket is the parent's.
    uvicorn.Server(uvicorn.Config(app, log_level=options.log_level)).run(sockets=[sock])
    return 0


def _run_workers(options: ServeOptions, uvicorn: Any) -> int:
    os.environ[OPTIONS_ENV] = json.dumps(asdict(options))
    private_dir = None
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        private_dir = tempfile.mkdtemp(prefix="memtier-prometheus-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = private_dir
    try:
        uvicorn.run(
            "memtier.threads.serve:worker_app",
            factory=True,
            host=options.host,
            port=options.port,
            workers=options.workers,
            log_level=options.log_level,
        )
    finally:
        if private_dir is not None:
            shutil.rmtree(private_dir, ignore_errors=True)
    return 0
