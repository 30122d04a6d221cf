"""Kubernetes manifests: every overlay and component renders (kustomize), validates against the
Kubernetes schemas (strict), and keeps the invariants the runbook relies on."""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from services.runtime.cli import catalog
from tests.fixtures.processes import ROOT
from tests.integration.deploy.envcheck import settings_errors, unknown_variables

K8S = ROOT / "deploy" / "k8s"
OBSERVABILITY = ROOT / "deploy" / "observability"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").exists())
COMPONENTS = sorted(p.name for p in (K8S / "components").iterdir() if (p / "kustomization.yaml").exists())
KUBERNETES_VERSION = "1.33"
# Custom resources: their operators' schemas are not in kubernetes-validate.
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("cert-manager.io/v1", "Certificate"),
    ("cert-manager.io/v1", "Issuer"),
}
# Secrets cert-manager issues (components/cert-manager) or the operator creates: referenced, never
# rendered. The base and a component alone also leave the overlays' secrets to an overlay.
TLS_SECRETS = {f"llmesh-tls-{s.name}" for s in catalog.SERVICES}
OVERLAY_SECRETS = {"llmesh-gateway-secrets", "llmesh-redis-passwords", "llmesh-policy-secrets"}
# The files an operator creates in an overlay (deploy/README.md "Secrets"); the tests render a
# copy of deploy/ with these, as the checked-in overlays need them.
OPERATOR_FILES = {
    "gateway-api-keys.env": 'LLMESH_GATEWAY_API_KEYS={"sha256:' + "0" * 64 + '": "acme"}\n',
    "redis-passwords.env": "".join(
        f"REDIS_PASSWORD_{user}=test-password-of-{user.lower()}\n"
        for user in ("GATEWAY", "POLICY", "EMBEDDINGS", "CACHE")
    ),
    "policy-secrets.env": "LLMESH_POLICY_AUDIT_HMAC_KEY=" + "k" * 40 + "\n",
}
PORTS = {s.name: s.port for s in catalog.SERVICES}
WORKLOADS = {"Deployment", "StatefulSet", "Job"}


def kubectl() -> str:
    path = shutil.which("kubectl")
    assert path, "kubectl (with its built-in kustomize) not found; it ships with the machine image"
    return path


def kustomize(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=120, check=False
    )


@functools.cache
def render_dir(path: Path) -> tuple[dict[str, Any], ...]:
    proc = kustomize(path)
    assert proc.returncode == 0, proc.stderr
    return tuple(d for d in yaml.safe_load_all(proc.stdout) if d)


@functools.cache
def deploy_with_operator_files() -> Path:
    """A copy of deploy/ (in a temporary folder) where every overlay has the secret files its
    kustomization names that an operator would create (:data:`OPERATOR_FILES`)."""
    folder = tempfile.mkdtemp(prefix="llmesh-deploy-")
    atexit.register(shutil.rmtree, folder, True)
    copy = Path(folder) / "deploy"
    shutil.copytree(ROOT / "deploy", copy, ignore=shutil.ignore_patterns(*OPERATOR_FILES))
    for overlay in (copy / "k8s" / "overlays").iterdir():
        kustomization = overlay / "kustomization.yaml"
        if not kustomization.exists():
            continue
        text = kustomization.read_text(encoding="utf-8")
        for name, content in OPERATOR_FILES.items():
            if f"- {name}" in text:
                (overlay / name).write_text(content, encoding="utf-8")
    return copy


@functools.cache
def render(target: str) -> tuple[dict[str, Any], ...]:
    """``overlay/NAME``, ``base``, or ``component/NAME`` (the base plus that component)."""
    kind, _, name = target.partition("/")
    if kind == "overlay":
        return render_dir(deploy_with_operator_files() / "k8s" / "overlays" / name)
    if kind == "base":
        return render_dir(K8S / "base")
    folder = ROOT / ".llmesh" / "kustomize" / name
    folder.mkdir(parents=True, exist_ok=True)
    rel = functools.partial(os.path.relpath, start=folder)
    (folder / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": [rel(K8S / "base")], "components": [rel(K8S / "components" / name)]}),
        encoding="utf-8",
    )
    return render_dir(folder)


TARGETS = ["base", *(f"overlay/{o}" for o in OVERLAYS), *(f"component/{c}" for c in COMPONENTS)]


@pytest.fixture(params=TARGETS)
def docs(request: pytest.FixtureRequest) -> tuple[dict[str, Any], ...]:
    return render(request.param)


