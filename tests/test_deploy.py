"""deploy/: every file checked by the tool that will read it, and a real scrape.

* Prometheus: ``promtool check config`` / ``check rules`` / ``test rules``
  (alert unit tests), and every dashboard and alert expression compiled by
  promtool and checked against memtier's real collectors (names and labels,
  read from prometheus-client's registry after importing ``memtier.metrics``).
* Redis: ``deploy/redis.conf`` (as is, and with the overrides of the compose
  file and of the Kubernetes StatefulSet) is started by the real
  ``redis-server``; ``deploy/cluster/create-cluster.sh`` really creates a
  3-primary + 3-replica cluster from ``node.conf.template``.
* Dockerfile: its COPY set is enough to build the wheel, Lua scripts included.
* The real thing: a real ``memtier serve`` on a real Redis, some HTTP traffic,
  and a real ``prometheus`` scraping it with the job of
  ``deploy/prometheus/prometheus.yml`` and the rules of ``alerts.yml``, until
  its query API returns the ``memtier_`` series that ``/metrics`` exposes; every
  dashboard query then runs on that Prometheus without error.

Every server runs on a free loopback port in a temp dir and is stopped in
teardown.  promtool/prometheus missing: failure when ``CI`` is set, otherwise a
skip naming the package to install.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from servers import HOST, RedisServer, require_real_redis

ROOT = Path(__file__).resolve().parents[1]
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


# ----------------------------------------------------------------------------- helpers


def require_tool(name: str) -> str:
    """Path of a Prometheus binary; fail under CI, else skip with the install hint."""
    path = shutil.which(name)
    if path is not None:
        return path
    message = (
        f"{name} not found on PATH: install Debian's `prometheus` package"
        " (apt-get install -y prometheus; tests/run.sh does)"
    )
    if os.environ.get("CI"):
        pytest.fail(message + " (CI is set: never skipped)", pytrace=False)
    pytest.skip(message)


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


# ----------------------------------------------------------------------------- Prometheus files


def test_promtool_check_config() -> None:
    promtool = require_tool("promtool")
    for name in ("prometheus.yml", "prometheus-kubernetes.yml"):
        result = run([promtool, "check", "config", str(PROM_DIR / name)])
        assert result.returncode == 0, f"{name}:\n{result.stdout}\n{result.stderr}"
        assert "SUCCESS" in result.stdout + result.stderr


def test_promtool_check_rules() -> None:
    promtool = require_tool("promtool")
    result = run([promtool, "check", "rules", str(PROM_DIR / "alerts.yml")])
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    (doc,) = load_yaml_docs(PROM_DIR / "alerts.yml")
    count = sum(len(group["rules"]) for group in doc["groups"])
    assert f"SUCCESS: {count} rules found" in result.stdout + result.stderr


def test_alert_rules_unit_tests() -> None:
    """deploy/prometheus/alerts_test.yml: each alert fires on bad series, not on healthy ones."""
    promtool = require_tool("promtool")
    result = run([promtool, "test", "rules", "alerts_test.yml"], cwd=PROM_DIR)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    (doc,) = load_yaml_docs(PROM_DIR / "alerts_test.yml")
    tested = {case["alertname"] for test in doc["tests"] for case in test["alert_rule_test"]}
    defined = {where.removeprefix("alert ") for where, _ in alert_exprs()}
    assert defined <= tested, f"alerts without a promtool unit test: {sorted(defined - tested)}"


def test_prometheus_configs_scrape_the_memtier_job_on_metrics() -> None:
    for name in ("prometheus.yml", "prometheus-kubernetes.yml"):
        (cfg,) = load_yaml_docs(PROM_DIR / name)
        jobs = {job["job_name"]: job for job in cfg["scrape_configs"]}
        assert "memtier" in jobs, name
        assert jobs["memtier"].get("metrics_path", "/metrics") == "/metrics", name
        assert cfg["rule_files"] == ["alerts.yml"], name


def test_alert_expressions_use_real_metric_names_and_labels() -> None:
    exprs = alert_exprs()
    problems = [p for where, expr in exprs for p in check_expr_against_collectors(where, expr)]
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------- Grafana


def test_dashboard_is_valid_json_with_a_prometheus_datasource_variable() -> None:
    dash = dashboard()
    assert 36 <= dash["schemaVersion"] <= 41
    assert dash["uid"] and dash["title"]
    variables = {var["name"]: var for var in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = dashboard_panels(dash)
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_dashboard_queries_use_real_metric_names_and_labels() -> None:
    exprs = dashboard_exprs(dashboard())
    assert exprs
    problems = [p for where, expr in exprs for p in check_expr_against_collectors(where, expr)]
    assert not problems, "\n".join(problems)


def test_dashboard_covers_every_memtier_metric() -> None:
    """A collector added to memtier/metrics.py without a panel fails here."""
    queried = {m for _, expr in dashboard_exprs(dashboard()) for m in _METRIC_RE.findall(expr)}
    series = memtier_series_names()
    covered = {series[name][0] for name in queried if name in series}
    missing = sorted(set(memtier_collectors()) - covered)
    assert not missing, f"memtier_ metrics with no dashboard panel: {missing}"


def test_dashboard_and_alert_queries_compile(tmp_path: Path) -> None:
    """promtool parses every dashboard query (variables substituted) as a recording rule."""
    promtool = require_tool("promtool")
    rules = [
        {"record": f"memtier_dashboard:query_{i}", "expr": substitute_grafana_vars(expr)}
        for i, (_, expr) in enumerate(dashboard_exprs(dashboard()))
    ]
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = run([promtool, "check", "rules", str(path)])
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout + result.stderr


def test_grafana_provisioning_matches_compose_mounts() -> None:
    (provider,) = load_yaml_docs(DEPLOY / "grafana/provisioning/dashboards/memtier.yml")
    (datasources,) = load_yaml_docs(DEPLOY / "grafana/provisioning/datasources/prometheus.yml")
    (compose,) = load_yaml_docs(DEPLOY / "docker-compose.yml")
    mounts = compose["services"]["grafana"]["volumes"]
    dashboards_dir = provider["providers"][0]["options"]["path"]
    assert f"./grafana/memtier-dashboard.json:{dashboards_dir}/memtier-dashboard.json:ro" in mounts
    assert datasources["datasources"][0]["type"] == "prometheus"
    assert datasources["datasources"][0]["url"] == "http://prometheus:9090"


# ----------------------------------------------------------------------------- compose, Dockerfile


def test_compose_file_runs_redis_serve_worker_prometheus_grafana() -> None:
    (compose,) = load_yaml_docs(DEPLOY / "docker-compose.yml")
    services = compose["services"]
    assert set(services) == {"redis", "memtier-serve", "memtier-worker", "prometheus", "grafana"}
    for name, service in services.items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
        for mapping in service.get("ports", []):
            assert str(mapping).startswith("127.0.0.1:"), f"{name} publishes {mapping} widely"
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name} mounts missing {source}"
    assert "ports" not in services["redis"], "Redis must not be published"
    assert "./redis.conf:/usr/local/etc/redis/redis.conf:ro" in services["redis"]["volumes"]
    assert services["redis"]["command"][:2] == ["redis-server", "/usr/local/etc/redis/redis.conf"]
    assert services["memtier-serve"]["command"][0] == "serve"
    worker_command = services["memtier-worker"]["command"]
    assert worker_command[0] == "worker" and "--metrics-port" in worker_command
    assert "./prometheus:/etc/prometheus:ro" in services["prometheus"]["volumes"]
    # The API-keys secret is the user's copy of the example (hashes only).
    assert compose["secrets"]["memtier-api-keys"]["file"] == "./api-keys.toml"
    assert_api_keys_toml((DEPLOY / "api-keys.example.toml").read_text(encoding="utf-8"))


def test_dockerfile_copy_set_builds_the_wheel_with_lua(tmp_path: Path) -> None:
    """Build the wheel from exactly what deploy/Dockerfile COPYs, as `pip install .` in it does."""
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    assert 'pip install ".[http]"' in text
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and not users[-1].startswith(("0", "root")), "the image must run as non-root"
    context = tmp_path / "context"
    for line in re.findall(r"^COPY\s+(.+)$", text, re.M):
        *sources, _dest = line.split()
        for source in sources:
            src = ROOT / source.rstrip("/")
            dst = context / source.rstrip("/")
            if src.is_dir():
                shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
    out = tmp_path / "wheels"
    result = run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(out),
            str(context),
        ],
        timeout=300,
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    (wheel,) = out.glob("memtier-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    assert "memtier/cli.py" in names
    lua = sorted(p.relative_to(ROOT / "lua").as_posix() for p in (ROOT / "lua").rglob("*.lua"))
    assert lua, "no Lua scripts in lua/"
    missing = [p for p in lua if f"memtier/_lua/{p}" not in names]
    assert not missing, f"Lua scripts missing from the image's wheel: {missing}"


# ----------------------------------------------------------------------------- Kubernetes


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


def test_kubernetes_manifests_parse_and_are_listed_in_kustomization() -> None:
    docs = k8s_docs()
    kinds = {doc["kind"] for _, doc in docs}
    assert {"StatefulSet", "Deployment", "Service", "ConfigMap", "Secret"} <= kinds
    for file, doc in docs:
        assert doc.get("apiVersion") and doc.get("kind"), file
        if doc["kind"] == "Kustomization":
            continue
        assert doc["metadata"]["name"], file
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "memtier", f"{file} {doc['kind']}"
    (kustomization,) = load_yaml_docs(K8S_DIR / "kustomization.yaml")
    listed = set(kustomization["resources"])
    files = {p.name for p in K8S_DIR.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == files


def test_kubernetes_redis_configmap_is_deploy_redis_conf() -> None:
    (configmap,) = load_yaml_docs(K8S_DIR / "redis-configmap.yaml")
    expected = (DEPLOY / "redis.conf").read_text(encoding="utf-8")
    assert configmap["data"]["redis.conf"] == expected, (
        "kubernetes/redis-configmap.yaml drifted from deploy/redis.conf: re-embed the file"
    )


def test_kubernetes_pods_are_hardened_and_bounded() -> None:
    workloads = pod_workloads()
    assert {"memtier-redis", "memtier-serve", "memtier-worker"} <= set(workloads)
    for name, workload in workloads.items():
        spec = workload["spec"]["template"]["spec"]
        pod_sc = spec["securityContext"]
        assert pod_sc["runAsNonRoot"] is True, name
        assert pod_sc["runAsUser"] != 0, name
        assert pod_sc["seccompProfile"]["type"] == "RuntimeDefault", name
        assert spec["automountServiceAccountToken"] is False, name
        for container in spec["containers"]:
            where = f"{name}/{container['name']}"
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            resources = container["resources"]
            assert resources["requests"]["cpu"] and resources["requests"]["memory"], where
            assert resources["limits"]["memory"], where


def _container(workload: str) -> dict[str, Any]:
    (container,) = pod_workloads()[workload]["spec"]["template"]["spec"]["containers"]
    found: dict[str, Any] = container
    return found


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item for item in container.get("env", [])}


def test_kubernetes_serve_probes_metrics_and_api_keys() -> None:
    workload = pod_workloads()["memtier-serve"]
    pod = workload["spec"]["template"]
    container = _container("memtier-serve")
    args = container["args"]
    assert args[0] == "serve"
    port = int(args[args.index("--port") + 1])
    assert container["ports"][0]["containerPort"] == port
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == port
    assert annotations["prometheus.io/path"] == "/metrics"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    multiproc = _env(container)["PROMETHEUS_MULTIPROC_DIR"]["value"]
    assert "emptyDir" in volumes[mounts[multiproc]], "multiprocess dir must be an emptyDir"
    keys_path = Path(args[args.index("--api-keys") + 1])
    keys_volume = volumes[mounts[str(keys_path.parent)]]
    secret_name = keys_volume["secret"]["secretName"]
    secrets_by_name = {
        doc["metadata"]["name"]: doc for _, doc in k8s_docs() if doc["kind"] == "Secret"
    }
    assert_api_keys_toml(secrets_by_name[secret_name]["stringData"][keys_path.name])
    # The DNS-SD Service of prometheus-kubernetes.yml exists and selects these pods.
    (cfg,) = load_yaml_docs(PROM_DIR / "prometheus-kubernetes.yml")
    sd_by_service = {
        entry["names"][0].split(".")[0]: entry
        for entry in cfg["scrape_configs"][0]["dns_sd_configs"]
    }
    assert set(sd_by_service) == {"memtier-serve-metrics", "memtier-worker-metrics"}
    sd = sd_by_service["memtier-serve-metrics"]
    service_name = "memtier-serve-metrics"
    services = {doc["metadata"]["name"]: doc for _, doc in k8s_docs() if doc["kind"] == "Service"}
    assert services[service_name]["spec"]["clusterIP"] == "None"
    assert sd["port"] == port
    selector = services[service_name]["spec"]["selector"]
    assert selector.items() <= pod["metadata"]["labels"].items()


def test_kubernetes_worker_and_redis_wiring() -> None:
    worker = _container("memtier-worker")
    assert worker["args"][0] == "worker"
    port = int(worker["args"][worker["args"].index("--metrics-port") + 1])
    assert {p["containerPort"] for p in worker["ports"]} == {port}
    (cfg,) = load_yaml_docs(PROM_DIR / "prometheus-kubernetes.yml")
    ports = {
        e["names"][0].split(".")[0]: e["port"] for e in cfg["scrape_configs"][0]["dns_sd_configs"]
    }
    assert ports["memtier-worker-metrics"] == port
    services = {doc["metadata"]["name"]: doc for _, doc in k8s_docs() if doc["kind"] == "Service"}
    assert services["memtier-worker-metrics"]["spec"]["clusterIP"] == "None"
    for name in ("memtier-serve", "memtier-worker"):
        env = _env(_container(name))
        assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "memtier-redis-auth"
        assert env["MEMTIER_REDIS_URL"]["value"].startswith(
            "redis://:$(REDIS_PASSWORD)@memtier-redis:"
        )
    redis_set = pod_workloads()["memtier-redis"]
    spec = redis_set["spec"]["template"]["spec"]
    container = _container("memtier-redis")
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "memtier-redis-config"
    assert container["args"][0] == f"{mounts['config']}/redis.conf"
    include = container["args"][container["args"].index("--include") + 1]
    assert include.startswith(mounts["auth"] + "/")
    assert volumes["auth"]["secret"]["secretName"] == "memtier-redis-auth"
    assert {t["metadata"]["name"] for t in redis_set["spec"]["volumeClaimTemplates"]} == {"data"}
    assert container["args"][container["args"].index("--dir") + 1] == mounts["data"]
    # The operator-made secret is documented with the command that creates it.
    readme = (DEPLOY / "README.md").read_text(encoding="utf-8")
    assert "create secret generic memtier-redis-auth" in readme


# ----------------------------------------------------------------------------- Redis


def _redis_variants() -> dict[str, list[str]]:
    """Command-line overrides after deploy/redis.conf: as shipped, as compose, as Kubernetes."""
    (compose,) = load_yaml_docs(DEPLOY / "docker-compose.yml")
    compose_args = compose["services"]["redis"]["command"][2:]
    k8s_args = _container("memtier-redis")["args"][1:]
    return {"plain": [], "compose": list(compose_args), "kubernetes": list(k8s_args)}


@pytest.mark.parametrize("variant", ["plain", "compose", "kubernetes"])
def test_redis_conf_is_accepted_by_redis_server(variant: str, tmp_path: Path) -> None:
    require_real_redis("redis-server")
    overrides = _redis_variants()[variant]
    password = secrets.token_hex(16)
    auth = tmp_path / "auth.conf"
    auth.write_text(f"requirepass {password}\n")
    args: list[str] = []
    it = iter(overrides)
    for arg in it:
        if arg in ("--bind", "--dir", "--include"):
            value = next(it)
            # Never listen beyond loopback; data and the password file in tmp_path.
            value = {"--bind": HOST, "--dir": str(tmp_path), "--include": str(auth)}[arg]
            args += [arg, value]
        else:
            args.append(arg)
    port = free_port()
    cmd = [
        shutil.which("redis-server") or "redis-server",
        str(DEPLOY / "redis.conf"),
        *args,
        "--port",
        str(port),
        "--dir",
        str(tmp_path),
    ]
    proc = Proc("redis-server", cmd, tmp_path / "redis.log")
    uses_auth = "--include" in overrides
    client = redis.Redis(
        host=HOST,
        port=port,
        password=password if uses_auth else None,
        socket_timeout=5,
        decode_responses=True,
    )
    try:
        wait_until("redis-server to answer PING", client.ping, START_TIMEOUT_S, proc)
        config = server_config(client)
        assert config["maxmemory-policy"] == "noeviction"
        assert config["appendonly"] == "yes"
        assert config["appendfsync"] == "everysec"
        assert config["aof-use-rdb-preamble"] == "yes"
        assert config["save"], "RDB snapshots are the second line"
        assert int(config["maxmemory"]) > 0, "maxmemory must be set"
        assert config["lazyfree-lazy-user-del"] == "yes"
        assert int(config["latency-monitor-threshold"]) > 0
        assert config["dir"] == str(tmp_path)
        if variant == "plain":
            assert config["bind"].split()[0] == "127.0.0.1", "loopback by default"
            assert config["protected-mode"] == "yes"
        if variant == "kubernetes":
            assert int(config["maxmemory"]) == 1536 * 1024 * 1024
            assert config["protected-mode"] == "yes"
            anonymous = redis.Redis(host=HOST, port=port, socket_timeout=5)
            with pytest.raises(redis.AuthenticationError):
                anonymous.ping()
            anonymous.close()
        # Writes work and land in the AOF directory.
        assert client.set("{memtier:m:0}:probe", "1")
        assert (tmp_path / config["appenddirname"]).is_dir()
        client.shutdown(nosave=True)  # redis-py treats the closed connection as success
    finally:
        client.close()
        proc.stop()


# ----------------------------------------------------------------------------- Redis Cluster


def test_create_cluster_script_syntax() -> None:
    result = run(["bash", "-n", str(CLUSTER_SCRIPT)])
    assert result.returncode == 0, result.stderr
    assert os.access(CLUSTER_SCRIPT, os.X_OK), "create-cluster.sh must be executable"
    shellcheck = shutil.which("shellcheck")  # an extra lint where installed (Debian: shellcheck)
    if shellcheck is not None:
        result = run([shellcheck, str(CLUSTER_SCRIPT)])
        assert result.returncode == 0, result.stdout


def _cluster_logs(data: Path) -> str:
    return "\n".join(
        f"--- {log.parent.name}:\n{log.read_text(errors='replace')[-1500:]}"
        for log in sorted(data.glob("*/redis.log"))
    )


def _running(pid: int) -> bool:
    """True while ``pid`` runs (a zombie left for init to reap has stopped)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


