"""Shared helpers of the deploy/ suites (tests/deploy/test_deploy_*.py): tools, ports,
processes, the memtier collectors and the dashboard/alert expressions they are checked against.

Every server runs on a free loopback port in a temp dir and is stopped in teardown.
promtool/prometheus missing: failure when ``CI`` is set, otherwise a skip naming the
package to install.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from servers import HOST, unavailable

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROM_DIR = DEPLOY / "prometheus"
K8S_DIR = DEPLOY / "kubernetes"
DASHBOARD = DEPLOY / "grafana" / "memtier-dashboard.json"
CLUSTER_SCRIPT = DEPLOY / "cluster" / "create-cluster.sh"

START_TIMEOUT_S = 60.0  # one process answering (generous: a loaded 2-core machine)
SCRAPE_TIMEOUT_S = 90.0  # Prometheus scraping at 1 s until the series are queryable
STOP_TIMEOUT_S = 15.0
POLL_S = 0.2

# Labels Prometheus adds to every scraped series (and `le` of histogram buckets);
# `component` comes from the scrape configs in deploy/prometheus/.
TARGET_LABELS = frozenset({"job", "instance", "component", "le", "__name__"})
# Grafana template variables, replaced before a dashboard query reaches promtool/Prometheus.
GRAFANA_VARS = {"$__rate_interval": "1m", "$job": "memtier", "$instance": ".*"}


def require_tool(name: str) -> str:
    """Path of a Prometheus binary; fail under CI, else skip with the install hint."""
    path = shutil.which(name)
    if path is not None:
        return path
    message = (
        f"{name} not found on PATH: install Debian's `prometheus` package"
        " (apt-get install -y prometheus; tests/run.sh does)"
    )
    unavailable(message)


def run(cmd: list[str], timeout: float = 120.0, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)


def free_port(*, bus: bool = False) -> int:
    """A free loopback port; with ``bus``, port + 10000 (the cluster bus) is free too."""
    for _ in range(200):
        with socket.socket() as sock:
            sock.bind((HOST, 0))
            port: int = sock.getsockname()[1]
        if not bus:
            return port
        if port > 55535:
            continue
        with socket.socket() as sock:
            try:
                sock.bind((HOST, port + 10000))
            except OSError:
                continue
        return port
    raise AssertionError("no free loopback port found")


def distinct_free_ports(count: int, *, bus: bool = False) -> list[int]:
    ports: list[int] = []
    for _ in range(count * 50):
        port = free_port(bus=bus)
        if port not in ports and all(abs(port - p) != 10000 for p in ports):
            ports.append(port)
        if len(ports) == count:
            return ports
    raise AssertionError(f"could not find {count} distinct free ports")


def server_config(client: redis.Redis) -> dict[str, str]:
    """CONFIG GET * of one server, as plain strings."""
    reply: dict[str, str] = client.config_get("*")  # type: ignore[assignment]
    return dict(reply)


def server_command(client: redis.Redis, *args: str) -> str:
    reply: str = client.execute_command(*args)  # type: ignore[no-untyped-call]
    return reply


def load_yaml_docs(path: Path) -> list[Any]:
    with path.open(encoding="utf-8") as fh:
        return [doc for doc in yaml.safe_load_all(fh) if doc is not None]


def memtier_collectors() -> dict[str, tuple[str, frozenset[str]]]:
    """Every ``memtier_`` metric family in prometheus-client's default registry.

    family name -> (type, label names).  Families come from ``REGISTRY.collect()``
    after importing ``memtier.metrics`` (which registers them); label names from
    the collector objects, since a labelled metric never used yet has no samples.
    """
    import prometheus_client
    from prometheus_client.metrics import MetricWrapperBase

    import memtier.metrics

    labels: dict[str, frozenset[str]] = {}
    for obj in vars(memtier.metrics).values():
        if isinstance(obj, MetricWrapperBase):
            labels[obj._name] = frozenset(obj._labelnames)
    families: dict[str, tuple[str, frozenset[str]]] = {}
    for family in prometheus_client.REGISTRY.collect():
        if family.name.startswith("memtier_"):
            families[family.name] = (family.type, labels.get(family.name, frozenset()))
    return families


_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "enum": ("",),
}


def memtier_series_names() -> dict[str, tuple[str, frozenset[str]]]:
    """Exposed series name (with suffix) -> (family, label names)."""
    names: dict[str, tuple[str, frozenset[str]]] = {}
    for family, (kind, labels) in memtier_collectors().items():
        for suffix in _SUFFIXES.get(kind, ("",)):
            names[family + suffix] = (family, labels)
    return names


def dashboard() -> dict[str, Any]:
    with DASHBOARD.open(encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


def dashboard_panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = []
    for panel in dash["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))  # collapsed rows nest their panels
    return panels


def dashboard_exprs(dash: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, expr) of every query of every panel."""
    found = []
    for panel in dashboard_panels(dash):
        for target in panel.get("targets", []):
            found.append(
                (f"panel {panel['id']} {panel['title']!r} {target['refId']}", target["expr"])
            )
    return found