def by_kind(docs: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def containers(workload: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from workload["spec"]["template"]["spec"]["containers"]


def service_of(workload: dict[str, Any]) -> str | None:
    """The llmesh service a workload runs (None for Redis, the collector, jobs)."""
    images = [c["image"] for c in containers(workload)]
    for name in PORTS:
        if any(f"llmesh/{name}:" in image for image in images):
            return name
    return None


def test_expected_layout() -> None:
    assert {"dev", "production", "gpu", "cross-zone"} <= set(OVERLAYS)
    assert {"autoscaling", "keda", "gpu", "redis-cluster", "quic", "monitoring", "ingress"} <= set(COMPONENTS)


@functools.cache
def schema_error(document: str) -> str | None:
    """kubernetes-validate's complaint about one document (JSON), once per distinct document."""
    doc = json.loads(document)
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError) as exc:
        return f"{doc['kind']}/{doc['metadata']['name']}: {exc}"
    return None


def test_schemas(docs: tuple[dict[str, Any], ...]) -> None:
    errors = []
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
            assert doc["spec"], doc["metadata"]["name"]
            continue
        error = schema_error(json.dumps(doc, sort_keys=True))
        if error:
            errors.append(error)
    assert not errors, "\n".join(errors)


def test_workloads_are_hardened(docs: tuple[dict[str, Any], ...]) -> None:
    for workload in (d for d in docs if d["kind"] in WORKLOADS):
        name = f"{workload['kind']}/{workload['metadata']['name']}"
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        assert pod.get("automountServiceAccountToken") is False, name
        for container in containers(workload):
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True, name
            assert security["allowPrivilegeEscalation"] is False, name
            assert security["capabilities"]["drop"] == ["ALL"], name
            resources = container["resources"]
            assert resources["requests"]["cpu"] and resources["requests"]["memory"], name
            assert resources["limits"]["memory"], name


def _config_maps(docs: tuple[dict[str, Any], ...]) -> dict[str, dict[str, str]]:
    return {d["metadata"]["name"]: d.get("data") or {} for d in by_kind(docs, "ConfigMap")}


def _env(workload: dict[str, Any], docs: tuple[dict[str, Any], ...]) -> dict[str, str]:
    maps = _config_maps(docs)
    secrets = {d["metadata"]["name"]: d.get("data") or {} for d in by_kind(docs, "Secret")}
    env: dict[str, str] = {}
    for container in containers(workload):
        for source in container.get("envFrom") or []:
            if "configMapRef" in source:
                name = source["configMapRef"]["name"]
                assert name in maps, f"{workload['metadata']['name']}: ConfigMap {name} is not rendered"
                env.update(maps[name])
            else:
                name = source["secretRef"]["name"]
                assert name in secrets or (name in OVERLAY_SECRETS and not rendered_by_overlay(docs)), name
                env.update(dict.fromkeys(secrets.get(name, {}), "<secret>"))
        for entry in container.get("env") or []:
            ref = entry.get("valueFrom", {}).get("secretKeyRef")
            if ref is not None:
                known = ref["name"] in secrets or (
                    ref["name"] in OVERLAY_SECRETS and not rendered_by_overlay(docs)
                )
                assert known, f"{workload['metadata']['name']}: Secret {ref['name']} is not rendered"
                if ref["name"] in secrets:
                    assert ref["key"] in secrets[ref["name"]], f"{ref['name']} has no key {ref['key']}"
            env[entry["name"]] = entry.get("value", "<ref>")
    return env


def rendered_by_overlay(docs: tuple[dict[str, Any], ...]) -> bool:
    """Whether ``docs`` is an overlay's output (it generates the gateway's Secret)."""
    return any(d["metadata"]["name"].startswith("llmesh-gateway-secrets") for d in by_kind(docs, "Secret"))


def probe_runs_healthcheck(probe: dict[str, Any], service: str) -> bool:
    """An exec probe of deploy/docker/healthcheck.py for ``service`` (TLS-capable, unlike the
    built-in gRPC probe)."""
    command = probe.get("exec", {}).get("command", [])
    timeout: int = probe["timeoutSeconds"]
    # "--liveness": the liveness signal, not readiness (test_deploy_correctness.py).
    args = [a for a in command if a != "--liveness"]
    return args == ["python", "/opt/llmesh/healthcheck.py", service] and timeout >= 3


def test_llmesh_services(docs: tuple[dict[str, Any], ...]) -> None:
    seen = set()
    for workload in (d for d in docs if d["kind"] in WORKLOADS):
        service = service_of(workload)
        if service is None:
            continue
        seen.add(service)
        name = workload["metadata"]["name"]
        port = PORTS[service]
        env = _env(workload, docs)
        assert not unknown_variables(env), f"{name}: {unknown_variables(env)}"
        assert not settings_errors({k: v for k, v in env.items() if not v.startswith("<")}), name
        container = next(containers(workload))
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["grpc"] == port and ports["metrics"] == port + 1000, name
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert probe_runs_healthcheck(container[probe], service), (
                f"{name}: {probe} must run healthcheck.py"
            )
        grace = float(env.get(f"LLMESH_{service.upper()}_GRACE_SECONDS", "10"))
        termination = workload["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert termination > grace + 5, f"{name}: SIGKILL would cut the drain short"
        pdbs = [
            p
            for p in by_kind(docs, "PodDisruptionBudget")
            if p["spec"]["selector"]["matchLabels"].items()
            <= workload["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert pdbs, f"{name} has no PodDisruptionBudget"
    assert seen == set(PORTS), f"services not deployed: {set(PORTS) - seen}"


def test_services_select_pods(docs: tuple[dict[str, Any], ...]) -> None:
    labels = [d["spec"]["template"]["metadata"]["labels"] for d in docs if d["kind"] in WORKLOADS - {"Job"}]
    for service in by_kind(docs, "Service"):
        selector = service["spec"]["selector"]
        assert any(selector.items() <= pod.items() for pod in labels), service["metadata"]["name"]


def test_only_the_gateway_is_open(docs: tuple[dict[str, Any], ...]) -> None:
    policies = by_kind(docs, "NetworkPolicy")
    deny = [p for p in policies if p["spec"]["podSelector"] == {} and not p["spec"].get("ingress")]
    assert deny, "no default-deny ingress policy"
    for policy in policies:
        target = policy["spec"]["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/name")
        for rule in policy["spec"].get("ingress") or []:
            if rule.get("from"):
                continue
            # A rule without `from` admits the world.
            ports = {(p["port"], p.get("protocol", "TCP")) for p in rule["ports"]}
            if target == "gateway":
                assert ports == {(8000, "TCP"), (50050, "TCP")}
            else:
                assert target == "inference-remote" and ports == {(4433, "UDP")}, policy["metadata"]["name"]


def test_gateway_reaches_every_autoscaled_replica(docs: tuple[dict[str, Any], ...]) -> None:
    gateway = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "gateway")
    addresses = _env(gateway, docs)["LLMESH_GATEWAY_INFERENCE_ADDRESSES"].split(",")
    local = [a for a in addresses if not a.startswith("quic://")]
    for hpa in by_kind(docs, "HorizontalPodAutoscaler"):
        if hpa["spec"]["scaleTargetRef"]["name"] == "inference":
            assert hpa["spec"]["maxReplicas"] <= len(local)
    for scaled in by_kind(docs, "ScaledObject"):
        assert scaled["spec"]["maxReplicaCount"] <= len(local)
    inference = next(d for d in by_kind(docs, "StatefulSet") if d["metadata"]["name"] == "inference")
    service = inference["spec"]["serviceName"]
    expected = [f"inference-{i}.{service}:{PORTS['inference']}" for i in range(len(local))]
    assert local == expected
    for address in addresses:
        if address.startswith("quic://"):
            host, port = address.removeprefix("quic://").split(":")
            remote = next(d for d in by_kind(docs, "Service") if d["metadata"]["name"] == host)
            assert {"port": int(port), "protocol": "UDP"}.items() <= remote["spec"]["ports"][0].items()


def test_ingress_routes_to_the_gateway_only(docs: tuple[dict[str, Any], ...]) -> None:
    services = {d["metadata"]["name"]: d for d in by_kind(docs, "Service")}
    for ingress in by_kind(docs, "Ingress"):
        for rule in ingress["spec"]["rules"]:
            for path in rule["http"]["paths"]:
                backend = path["backend"]["service"]
                assert backend["name"] == "gateway"
                ports = {p["name"] for p in services["gateway"]["spec"]["ports"]}
                assert backend["port"]["name"] in ports


def test_scale_targets_exist(docs: tuple[dict[str, Any], ...]) -> None:
    workloads = {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] in WORKLOADS}
    for scaler in [*by_kind(docs, "HorizontalPodAutoscaler"), *by_kind(docs, "ScaledObject")]:
        ref = scaler["spec"]["scaleTargetRef"]
        assert (ref["kind"], ref["name"]) in workloads, scaler["metadata"]["name"]


def test_gpu_overlay_requests_gpus() -> None:
    inference = next(
        d
        for d in render("overlay/gpu")
        if d["metadata"]["name"] == "inference" and d["kind"] == "StatefulSet"
    )
    container = next(containers(inference))
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["image"].endswith("-gpu")
    cpu = next(
        d
        for d in render("overlay/production")
        if d["metadata"]["name"] == "inference" and d["kind"] == "StatefulSet"
    )
    assert "nvidia.com/gpu" not in next(containers(cpu))["resources"]["limits"]


def redis_server(url: str) -> str:
    """``host:port`` of a Redis URL (the user and password differ per service)."""
    return url.rpartition("@")[2].removeprefix("redis://").split("/")[0]


# The services' Redis under components/redis-sentinel: its sentinels (redis+sentinel://...).
SENTINELS = "redis-0.redis-headless:26379,redis-1.redis-headless:26379,redis-2.redis-headless:26379"


def test_redis_cluster_component_moves_only_the_response_tier() -> None:
    docs = render("component/redis-cluster")
    env = {d["metadata"]["name"]: _env(d, docs) for d in docs if d["kind"] in WORKLOADS and service_of(d)}
    assert env["cache"]["LLMESH_CACHE_RESPONSES_REDIS_CLUSTER"] == "true"
    assert env["cache"]["LLMESH_CACHE_RESPONSES_REDIS_URL"].startswith("redis://redis-cluster:")
    # Versions and sessions stay where policy and embeddings bump versions.
    assert redis_server(env["cache"]["REDIS_URL"]) == redis_server(env["policy"]["REDIS_URL"]) == "redis:6379"
    assert "LLMESH_CACHE_REDIS_URL" not in env["cache"]
    assert "redis-cache" not in {d["metadata"]["name"] for d in docs if d["kind"] != "ConfigMap"}
    conf = next(v for k, v in _config_maps(docs).items() if k.startswith("redis-cluster-config"))
    assert "maxmemory-policy allkeys-lfu" in conf["redis.conf"]


def test_cache_has_its_own_lfu_redis_for_responses(docs: tuple[dict[str, Any], ...]) -> None:
    """The response tier runs the shipped redis.conf in a Redis only the cache reaches; versions
    and sessions stay in the Redis that policy and embeddings use (where versions are bumped)."""
    names = {d["metadata"]["name"] for d in docs if d["kind"] != "ConfigMap"}
    if "redis-cache" not in names:
        return  # the redis-cluster component replaces it (checked above)
    env = {d["metadata"]["name"]: _env(d, docs) for d in docs if d["kind"] in WORKLOADS and service_of(d)}
    assert redis_server(env["cache"]["LLMESH_CACHE_RESPONSES_REDIS_URL"]) == "redis-cache:6379"
    servers = {redis_server(env[name]["REDIS_URL"]) for name in ("cache", "policy", "embeddings")}
    # One Redis: the base's, or the one the redis-sentinel component's sentinels watch.
    assert servers in ({"redis:6379"}, {SENTINELS})
    conf = next(v for k, v in _config_maps(docs).items() if k.startswith("redis-cache-config"))
    assert conf["redis.conf"] == (ROOT / "deploy" / "redis" / "redis.conf").read_text(encoding="utf-8")
    redis = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "redis-cache")
    pod = redis["spec"]["template"]["spec"]
    mounted = {v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v}
    assert any(m.startswith("redis-cache-config") for m in mounted)
    assert not any("persistentVolumeClaim" in v for v in pod["volumes"])
    policy = next(p for p in by_kind(docs, "NetworkPolicy") if p["metadata"]["name"] == "redis-cache")
    sources = [f["podSelector"]["matchLabels"] for rule in policy["spec"]["ingress"] for f in rule["from"]]
    assert sources == [{"app.kubernetes.io/name": "cache"}]


def test_prometheus_rule_matches_alerts_file() -> None:
    rule = yaml.safe_load((K8S / "components" / "monitoring" / "prometheusrule.yaml").read_text())
    alerts = yaml.safe_load((OBSERVABILITY / "prometheus" / "alerts.yml").read_text())
    assert rule["spec"]["groups"] == alerts["groups"]


def test_collector_and_dashboard_are_the_shared_files() -> None:
    docs = render("overlay/production")
    maps = _config_maps(docs)
    collector = next(v for k, v in maps.items() if k.startswith("otel-collector-config"))
    assert collector["config.yaml"] == (OBSERVABILITY / "otel-collector.yaml").read_text()
    dashboards = maps["llmesh-grafana-dashboards"]
    assert dashboards["llmesh.json"] == (OBSERVABILITY / "grafana" / "dashboards" / "llmesh.json").read_text()
    common = next(v for k, v in maps.items() if k.startswith("llmesh-common"))
    assert common["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4317"


# Kinds without a namespace (what kustomize's namespace transformer leaves alone).
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "ClusterIssuer",
    "CustomResourceDefinition",
}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_namespaced_resource_of_an_overlay_is_in_llmesh(overlay: str) -> None:
    """A component's resources (HPA, PodMonitor, the Redis Cluster, the overlay's Secrets) get no
    namespace from the base's kustomization: without the overlay's own, `kubectl apply -k` puts
    them in whatever namespace kubectl points at."""
    docs = render(f"overlay/{overlay}")
    elsewhere = [
        f"{d['kind']}/{d['metadata']['name']}: {d['metadata'].get('namespace')}"
        for d in docs
        if d["kind"] not in CLUSTER_SCOPED and d["metadata"].get("namespace") != "llmesh"
    ]
    assert not elsewhere