CLUSTER_PORT_ATTEMPTS = 3  # another process may take a probed-free port before a node binds it


def _kill_processes_under(root: Path) -> None:
    """Last resort: SIGKILL every process whose working directory is under ``root``."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if cwd.startswith(str(root)):
            with contextlib.suppress(OSError):
                os.kill(int(proc.name), signal.SIGKILL)


def test_create_cluster_script_starts_and_stops_a_cluster(tmp_path: Path) -> None:
    """The script's own start and stop, checked; a node that outlives them is killed."""
    try:
        _create_cluster_script_starts_and_stops_a_cluster(tmp_path)
    finally:
        _kill_processes_under(tmp_path)


def _create_cluster_script_starts_and_stops_a_cluster(tmp_path: Path) -> None:
    require_real_redis("redis-server", "redis-cli")
    for attempt in range(CLUSTER_PORT_ATTEMPTS):
        ports = distinct_free_ports(6, bus=True)
        data = tmp_path / f"cluster-{attempt}"
        cmd = ["bash", str(CLUSTER_SCRIPT), "start", "-d", str(data), "-H", HOST]
        start = run([*cmd, *map(str, ports)], timeout=300)
        if start.returncode == 0 or "Address already in use" not in _cluster_logs(data):
            break
        run(["bash", str(CLUSTER_SCRIPT), "stop", "-d", str(data)], timeout=120)
    pids: list[int] = []
    try:
        assert start.returncode == 0, f"{start.stdout}\n{start.stderr}\n{_cluster_logs(data)}"
        assert f"redis+cluster://{HOST}:{ports[0]}" in start.stdout
        pids = [int((data / str(port) / "redis.pid").read_text()) for port in ports]
        node = redis.Redis(host=HOST, port=ports[0], socket_timeout=5, decode_responses=True)
        info = server_command(node, "CLUSTER", "INFO")
        nodes = server_command(node, "CLUSTER", "NODES")
        node.close()
        assert "cluster_state:ok" in info and "cluster_size:3" in info, info
        roles = [line.split()[2] for line in nodes.splitlines()]
        assert sum("master" in r for r in roles) == 3, nodes
        assert sum("slave" in r for r in roles) == 3, nodes
        for port in ports:
            client = redis.Redis(host=HOST, port=port, socket_timeout=5, decode_responses=True)
            config = server_config(client)
            client.close()
            assert config["maxmemory-policy"] == "noeviction", port
            assert config["appendonly"] == "yes", port
            assert config["cluster-require-full-coverage"] == "no", port
            assert config["cluster-allow-reads-when-down"] == "no", port
            assert config["cluster-node-timeout"] == "5000", port
        # memtier's own cluster client, from the URL the script prints.
        from memtier.config import MemtierConfig
        from memtier.connection import connect_sync

        client, embedded = connect_sync(
            MemtierConfig(redis_url=f"redis+cluster://{HOST}:{ports[0]}")
        )
        assert not embedded
        keys = ["{memtier:o:t1:u1}:a", "{memtier:o:t1:u1}:b"]  # one hash tag: one slot
        script = "redis.call('SET', KEYS[1], 1); return redis.call('INCR', KEYS[2])"
        assert client.eval(script, 2, *keys) == 1
        client.close()
    finally:
        stop = run(["bash", str(CLUSTER_SCRIPT), "stop", "-d", str(data)], timeout=120)
    assert stop.returncode == 0, f"{stop.stdout}\n{stop.stderr}"
    # Redis removes its pid file (what `stop` waits for) just before it exits.
    wait_until("every node to exit", lambda: not any(_running(pid) for pid in pids), 30)


