"""What the manifests do when they run, checked offline (issue 18): liveness is not readiness, KEDA
reads its triggers where KEDA looks, replicated services are reached through every replica, CPU
inference binds cores of its own, the orchestrator waits for the whole drain, the Ingress serves
the API only, and the HTTP API has panels and an alert."""

from __future__ import annotations

import json
import os
import re
from typing import Any
from unittest import mock

import pytest
import yaml
from prometheus_client import Counter, Histogram

from gateway.api import middleware
from services.runtime.cli import catalog
from services.runtime.settings import ServiceSettings
from tests.fixtures.processes import ROOT
from tests.integration.deploy import test_compose as compose
from tests.integration.deploy.dockerfiles import env_of
from tests.integration.deploy.envcheck import settings_classes
from tests.integration.deploy.metricnames import dashboard_queries, names_in, referenced
from tests.integration.deploy.test_k8s import (
    TARGETS,
    _env,
    by_kind,
    containers,
    render,
    service_of,
)

README = (ROOT / "deploy" / "README.md").read_text(encoding="utf-8")
DASHBOARDS = sorted((ROOT / "deploy" / "observability" / "grafana" / "dashboards").glob("*.json"))
ALERTS = ROOT / "deploy" / "observability" / "prometheus" / "alerts.yml"
# Services whose readiness follows something outside the process (Redis, the audit buffer,
# upstreams) or the drain: their liveness probe must ask the "liveness" health service.
# Inference's NOT_SERVING outside a drain is a dead engine, which a restart fixes.
LIVENESS_APART = {"gateway", "policy", "cache", "embeddings"}
# Services run as several interchangeable replicas and dialled through one address.
REPLICATED = {"policy": "POLICY", "cache": "CACHE", "embeddings": "EMBEDDINGS"}
# Phases of a SIGTERM that each wait up to grace_seconds: the gateway stops gRPC, then uvicorn
# lets HTTP streams finish (gateway/app.py close); policy drains calls, then flushes its audit
# buffer with wait_s=grace_seconds (policy/app.py close).
GRACE_PHASES = {"gateway": 2, "policy": 2}
# Margin between the whole stop and SIGKILL.
MARGIN_S = 5


def settings_of(service: str, env: dict[str, str]) -> ServiceSettings:
    """The service's settings as the container's environment makes them (references left out)."""
    spec = next(s for s in catalog.SERVICES if s.name == service)
    cls = settings_classes()[spec.env_prefix]
    plain = {k: str(v) for k, v in env.items() if not str(v).startswith("<")}
    with mock.patch.dict(os.environ, plain, clear=True):
        settings = cls()
    assert isinstance(settings, ServiceSettings)
    return settings


