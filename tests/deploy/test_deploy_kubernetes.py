"""deploy/kubernetes: manifests parse and are listed, pods hardened and bounded, the serve,
worker and Redis wiring.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deployhelpers import (
    DEPLOY,
    K8S_DIR,
    PROM_DIR,
    assert_api_keys_toml,
    k8s_container,
    k8s_docs,
    load_yaml_docs,
    pod_workloads,
)


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


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item for item in container.get("env", [])}


def test_kubernetes_serve_probes_metrics_and_api_keys() -> None:
    workload = pod_workloads()["memtier-serve"]
    pod = workload["spec"]["template"]
    container = k8s_container("memtier-serve")
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
    worker = k8s_container("memtier-worker")
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
        env = _env(k8s_container(name))
        assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "memtier-redis-auth"
        assert env["MEMTIER_REDIS_URL"]["value"].startswith(
            "redis://:$(REDIS_PASSWORD)@memtier-redis:"
        )
    redis_set = pod_workloads()["memtier-redis"]
    spec = redis_set["spec"]["template"]["spec"]
    container = k8s_container("memtier-redis")
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
