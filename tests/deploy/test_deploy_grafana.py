"""deploy/grafana: the dashboard's JSON, its queries against memtier's real collectors
(names and labels), compiled by promtool, and the provisioning mounts.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from deployhelpers import (
    _METRIC_RE,
    DEPLOY,
    check_expr_against_collectors,
    dashboard,
    dashboard_exprs,
    dashboard_panels,
    load_yaml_docs,
    memtier_collectors,
    memtier_series_names,
    require_tool,
    run,
    substitute_grafana_vars,
)


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