def workloads(docs: tuple[dict[str, Any], ...]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for doc in docs:
        if doc["kind"] in {"Deployment", "StatefulSet"} and (service := service_of(doc)):
            out.append((service, doc))
    return out


@pytest.fixture(params=TARGETS)
def docs(request: pytest.FixtureRequest) -> tuple[dict[str, Any], ...]:
    return render(request.param)


# -- probes ---------------------------------------------------------------------------------------


def test_liveness_is_not_readiness(docs: tuple[dict[str, Any], ...]) -> None:
    for service, workload in workloads(docs):
        container = next(containers(workload))
        name = workload["metadata"]["name"]
        readiness = container["readinessProbe"]["exec"]["command"]
        liveness = container["livenessProbe"]["exec"]["command"]
        assert "--liveness" not in readiness, f"{name}: readiness must follow the dependencies"
        if service in LIVENESS_APART:
            assert liveness == [*readiness, "--liveness"], (
                f"{name}: liveness runs the readiness check, so Redis down or a drain restarts it"
            )


# -- KEDA -----------------------------------------------------------------------------------------

# KEDA's ScaleTriggers (keda.sh/v1alpha1): the fields a trigger has. Anything else, or a field put
# inside `metadata` (a map of strings handed to the scaler), is ignored without a word.
KEDA_TRIGGER_FIELDS = {"type", "name", "metadata", "authenticationRef", "metricType", "useCachedMetrics"}
KEDA_PROMETHEUS_METADATA = {
    "serverAddress",
    "query",
    "queryParameters",
    "threshold",
    "activationThreshold",
    "namespace",
    "customHeaders",
    "ignoreNullValues",
    "unsafeSsl",
    "timeout",
}


def keda_metric_type(trigger: dict[str, Any]) -> str:
    """The metric type KEDA applies to a trigger: its own field, else AverageValue."""
    assert set(trigger) <= KEDA_TRIGGER_FIELDS, f"KEDA ignores {set(trigger) - KEDA_TRIGGER_FIELDS}"
    if trigger["type"] == "prometheus":
        unknown = set(trigger["metadata"]) - KEDA_PROMETHEUS_METADATA
        assert not unknown, f"the prometheus scaler ignores metadata {unknown}"
    metric_type: str = trigger.get("metricType", "AverageValue")
    assert metric_type in {"AverageValue", "Value", "Utilization"}, metric_type
    return metric_type


def test_keda_triggers_read_as_keda_reads_them() -> None:
    scaled = [d for target in TARGETS for d in by_kind(render(target), "ScaledObject")]
    assert scaled, "no ScaledObject rendered"
    for obj in scaled:
        for trigger in obj["spec"]["triggers"]:
            query = trigger["metadata"]["query"]
            kind = keda_metric_type(trigger)
            # An avg() over replicas is compared as is; a sum is split over the replicas.
            if query.startswith("avg("):
                assert kind == "Value", f"{query}: KEDA would divide an average by the replica count"
            elif query.startswith("sum("):
                assert kind == "AverageValue", query


def test_keda_reading_catches_a_misplaced_metric_type() -> None:
    misplaced = {
        "type": "prometheus",
        "metadata": {"query": "avg(x)", "threshold": "1", "metricType": "Value"},
    }
    with pytest.raises(AssertionError, match="ignores metadata"):
        keda_metric_type(misplaced)


# -- discovery ------------------------------------------------------------------------------------


def headless_target(address: str) -> tuple[str, int]:
    match = re.fullmatch(r"dns:///([a-z0-9-]+):(\d+)", address)
    assert match, f"{address}: not a dns:/// target, so gRPC's pick_first pins one replica"
    return match.group(1), int(match.group(2))


def test_replicated_services_are_dialled_through_every_pod(docs: tuple[dict[str, Any], ...]) -> None:
    services = {d["metadata"]["name"]: d for d in by_kind(docs, "Service")}
    certificates = {d["spec"]["secretName"]: d for d in by_kind(docs, "Certificate")}
    envs = {service: _env(workload, docs) for service, workload in workloads(docs)}
    dialled = [
        (f"LLMESH_GATEWAY_{key}_ADDRESS", envs["gateway"], target) for target, key in REPLICATED.items()
    ]
    dialled.append(("LLMESH_CACHE_EMBEDDINGS_ADDRESS", envs["cache"], "embeddings"))
    for variable, env, target in dialled:
        host, port = headless_target(env[variable])
        headless = services[host]
        assert headless["spec"].get("clusterIP") == "None", f"{host} is not headless"
        assert headless["spec"]["selector"] == {"app.kubernetes.io/name": target}, host
        assert port in {p["port"] for p in headless["spec"]["ports"]}, f"{host} has no port {port}"
        certificate = certificates.get(f"llmesh-tls-{target}")
        if certificate is not None:  # mutual TLS checks the name dialled
            assert host in certificate["spec"]["dnsNames"], f"{target}'s certificate lacks {host}"
    for service, env in envs.items():
        settings = settings_of(service, env)
        assert settings.max_connection_age_s > 0, f"{service}: clients would never re-resolve"


@pytest.mark.parametrize("variant", sorted(compose.VARIANTS))
def test_compose_dials_every_container_of_a_scaled_service(variant: str) -> None:
    services = compose.rendered(variant)["services"]
    dialled = [("gateway", f"LLMESH_GATEWAY_{key}_ADDRESS", target) for target, key in REPLICATED.items()]
    dialled.append(("cache", "LLMESH_CACHE_EMBEDDINGS_ADDRESS", "embeddings"))
    for client, variable, target in dialled:
        host, port = headless_target(services[client]["environment"][variable])
        assert (host, port) == (target, compose.PORTS[target]), f"{client}: {variable}"
    for name, service in services.items():
        if name in compose.LLMESH:
            settings = settings_of(compose.LLMESH[name], service.get("environment") or {})
            assert settings.max_connection_age_s > 0, name


# -- CPU binding ----------------------------------------------------------------------------------


def test_cpu_inference_pods_get_cores_of_their_own(docs: tuple[dict[str, Any], ...]) -> None:
    for service, workload in workloads(docs):
        container = next(containers(workload))
        if service != "inference" or not container["image"].endswith("-cpu"):
            continue
        resources = container["resources"]
        name = workload["metadata"]["name"]
        # Guaranteed QoS with whole CPUs: the static CPU manager's exclusive cores, which the
        # engine's OpenMP threads bind to (auto = the affinity).
        assert resources["requests"] == resources["limits"], f"{name}: Burstable, bound to every core"
        assert re.fullmatch(r"[1-9]\d*", str(resources["limits"]["cpu"])), f"{name}: not whole CPUs"


def cpuset(text: str) -> set[int]:
    cores: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        cores.update(range(int(low), int(high or low) + 1))
    return cores


@pytest.mark.parametrize("variant", sorted(compose.RENDERINGS))
def test_compose_cpu_replicas_bind_disjoint_cores(variant: str) -> None:
    services = compose.rendered(variant)["services"]
    taken: dict[int, str] = {}
    for name, service in services.items():
        if compose.LLMESH.get(name) != "inference" or not service["image"].endswith("-cpu"):
            continue
        assert "cpus" not in service, f"{name}: a quota leaves the affinity at every host core"
        assert service.get("cpuset"), f"{name}: no cpuset, its engine binds every host core"
        for core in cpuset(service["cpuset"]):
            assert core not in taken, f"{name} and {taken[core]} both bind core {core}"
            taken[core] = name


# -- grace periods --------------------------------------------------------------------------------


def test_kubernetes_waits_for_the_whole_drain(docs: tuple[dict[str, Any], ...]) -> None:
    for service, workload in workloads(docs):
        pod = workload["spec"]["template"]["spec"]
        container = next(containers(workload))
        pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
        settings = settings_of(service, _env(workload, docs))
        needed = pre_stop + settings.shutdown_seconds(GRACE_PHASES.get(service, 1)) + MARGIN_S
        assert pod["terminationGracePeriodSeconds"] >= needed, (
            f"{workload['metadata']['name']}: SIGKILL at {pod['terminationGracePeriodSeconds']} s "
            f"cuts a stop of up to {needed - MARGIN_S} s"
        )


@pytest.mark.parametrize("variant", sorted(compose.RENDERINGS))
def test_compose_waits_for_the_whole_drain(variant: str) -> None:
    for name, service in compose.rendered(variant)["services"].items():
        if name not in compose.LLMESH:
            continue
        kind = compose.LLMESH[name]
        image_env = env_of(compose.image_of(service))
        settings = settings_of(kind, {**image_env, **(service.get("environment") or {})})
        needed = settings.shutdown_seconds(GRACE_PHASES.get(kind, 1)) + MARGIN_S
        assert compose._seconds(service["stop_grace_period"]) >= needed, name


# -- Ingress --------------------------------------------------------------------------------------


def prefix_matches(path: str, request: str) -> bool:
    """Kubernetes' Prefix path type: whole path elements."""
    prefix = path.rstrip("/")
    return prefix in ("", request) or request.startswith(prefix + "/")


def test_ingress_serves_the_api_only() -> None:
    docs = render("component/ingress")
    paths = [
        (path["pathType"], path["path"])
        for ingress in by_kind(docs, "Ingress")
        for rule in ingress["spec"]["rules"]
        for path in rule["http"]["paths"]
    ]
    assert paths and all(kind == "Prefix" for kind, _ in paths)

    def routed(request: str) -> bool:
        return any(prefix_matches(path, request) for _, path in paths)

    for private in (
        "/metrics",
        "/readyz",
        "/healthz",
        "/grpc.health.v1.Health/Check",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    ):
        assert not routed(private), f"{private} is public"
    for public in ("/v1/chat/completions", "/v1/models", "/llmesh.v1.ChatService/Complete"):
        assert routed(public), f"{public} is not routed"


# -- HTTP metrics ---------------------------------------------------------------------------------


def test_http_metrics_have_panels_and_an_alert() -> None:
    families = {
        metric._name  # prometheus_client keeps the family name there
        for metric in vars(middleware).values()
        if isinstance(metric, Counter | Histogram) and metric._name.startswith("llmesh_http_")
    }
    assert families, "gateway/api/middleware.py defines no llmesh_http_* metric"
    on_panels = {
        name
        for dashboard in DASHBOARDS
        for _, query in dashboard_queries(json.loads(dashboard.read_text(encoding="utf-8")))
        for name in names_in(query)
    }
    alerted = {
        name
        for group in yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]
        for rule in group["rules"]
        for name in referenced(rule["expr"])
    }

    def family(name: str) -> str:
        return re.sub(r"(_total|_bucket|_sum|_count)$", "", name)

    for metric in families:
        assert metric in {family(n) for n in on_panels}, f"{metric} is on no dashboard panel"
    assert any(family(n).startswith("llmesh_http_") for n in alerted), "no alert reads llmesh_http_*"