def test_worker_runs_with_the_compose_environment(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """`memtier worker` as docker-compose.yml starts it (env, persistence on) on a real Redis."""
    (compose,) = load_yaml_docs(DEPLOY / "docker-compose.yml")
    service = compose["services"]["memtier-worker"]
    storage = tmp_path / "snapshots"
    storage.mkdir(mode=0o700)
    env = dict(os.environ)
    env.update({k: str(v) for k, v in service["environment"].items()})
    assert env["MEMTIER_CONVERSATION__PERSISTENCE_ENABLED"] == "true"
    # This machine's Redis, a private namespace, and tmp_path for the container's volumes.
    env.update(
        MEMTIER_REDIS_URL=redis_server.url,
        MEMTIER_NAMESPACE="deploy" + secrets.token_hex(4),
        MEMTIER_CONVERSATION__STORAGE_PATH=str(storage),
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path),
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    cmd = [sys.executable, "-m", "memtier", *service["command"], "--drain", "--deadline", "60"]
    result = run(cmd, timeout=180, env=env)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    stats = json.loads(result.stdout.strip().splitlines()[-1])
    assert stats["failed"] == 0 and stats["flush_errors"] == 0, stats
    snapshots = storage / "conversations"
    assert snapshots.is_dir(), "persistence on: the worker owns <storage_path>/conversations"
    assert snapshots.stat().st_mode & 0o777 == 0o700


# ----------------------------------------------------------------------------- the real thing


@pytest.mark.parametrize("workers", [1, 2])
def test_prometheus_scrapes_memtier_serve(
    workers: int, tmp_path: Path, redis_server: RedisServer
) -> None:
    """Real `memtier serve` on real Redis, real traffic, real Prometheus finding memtier_ series.

    With PROMETHEUS_MULTIPROC_DIR set, as in the compose file and the Kubernetes
    manifests; with 2 uvicorn workers /metrics aggregates both processes.
    """
    prometheus = require_tool("prometheus")
    token = secrets.token_urlsafe(24)
    keys = tmp_path / "api-keys.toml"
    digest = hashlib.sha256(token.encode()).hexdigest()
    keys.write_text(f'[[keys]]\nsha256 = "{digest}"\ntenant = "t-deploy"\nuser = "u-deploy"\n')
    multiproc = tmp_path / "multiproc"
    multiproc.mkdir()
    env = dict(os.environ)
    env.update(
        PROMETHEUS_MULTIPROC_DIR=str(multiproc),
        MEMTIER_NAMESPACE="deploy" + secrets.token_hex(4),
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    env.pop("MEMTIER_REDIS_URL", None)
    serve_port = free_port()
    serve = Proc(
        "memtier serve",
        [
            sys.executable,
            "-m",
            "memtier",
            "serve",
            "--host",
            HOST,
            "--port",
            str(serve_port),
            "--redis-url",
            redis_server.url,
            "--api-keys",
            str(keys),
            "--workers",
            str(workers),
        ],
        tmp_path / "serve.log",
        env=env,
    )
    prom: Proc | None = None
    base = f"http://{HOST}:{serve_port}"
    try:
        wait_until(
            "memtier serve /healthz",
            lambda: http("GET", f"{base}/healthz")[0] == 200,
            START_TIMEOUT_S,
            serve,
        )
        wait_until(
            "memtier serve /readyz",
            lambda: http("GET", f"{base}/readyz")[0] == 200,
            START_TIMEOUT_S,
            serve,
        )

        # A little traffic through the threads API, authenticated by the API-keys file.
        auth = {"Authorization": f"Bearer {token}"}
        status, body = http("POST", f"{base}/memtier/conversations", {"title": "deploy test"}, auth)
        assert status in (200, 201), body
        thread_id = json.loads(body)["id"]
        status, body = http("GET", f"{base}/memtier/conversations/{thread_id}", headers=auth)
        assert status == 200, body
        status, _ = http("GET", f"{base}/memtier/conversations")
        assert status == 401, "no bearer token must be refused"

        # Conversation memory in the same namespace: serve's session/byte gauges read
        # the partition metas at scrape time, so they must show these sessions.
        from memtier.config import MemtierConfig
        from memtier.memory.models import AvatarMessage, Channel, ConversationKey
        from memtier.memory.store import ConversationStore

        memory_config = MemtierConfig.load(
            redis_url=redis_server.url, namespace=env["MEMTIER_NAMESPACE"]
        )
        with ConversationStore.from_config(memory_config) as memory:
            for n in range(3):
                key = ConversationKey(f"00000000-0000-4000-8000-00000000000{n}", Channel.IM)
                memory.append(key, AvatarMessage(text=f"hello {n}"))
            expected = memory.stats()
        assert expected["sessions"] == 3 and expected["bytes"] > 0

        # What serve itself exposes: every memtier_ sample name on /metrics.
        from prometheus_client.parser import text_string_to_metric_families

        status, text = http("GET", f"{base}/metrics")
        assert status == 200
        exposed = {
            sample.name
            for family in text_string_to_metric_families(text.decode())
            for sample in family.samples
            if sample.name.startswith("memtier_")
        }
        assert exposed, "memtier serve exposes no memtier_ series"
        known = memtier_series_names()
        assert exposed <= set(known), f"unknown memtier_ series: {sorted(exposed - set(known))}"
        assert "memtier_script_duration_seconds_count" in exposed, "the POST ran no Lua script?"
        samples = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text.decode())
            for sample in family.samples
        }
        assert samples[("memtier_active_sessions", ())] == 3
        assert samples[("memtier_stored_bytes", ())] == expected["bytes"]
        http_routes = {
            dict(labels)["route"]
            for (name, labels), _ in samples.items()
            if name == "memtier_http_requests_total"
        }
        assert "/memtier/conversations/{thread_id}" in http_routes, http_routes
        assert not any(thread_id in route for route in http_routes), "raw paths as labels"

        # Prometheus with the memtier job of deploy/prometheus/prometheus.yml, aimed at
        # this serve, every second, with the real alerting rules loaded.
        (cfg,) = load_yaml_docs(PROM_DIR / "prometheus.yml")
        job = next(j for j in cfg["scrape_configs"] if j["job_name"] == "memtier")
        job["static_configs"] = [
            {"targets": [f"{HOST}:{serve_port}"], "labels": {"component": "serve"}}
        ]
        job["scrape_interval"] = job["scrape_timeout"] = "1s"
        cfg["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
        cfg["scrape_configs"] = [job]
        cfg["rule_files"] = [str(PROM_DIR / "alerts.yml")]
        config_path = tmp_path / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(cfg))
        prom_port = free_port()
        prom = Proc(
            "prometheus",
            [
                prometheus,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address={HOST}:{prom_port}",
                "--log.level=warn",
            ],
            tmp_path / "prometheus.log",
        )
        api = f"http://{HOST}:{prom_port}/api/v1"

        def query(expr: str) -> list[dict[str, Any]]:
            status, body = http("GET", f"{api}/query?" + urllib.parse.urlencode({"query": expr}))
            reply = json.loads(body)
            assert status == 200 and reply["status"] == "success", f"{expr}: {reply}"
            result: list[dict[str, Any]] = reply["data"]["result"]
            return result

        wait_until(
            "Prometheus /-/ready",
            lambda: http("GET", f"http://{HOST}:{prom_port}/-/ready")[0] == 200,
            START_TIMEOUT_S,
            prom,
        )
        up = wait_until(
            'up{job="memtier"} == 1',
            lambda: [r for r in query('up{job="memtier"} == 1')],
            SCRAPE_TIMEOUT_S,
            prom,
        )
        assert up[0]["metric"]["instance"] == f"{HOST}:{serve_port}"

        def scraped_names() -> set[str]:
            rows = query('count by (__name__) ({job="memtier", __name__=~"memtier_.+"})')
            return {row["metric"]["__name__"] for row in rows}

        names = wait_until(
            f"Prometheus to hold the {len(exposed)} memtier_ series memtier serve exposes",
            lambda: (found := scraped_names()) >= exposed and found,
            SCRAPE_TIMEOUT_S,
            prom,
        )
        assert exposed <= names
        calls = query('sum(memtier_script_duration_seconds_count{job="memtier"})')
        assert calls and float(calls[0]["value"][1]) >= 1

        # The gauges that used to read a flat zero, and the HTTP metrics, as scraped.
        sessions = query('max(memtier_active_sessions{job="memtier"})')
        assert sessions and float(sessions[0]["value"][1]) == 3
        stored = query('max(memtier_stored_bytes{job="memtier"})')
        assert stored and float(stored[0]["value"][1]) == expected["bytes"]
        gets = query(
            'sum(memtier_http_requests_total{job="memtier", method="GET",'
            ' route="/memtier/conversations/{thread_id}", status="200"})'
        )
        assert gets and float(gets[0]["value"][1]) >= 1
        refused = query('sum(memtier_http_requests_total{job="memtier", status="401"})')
        assert refused and float(refused[0]["value"][1]) >= 1
        timed = query(
            'sum(memtier_http_request_duration_seconds_count{job="memtier",'
            ' route="/memtier/conversations"})'
        )
        assert timed and float(timed[0]["value"][1]) >= 2  # the POST and the refused GET

        # Every dashboard query evaluates on real data without error.
        for where, expr in dashboard_exprs(dashboard()):
            try:
                query(substitute_grafana_vars(expr))
            except AssertionError as exc:
                raise AssertionError(f"{where}: {exc}") from None

        # Every alerting rule is loaded and evaluates cleanly.
        expected_alerts = {where.removeprefix("alert ") for where, _ in alert_exprs()}

        def evaluated_rules() -> list[dict[str, Any]] | None:
            _, body = http("GET", f"{api}/rules")
            rules = [r for g in json.loads(body)["data"]["groups"] for r in g["rules"]]
            if {r["name"] for r in rules} != expected_alerts:
                return None
            if any(r["lastEvaluation"].startswith("0001-") for r in rules):
                return None
            return rules

        rules = wait_until("every alert rule evaluated", evaluated_rules, SCRAPE_TIMEOUT_S, prom)
        unhealthy = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
        assert not unhealthy, unhealthy
    finally:
        if prom is not None:
            prom.stop()
        serve.stop()
