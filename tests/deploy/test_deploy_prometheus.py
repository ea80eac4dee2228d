"""deploy/prometheus: ``promtool check config`` / ``check rules`` / ``test rules``
(alert unit tests), the scrape job, and every alert expression checked against memtier's
real collectors.
"""

from __future__ import annotations

from deployhelpers import (
    PROM_DIR,
    alert_exprs,
    check_expr_against_collectors,
    load_yaml_docs,
    require_tool,
    run,
)


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