def alert_exprs() -> list[tuple[str, str]]:
    (doc,) = load_yaml_docs(PROM_DIR / "alerts.yml")
    return [
        (f"alert {rule['alert']}", rule["expr"])
        for group in doc["groups"]
        for rule in group["rules"]
    ]


def substitute_grafana_vars(expr: str) -> str:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"unknown template variable left in {expr!r}"
    return expr


_METRIC_RE = re.compile(r"\b(memtier_[a-zA-Z0-9_]+)\b")
_SELECTOR_RE = re.compile(r"\b(memtier_[a-zA-Z0-9_]+)\s*\{([^}]*)\}")
_MATCHER_RE = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING_RE = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def check_expr_against_collectors(where: str, expr: str) -> list[str]:
    """Problems with one PromQL expression: unknown memtier_ names or labels."""
    series = memtier_series_names()
    problems = []
    used = set(_METRIC_RE.findall(expr))
    if not used and "up{" not in expr and "up)" not in expr:
        problems.append(f"{where}: queries no memtier_ metric: {expr}")
    allowed = set(TARGET_LABELS)
    for name in used:
        if name not in series:
            problems.append(f"{where}: {name} is not exposed by memtier.metrics")
        else:
            allowed |= series[name][1]
    for name, matchers in _SELECTOR_RE.findall(expr):
        labels = set(_MATCHER_RE.findall(matchers))
        known = TARGET_LABELS | (series[name][1] if name in series else frozenset())
        for label in labels - known:
            problems.append(f"{where}: {name} has no label {label!r}")
    for grouping in _GROUPING_RE.findall(expr):
        for label in filter(None, (part.strip() for part in grouping.split(","))):
            if label not in allowed:
                problems.append(f"{where}: groups by {label!r}, a label no queried metric has")
    return problems


class Proc:
    """A child process with its output in a log file, stopped for sure in ``stop()``."""

    def __init__(self, name: str, cmd: list[str], log: Path, env: dict[str, str] | None = None):
        self.name = name
        self.log = log
        self._fh = log.open("wb")
        self.popen = subprocess.Popen(
            cmd,
            stdout=self._fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )

    def log_tail(self, chars: int = 4000) -> str:
        self._fh.flush()
        text = self.log.read_text(encoding="utf-8", errors="replace")
        return text[-chars:]

    def check_alive(self) -> None:
        code = self.popen.poll()
        if code is not None:
            pytest.fail(f"{self.name} exited with {code}:\n{self.log_tail()}", pytrace=False)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(STOP_TIMEOUT_S)
        self._fh.close()


def http(
    method: str,
    url: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> tuple[int, bytes]:
    """One HTTP request to a loopback URL: (status, body); HTTP errors are returned, not raised."""
    assert urllib.parse.urlsplit(url).hostname == HOST, url
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_until(what: str, probe: Any, timeout: float, proc: Proc | None = None) -> Any:
    """Poll ``probe()`` until it returns something truthy; bounded by ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        if proc is not None:
            proc.check_alive()
        try:
            last = probe()
        except (OSError, ValueError, redis.RedisError) as exc:  # not up yet, half-written reply
            last = exc
        else:
            if last:
                return last
        time.sleep(POLL_S)
    tail = f"\n{proc.name} log:\n{proc.log_tail()}" if proc is not None else ""
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r}){tail}")


# ----------------------------------------------------------------------------- Kubernetes manifests


def k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S_DIR.glob("*.yaml")):
        docs += [(path.name, doc) for doc in load_yaml_docs(path)]
    return docs


def pod_workloads() -> dict[str, dict[str, Any]]:
    return {
        doc["metadata"]["name"]: doc
        for _, doc in k8s_docs()
        if doc["kind"] in ("Deployment", "StatefulSet")
    }


def assert_api_keys_toml(text: str) -> None:
    """An API-keys file that `memtier serve` loads, holding digests only (no token)."""
    from memtier.threads.apikeys import ApiKeys

    data = tomllib.loads(text)
    assert ApiKeys.from_mapping(data).keys  # memtier serve's own loader accepts it
    for entry in data["keys"]:
        assert set(entry) <= {"sha256", "tenant", "user", "name"}, sorted(entry)
        assert re.fullmatch(r"[0-9a-f]{64}", entry["sha256"]), "sha256 must be a hex digest"


def k8s_container(workload: str) -> dict[str, Any]:
    (container,) = pod_workloads()[workload]["spec"]["template"]["spec"]["containers"]
    found: dict[str, Any] = container
    return found