# -- README ---------------------------------------------------------------------------------------


def test_canary_sets_the_partition_before_the_new_image() -> None:
    """With the partition set after `set image`, every replica has already rolled: no canary."""
    lines = README.splitlines()
    partition = next(i for i, line in enumerate(lines) if '"partition"' in line and "patch" in line)
    image = next(i for i, line in enumerate(lines) if "set image statefulset/inference" in line)
    assert partition < image


# The custom resources each kind of operator serves, as the README names the operator.
OPERATORS = {
    "monitoring.coreos.com": "Prometheus operator",
    "keda.sh": "KEDA",
    "cert-manager.io": "cert-manager",
}


def test_readme_lists_each_overlays_operators() -> None:
    rows = dict(re.findall(r"^\| `([a-z-]+)` +\| needs: ([^|]+)\|", README, re.MULTILINE))
    for overlay in ("dev", "production", "gpu", "cross-zone"):
        groups = {d["apiVersion"].split("/")[0] for d in render(f"overlay/{overlay}")}
        for group, operator in OPERATORS.items():
            if group in groups:
                assert operator in rows.get(overlay, ""), f"{overlay} needs {operator}: not in the README"


def _cpus(value: str) -> float:
    return float(value[:-1]) / 1000 if value.endswith("m") else float(value)


def _gib(value: str) -> float:
    units = {"Ki": 2**-20, "Mi": 2**-10, "Gi": 1.0}
    return float(value[:-2]) * units[value[-2:]] if value[-2:] in units else float(value) / 2**30


def test_readme_states_what_dev_requests() -> None:
    cpus = gib = 0.0
    for doc in render("overlay/dev"):
        if doc["kind"] in {"Deployment", "StatefulSet"}:
            for container in containers(doc):
                requests = container["resources"]["requests"]
                cpus += doc["spec"].get("replicas", 1) * _cpus(str(requests["cpu"]))
                gib += doc["spec"].get("replicas", 1) * _gib(str(requests["memory"]))
    stated = re.search(
        r"\*\*What `dev` requests\.\*\* One replica of everything: ([\d.]+) CPUs.*?"
        r"and ([\d.]+) GiB of\s+memory",
        README,
        re.DOTALL,
    )
    assert stated, "deploy/README.md does not say what the dev overlay requests"
    assert (float(stated.group(1)), float(stated.group(2))) == (round(cpus, 2), round(gib, 2))
