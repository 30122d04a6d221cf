"""Secure defaults of the shipped deployments (compose and every Kubernetes overlay), offline.

Issue 14 found the production and gpu overlays running an open gateway, no TLS between the
services, compose publishing the gateway, Grafana (admin/admin, anonymous), Prometheus (lifecycle
API) and Jaeger on every interface, reflection everywhere, UDP 4433 open to every source and Redis
without a password. These tests render the files the way an operator does (``docker-compose
config``, ``kubectl kustomize``) and check each default; tests/security/test_redis_acl.py runs
the Redis ACL in a real Redis.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from services.runtime.cli import catalog
from tests.integration.deploy.test_compose import LLMESH, SECRETS, VARIANTS, compose, mounts, rendered
from tests.integration.deploy.test_k8s import (
    K8S,
    OVERLAYS,
    WORKLOADS,
    _config_maps,
    _env,
    by_kind,
    containers,
    kustomize,
    render,
    service_of,
)

TLS_DIR = "/etc/llmesh/tls"
TLS_ENV = {
    "LLMESH_TLS_CERT_FILE": f"{TLS_DIR}/tls.crt",
    "LLMESH_TLS_KEY_FILE": f"{TLS_DIR}/tls.key",
    "LLMESH_TLS_CA_FILE": f"{TLS_DIR}/ca.crt",
    "LLMESH_TLS_CLIENT_AUTH": "true",
}
# Overlays anyone outside the cluster may reach (an Ingress, a remote zone): never open.
EXPOSED_OVERLAYS = ("production", "gpu", "cross-zone")
REDIS_USERS = {"gateway", "policy", "embeddings", "cache"}


# --- compose -------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_compose_services_speak_mutual_tls(variant: str) -> None:
    services = rendered(variant)["services"]
    for name in set(LLMESH) & set(services):
        env = services[name]["environment"]
        assert {k: env.get(k) for k in TLS_ENV} == TLS_ENV, name
        # Its own certificate and key, and the CA certificate; never the CA's key.
        mounted = {target: Path(source).name for target, source in mounts(services[name]).items()}
        identity = LLMESH[name]
        assert mounted[f"{TLS_DIR}/tls.crt"] == f"{identity}.pem", name
        assert mounted[f"{TLS_DIR}/tls.key"] == f"{identity}.key", name
        assert mounted[f"{TLS_DIR}/ca.crt"] == "ca.pem", name
        assert "ca.key" not in mounted.values(), name


def test_compose_publishes_on_loopback_only() -> None:
    for variant in VARIANTS:
        for name, service in rendered(variant)["services"].items():
            for port in service.get("ports") or []:
                # Compose v2 renders the long form: {host_ip, published, target, ...}.
                assert port["host_ip"] == "127.0.0.1", f"{name}: {port}"
    # The bind address is the operator's choice, on purpose.
    proc = compose("config", secrets={**SECRETS, "LLMESH_BIND": "10.0.0.5"})
    assert proc.returncode == 0, proc.stderr
    gateway = yaml.safe_load(proc.stdout)["services"]["gateway"]
    assert gateway["ports"] and all(p["host_ip"] == "10.0.0.5" for p in gateway["ports"])


def test_grafana_has_no_default_password_and_no_anonymous_access() -> None:
    env = rendered("default")["services"]["grafana"]["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert env["GF_SECURITY_ADMIN_PASSWORD"] == SECRETS["LLMESH_GRAFANA_PASSWORD"]
    proc = compose(
        "config", "-q", secrets={k: v for k, v in SECRETS.items() if k != "LLMESH_GRAFANA_PASSWORD"}
    )
    assert proc.returncode != 0
    assert "set LLMESH_GRAFANA_PASSWORD" in proc.stderr


def test_prometheus_has_no_lifecycle_api() -> None:
    command = rendered("default")["services"]["prometheus"]["command"]
    assert not any("enable-lifecycle" in arg for arg in command)


@pytest.mark.parametrize("secret", sorted(SECRETS))
def test_compose_refuses_to_start_without_each_secret(secret: str) -> None:
    """No API keys: no open gateway; no Redis password or Grafana password: no default one."""
    proc = compose("config", "-q", secrets={k: v for k, v in SECRETS.items() if k != secret})
    assert proc.returncode != 0
    assert f"set {secret} in deploy/compose/.env" in proc.stderr


def test_compose_services_log_into_redis_as_their_own_user() -> None:
    services = rendered("default")["services"]
    for name in REDIS_USERS:
        url = services[name]["environment"]["REDIS_URL"]
        password = SECRETS[f"REDIS_PASSWORD_{name.upper()}"]
        assert url == f"redis://{name}:{password}@redis:6379/0", name
    for name in set(LLMESH) - REDIS_USERS:
        assert "REDIS_URL" not in (services.get(name) or {}).get("environment", {}), name
    for redis, rules in (("redis", "users.acl"), ("redis-cache", "cache-users.acl")):
        service = services[redis]
        assert f"/etc/llmesh/redis/{rules}" == service["command"][0]
        assert "--aclfile /tmp/users.acl" in " ".join(service["entrypoint"])
        # The probe logs in as "probe" (PING only): the default user is off.
        assert "--user probe" in service["healthcheck"]["test"][-1]


def test_shipped_acl_disables_the_default_user() -> None:
    for rules in ("users.acl", "cache-users.acl"):
        lines = (K8S.parent / "redis" / rules).read_text(encoding="utf-8").splitlines()
        default = [line for line in lines if line.startswith("user default ")]
        assert default and " off " in f"{default[0]} ", rules


# --- Kubernetes ----------------------------------------------------------------------------------


def _llmesh_workloads(docs: tuple[dict[str, Any], ...]) -> list[tuple[str, dict[str, Any]]]:
    return [(s, d) for d in docs if d["kind"] in WORKLOADS and (s := service_of(d)) is not None]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_speaks_mutual_tls(overlay: str) -> None:
    docs = render(f"overlay/{overlay}")
    certificates = {c["spec"]["secretName"]: c for c in by_kind(docs, "Certificate")}
    workloads = _llmesh_workloads(docs)
    assert {s for s, _ in workloads} == {s.name for s in catalog.SERVICES}
    for service, workload in workloads:
        name = workload["metadata"]["name"]
        env = _env(workload, docs)
        assert {k: env.get(k) for k in TLS_ENV} == TLS_ENV, name
        container = next(containers(workload))
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == TLS_DIR)
        volume = next(
            v for v in workload["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]
        )
        secret = volume["secret"]["secretName"]
        assert secret == f"llmesh-tls-{service}", name
        # cert-manager issues it, with the service's identity as Common Name.
        assert certificates[secret]["spec"]["commonName"] == service, name
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            # The built-in gRPC probe cannot do TLS: the health check script presents the pod's cert.
            assert "grpc" not in container[probe], f"{name}: {probe}"
            command = [a for a in container[probe]["exec"]["command"] if a != "--liveness"]
            assert command[-2:] == ["/opt/llmesh/healthcheck.py", service]


@pytest.mark.parametrize("overlay", EXPOSED_OVERLAYS)
def test_exposed_overlays_fail_clearly_without_api_keys(overlay: str) -> None:
    """The checked-in overlay has no key file: rendering stops and names the file to create."""
    folder = K8S / "overlays" / overlay
    assert not (folder / "gateway-api-keys.env").exists(), "an API key file is checked in"
    proc = kustomize(folder)
    assert proc.returncode != 0
    assert "gateway-api-keys.env" in proc.stderr and "no such file" in proc.stderr


@pytest.mark.parametrize("overlay", EXPOSED_OVERLAYS)
def test_exposed_overlays_give_the_gateway_its_keys_and_never_run_open(overlay: str) -> None:
    docs = render(f"overlay/{overlay}")
    secrets = {d["metadata"]["name"]: d for d in by_kind(docs, "Secret")}
    keys = secrets["llmesh-gateway-secrets"]["data"]
    assert set(keys) == {"LLMESH_GATEWAY_API_KEYS"}  # never LLMESH_GATEWAY_ALLOW_OPEN
    gateway = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "gateway")
    env = _env(gateway, docs)
    assert env["LLMESH_GATEWAY_API_KEYS"] == "<secret>"
    assert "LLMESH_GATEWAY_ALLOW_OPEN" not in env
    assert all("ALLOW_OPEN" not in str(v) for v in _config_maps(docs).values())


def test_only_the_dev_overlay_is_deliberately_open() -> None:
    env_file = (K8S / "overlays" / "dev" / "gateway-secrets.env").read_text(encoding="utf-8").splitlines()
    assert "LLMESH_GATEWAY_API_KEYS={}" in env_file and "LLMESH_GATEWAY_ALLOW_OPEN=true" in env_file
    docs = render("overlay/dev")
    assert not by_kind(docs, "Ingress")


@pytest.mark.parametrize("overlay", EXPOSED_OVERLAYS)
def test_reflection_is_off_in_production(overlay: str) -> None:
    docs = render(f"overlay/{overlay}")
    for service, workload in _llmesh_workloads(docs):
        env = _env(workload, docs)
        assert env.get(f"LLMESH_{service.upper()}_REFLECTION") == "false", workload["metadata"]["name"]


@pytest.mark.parametrize("target", ["overlay/cross-zone", "component/quic"])
def test_quic_port_is_not_open_to_every_source(target: str) -> None:
    docs = render(target)
    policy = next(p for p in by_kind(docs, "NetworkPolicy") if p["metadata"]["name"] == "inference-remote")
    quic = [r for r in policy["spec"]["ingress"] if {"port": 4433, "protocol": "UDP"} in r["ports"]]
    assert quic
    for rule in quic:
        assert rule.get("from"), "UDP 4433 admits every source"
        for peer in rule["from"]:
            cidr = peer.get("ipBlock", {}).get("cidr")
            assert cidr not in ("0.0.0.0/0", "::/0"), cidr
    # The replica requires a client certificate: it has the CA to check one against.
    remote = next(d for d in by_kind(docs, "StatefulSet") if d["metadata"]["name"] == "inference-remote")
    env = _env(remote, docs)
    assert env["LLMESH_QUIC_CA_FILE"] == f"{TLS_DIR}/ca.crt"
    gateway = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "gateway")
    assert _env(gateway, docs)["LLMESH_QUIC_CERT_FILE"] == f"{TLS_DIR}/tls.crt"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_k8s_services_log_into_redis_as_their_own_user(overlay: str) -> None:
    docs = render(f"overlay/{overlay}")
    passwords = next(d for d in by_kind(docs, "Secret") if d["metadata"]["name"] == "llmesh-redis-passwords")
    for service, workload in _llmesh_workloads(docs):
        if workload["metadata"]["name"] == "inference-remote":
            continue
        env = {e["name"]: e for e in next(containers(workload)).get("env") or []}
        if service not in REDIS_USERS:
            assert "REDIS_URL" not in _env(workload, docs), service
            continue
        assert env["REDIS_URL"]["value"] == f"redis://{service}:$(REDIS_PASSWORD)@redis:6379/0"
        ref = env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "llmesh-redis-passwords", "key": f"REDIS_PASSWORD_{service.upper()}"}
        assert ref["key"] in passwords["data"]
    for redis in (
        d for d in docs if d["kind"] in WORKLOADS and d["metadata"]["name"] in ("redis", "redis-cache")
    ):
        container = next(containers(redis))
        assert "--aclfile /run/redis/users.acl" in container["command"][-1], redis["metadata"]["name"]
