"""deploy/compose and the Dockerfile: the services, and a COPY set enough to build the wheel
(Lua scripts included).
"""

from __future__ import annotations

import re
import shutil
import sys
import zipfile
from pathlib import Path

from deployhelpers import (
    DEPLOY,
    ROOT,
    assert_api_keys_toml,
    load_yaml_docs,
    run,
)


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
