"""The replicated Redis, offline: components/redis-sentinel renders what the runbook relies on
(three pods on distinct nodes with a sentinel and exporters beside each, a headless Service, a
PodDisruptionBudget, passwords from the Secret only, every service's REDIS_URL on the sentinels),
its alerts load and pass their promtool tests, and the compose variant (redis-ha.yml) is valid.
The Redis Cluster's re-forming runs on real processes: test_redis_cluster_reform.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from tests.fixtures.processes import ROOT, ChildProcess
from tests.fixtures.tools import tool
from tests.integration.deploy import test_compose as compose
from tests.integration.deploy.test_k8s import SENTINELS, _env, by_kind, containers, render, service_of

REDIS_DIR = ROOT / "deploy" / "redis"
HA_DIR = REDIS_DIR / "sentinel"
COMPONENT = ROOT / "deploy" / "k8s" / "components" / "redis-sentinel"
RUNBOOK = REDIS_DIR / "RUNBOOK.md"
HA_COMPOSE = ROOT / "deploy" / "compose" / "redis-ha.yml"
# The users ha-users.acl adds; each needs REDIS_PASSWORD_<USER> in llmesh-redis-passwords.
HA_USERS = {"replica", "failover", "exporter"}
SERVICES_WITH_REDIS = {"gateway", "policy", "cache", "embeddings"}


def docs() -> tuple[dict[str, Any], ...]:
    return render("component/redis-sentinel")


def redis_set() -> dict[str, Any]:
    return next(d for d in by_kind(docs(), "StatefulSet") if d["metadata"]["name"] == "redis")


def container(name: str) -> dict[str, Any]:
    return next(c for c in containers(redis_set()) if c["name"] == name)


def test_three_pods_on_distinct_nodes_each_with_a_sentinel_and_exporters() -> None:
    redis = redis_set()
    spec = redis["spec"]
    assert spec["replicas"] == 3
    pod = spec["template"]["spec"]
    assert {c["name"] for c in pod["containers"]} == {"redis", "sentinel", "exporter", "sentinel-exporter"}
    assert container("redis")["command"] == ["sh", "/etc/redis-ha/node.sh", "/etc/redis/redis.conf"]
    assert container("sentinel")["command"] == ["sh", "/etc/redis-ha/sentinel.sh"]
    for name in ("exporter", "sentinel-exporter"):
        assert container(name)["image"].startswith("oliver006/redis_exporter:v"), name
    required = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    labels = pod.get("metadata", spec["template"]["metadata"])["labels"]
    assert any(
        t["topologyKey"] == "kubernetes.io/hostname"
        and t["labelSelector"]["matchLabels"].items() <= labels.items()
        for t in required
    )
    # Persistence: each pod its volume, the base's redis.conf (AOF) kept.
    assert [t["metadata"]["name"] for t in spec["volumeClaimTemplates"]] == ["data"]
    config = next(v for k, v in _maps().items() if k == "redis-config")["redis.conf"]
    assert "appendonly yes" in config.splitlines()
    # The governing Service is headless and published before ready (names resolve at start).
    headless = next(d for d in by_kind(docs(), "Service") if d["metadata"]["name"] == spec["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert {p["port"] for p in headless["spec"]["ports"]} == {6379, 26379}
    # No Service that would send a client to any node, primary or not.
    assert "redis" not in {d["metadata"]["name"] for d in by_kind(docs(), "Service")}
    pdbs = [
        p
        for p in by_kind(docs(), "PodDisruptionBudget")
        if p["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ]
    assert [p["spec"].get("maxUnavailable") for p in pdbs] == [1]


def _maps() -> dict[str, dict[str, str]]:
    out = {}
    for doc in by_kind(docs(), "ConfigMap"):
        name = re.sub(r"-[a-z0-9]{10}$", "", doc["metadata"]["name"])
        out[name] = doc.get("data") or {}
    return out


def test_scripts_are_the_shipped_files() -> None:
    shipped = {p.name: p.read_text(encoding="utf-8") for p in HA_DIR.iterdir() if p.suffix in {".sh", ".acl"}}
    assert _maps()["redis-ha"] == shipped
    volume = next(v for v in redis_set()["spec"]["template"]["spec"]["volumes"] if v["name"] == "ha")
    # record-primary.sh is run by the sentinel itself (client-reconfig-script): executable.
    assert volume["configMap"]["defaultMode"] == 0o555


def test_secrets_are_referenced_never_inlined() -> None:
    rendered = docs()
    assert not by_kind(rendered, "Secret")
    for name in ("redis", "sentinel", "exporter", "sentinel-exporter"):
        entries = container(name).get("env") or []
        for entry in entries:
            if "PASSWORD" in entry["name"]:
                ref = entry["valueFrom"]["secretKeyRef"]
                assert ref["name"] == "llmesh-redis-passwords", (name, entry)
        for source in container(name).get("envFrom") or []:
            assert source["secretRef"]["name"] == "llmesh-redis-passwords"
    for name, data in _maps().items():
        for key, text in data.items():
            assert not re.search(r"(requirepass|masterauth|auth-pass|>)\s*[A-Za-z0-9]{16,}", text), (
                name,
                key,
            )
    # Every ACL user the replicated Redis adds has its password variable, as acl.sh wants.
    users = {
        line.split()[1]
        for line in (HA_DIR / "ha-users.acl").read_text(encoding="utf-8").splitlines()
        if line.startswith("user ")
    }
    assert users == HA_USERS
    header = (COMPONENT / "kustomization.yaml").read_text(encoding="utf-8")
    for user in users:
        assert f"REDIS_PASSWORD_{user.upper()}" in header
    assert "REDIS_SENTINEL_PASSWORD" in header


def test_acl_files_render_and_load(tmp_path: Path) -> None:
    """users.acl and ha-users.acl through acl.sh, loaded by a real redis-server (ACL syntax and
    command names checked by Redis itself)."""
    env = {
        f"REDIS_PASSWORD_{u}": f"test-password-of-{u.lower()}"
        for u in ("GATEWAY", "POLICY", "EMBEDDINGS", "CACHE")
    }
    env |= {f"REDIS_PASSWORD_{u.upper()}": f"test-password-of-{u}" for u in HA_USERS}
    parts = []
    for rules in (REDIS_DIR / "users.acl", HA_DIR / "ha-users.acl"):
        out = tmp_path / f"{rules.name}.rendered"
        done = subprocess.run(
            ["sh", str(REDIS_DIR / "acl.sh"), str(rules), str(out)],
            env={"PATH": "/usr/bin:/bin", **env},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        parts.append(out.read_text(encoding="utf-8"))
    acl = tmp_path / "users.acl"
    acl.write_text("".join(parts), encoding="utf-8")
    # A real server loads them (it refuses to start on a bad ACL line), and each HA user can
    # run what its role needs.
    server = ChildProcess(
        ["redis-server", "--port", "16415", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path), "--aclfile", str(acl)],
    )  # fmt: skip
    with server:
        server.wait_for(lambda line: True if "Ready to accept connections" in line else None, 20)
        for user, command in (("failover", "ROLE"), ("exporter", "INFO"), ("replica", "PING")):
            with redis.Redis(
                port=16415, username=user, password=f"test-password-of-{user}", socket_timeout=5
            ) as client:
                assert client.execute_command(command), (user, command)
        exporter = redis.Redis(port=16415, username="exporter", password="test-password-of-exporter")
        with exporter, pytest.raises(redis.exceptions.NoPermissionError):
            exporter.get("llmesh:policy:tenants")


def test_every_service_finds_the_primary_through_the_sentinels() -> None:
    rendered = docs()
    redis = redis_set()
    service_name = redis["spec"]["serviceName"]
    sentinel_port = next(
        p["containerPort"] for p in container("sentinel")["ports"] if p["name"] == "sentinel"
    )
    expected_hosts = ",".join(
        f"redis-{i}.{service_name}:{sentinel_port}" for i in range(redis["spec"]["replicas"])
    )
    assert expected_hosts == SENTINELS
    seen = set()
    for workload in rendered:
        if workload["kind"] not in {"Deployment", "StatefulSet"} or not (service := service_of(workload)):
            continue
        env = _env(workload, rendered)
        if "REDIS_URL" not in env:
            continue
        seen.add(service)
        url = env["REDIS_URL"]
        # redis+sentinel://<user>:<password>@<sentinels>/<master>/<db> (services/runtime/redis_client.py)
        assert url == f"redis+sentinel://{service}:$(REDIS_PASSWORD)@{expected_hosts}/llmesh/0", url
        names = [e["name"] for e in next(containers(workload))["env"]]
        assert names.index("REDIS_PASSWORD") < names.index("REDIS_URL"), "REDIS_URL expands REDIS_PASSWORD"
        ref = next(e for e in next(containers(workload))["env"] if e["name"] == "REDIS_SENTINEL_PASSWORD")
        assert ref["valueFrom"]["secretKeyRef"] == {
            "name": "llmesh-redis-passwords",
            "key": "REDIS_SENTINEL_PASSWORD",
        }
    assert seen == SERVICES_WITH_REDIS
    # The name the sentinels monitor (sentinel.sh, node.sh default) is the URL's.
    for script in ("node.sh", "sentinel.sh"):
        assert "name=${REDIS_HA_MASTER_NAME:-llmesh}" in (HA_DIR / script).read_text(encoding="utf-8")
    assert all(e["name"] != "REDIS_HA_MASTER_NAME" for e in container("redis")["env"])


def test_acknowledged_writes_need_a_replica() -> None:
    node = (HA_DIR / "node.sh").read_text(encoding="utf-8")
    assert "printf 'min-replicas-to-write %s\\n' \"${REDIS_HA_MIN_REPLICAS:-1}\"" in node
    for name in ("redis", "sentinel"):
        assert all(e["name"] != "REDIS_HA_MIN_REPLICAS" for e in container(name)["env"])


def test_exporters_are_scraped_and_reachable() -> None:
    rendered = docs()
    monitor = next(d for d in by_kind(rendered, "PodMonitor") if d["metadata"]["name"] == "llmesh-redis")
    labels = redis_set()["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"]: p["containerPort"] for c in containers(redis_set()) for p in c.get("ports", [])}
    jobs = {}
    for endpoint in monitor["spec"]["podMetricsEndpoints"]:
        assert endpoint["port"] in ports
        job = next(r["replacement"] for r in endpoint["relabelings"] if r["targetLabel"] == "job")
        jobs[job] = ports[endpoint["port"]]
    assert jobs == {"redis": 9121, "redis-sentinel": 9355}
    alerts = yaml.safe_load((REDIS_DIR / "alerts.yml").read_text(encoding="utf-8"))
    for group in alerts["groups"]:
        for rule in group["rules"]:
            selected = set(re.findall(r'job="([^"]+)"', rule["expr"]))
            assert selected and selected <= set(jobs), rule["alert"]
    policy = next(p for p in by_kind(rendered, "NetworkPolicy") if p["metadata"]["name"] == "redis")
    opened = {
        (p["port"], str(f.get("namespaceSelector", f.get("podSelector"))))
        for rule in policy["spec"]["ingress"]
        for f in rule["from"]
        for p in rule["ports"]
    }
    assert {port for port, _ in opened} == {6379, 26379, 9121, 9355}
    monitoring = str({"matchLabels": {"llmesh.dev/monitoring": "true"}})
    assert (9121, monitoring) in opened and (9355, monitoring) in opened


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("promtool"), *args], cwd=REDIS_DIR, capture_output=True, text=True, timeout=120, check=False
    )


def test_alerts_load_and_pass_their_tests() -> None:
    checked = promtool("check", "rules", "alerts.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", "alerts.test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    alerts = yaml.safe_load((REDIS_DIR / "alerts.yml").read_text(encoding="utf-8"))
    names = {r["alert"] for g in alerts["groups"] for r in g["rules"]}
    cases = yaml.safe_load((REDIS_DIR / "alerts.test.yml").read_text(encoding="utf-8"))
    fired = {t["alertname"] for case in cases["tests"] for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert fired == names, names - fired
    # What issue 18 asks to be alerted on.
    assert {
        "RedisPrimaryDown",
        "RedisNoReplicaConnected",
        "RedisReplicationLag",
        "RedisSentinelNoQuorum",
        "RedisMemoryNearLimit",
        "RedisRejectedConnections",
        "RedisPersistenceFailing",
    } <= names
    rule = next(d for d in by_kind(docs(), "PrometheusRule") if d["metadata"]["name"] == "llmesh-redis")
    assert rule["spec"]["groups"] == alerts["groups"]
    runbook = RUNBOOK.read_text(encoding="utf-8")
    headings = {
        re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", runbook, re.M)
    }
    for group in alerts["groups"]:
        for r in group["rules"]:
            anchor = r["annotations"]["runbook"].partition("#")[2]
            assert anchor in headings, f"{r['alert']}: no section #{anchor} in RUNBOOK.md"


def test_runbook_covers_the_operations() -> None:
    runbook = RUNBOOK.read_text(encoding="utf-8").lower()
    for topic in ("backup", "restore", "failover drill", "replacing a node", "re-forming the redis cluster"):
        assert f"## {topic}" in runbook or f"### {topic}" in runbook, topic


def ha_config() -> dict[str, Any]:
    proc = compose.compose("-f", HA_COMPOSE.name, "config", secrets=compose.SECRETS | HA_SECRETS)
    assert proc.returncode == 0, proc.stderr
    assert not proc.stderr.strip(), proc.stderr
    document = yaml.safe_load(proc.stdout)
    assert isinstance(document, dict)
    return document


HA_SECRETS = {
    "REDIS_PASSWORD_REPLICA": "test-password-of-replica",
    "REDIS_PASSWORD_FAILOVER": "test-password-of-failover",
    "REDIS_PASSWORD_EXPORTER": "test-password-of-exporter",
    "REDIS_SENTINEL_PASSWORD": "test-password-of-sentinels",
}


def test_compose_variant_runs_a_primary_a_replica_and_three_sentinels() -> None:
    config = ha_config()
    services = config["services"]
    sentinels = sorted(n for n in services if n.startswith("redis-sentinel-"))
    assert sentinels == ["redis-sentinel-1", "redis-sentinel-2", "redis-sentinel-3"]
    assert {"redis", "redis-replica"} <= set(services)
    for name in ("redis", "redis-replica", *sentinels):
        service = services[name]
        mounted = compose.mounts(service)
        sources = {Path(s).resolve() for s in mounted.values() if s.startswith("/")}
        assert (HA_DIR / ("sentinel.sh" if name in sentinels else "node.sh")).resolve() in sources, name
        assert service["healthcheck"]["test"], name
    hosts = ",".join(f"{s}:26379" for s in sentinels)
    for name in SERVICES_WITH_REDIS:
        env = services[name]["environment"]
        assert env["REDIS_URL"].startswith(f"redis+sentinel://{name}:"), name
        assert env["REDIS_URL"].endswith(f"@{hosts}/llmesh/0"), name
        assert env["REDIS_SENTINEL_PASSWORD"] == HA_SECRETS["REDIS_SENTINEL_PASSWORD"]
        for sentinel in sentinels:
            assert services[name]["depends_on"][sentinel]["condition"] == "service_healthy", name
    # Without the passwords, compose names the variable to set.
    missing = compose.compose("-f", HA_COMPOSE.name, "config", "-q")
    assert missing.returncode != 0
    assert "REDIS_SENTINEL_PASSWORD" in missing.stderr or "REDIS_PASSWORD_" in missing.stderr


def test_scripts_pass_shellcheck() -> None:
    scripts = sorted(str(p) for p in REDIS_DIR.rglob("*.sh"))
    assert len(scripts) >= 6, scripts
    proc = subprocess.run(
        [tool("shellcheck"), *scripts], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
