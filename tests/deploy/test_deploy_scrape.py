"""The real thing: a real ``memtier serve`` on a real Redis, some HTTP traffic, and a real
``prometheus`` scraping it with the job of ``deploy/prometheus/prometheus.yml`` and the rules
of ``alerts.yml``, until its query API returns the ``memtier_`` series that ``/metrics``
exposes; every dashboard query then runs on that Prometheus without error.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from deployhelpers import (
    PROM_DIR,
    ROOT,
    SCRAPE_TIMEOUT_S,
    START_TIMEOUT_S,
    Proc,
    alert_exprs,
    dashboard,
    dashboard_exprs,
    free_port,
    http,
    load_yaml_docs,
    memtier_series_names,
    require_tool,
    substitute_grafana_vars,
    wait_until,
)
from servers import HOST, RedisServer


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
