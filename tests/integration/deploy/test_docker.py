"""Dockerfiles: hadolint, an image per service from its extra, non-root, health-checked; the
health check itself.

No Docker engine runs here, so images are not built; what can be checked offline is.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from services.runtime.certs import create_ca, issue
from services.runtime.cli import catalog
from services.runtime.server import build_server
from services.runtime.settings import ServiceSettings
from tests.fixtures.processes import ROOT
from tests.fixtures.tools import tool
from tests.integration.deploy.dockerfiles import env_of, final_stage, instructions, stages
from tests.integration.deploy.envcheck import settings_errors, unknown_variables

DOCKER = ROOT / "deploy" / "docker"
HEALTHCHECK = DOCKER / "healthcheck.py"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
# gateway, policy, cache and embeddings: one target each; inference: a file per engine.
SERVICE_FILE = DOCKER / "service.Dockerfile"
ENGINES = ("cpu", "gpu")


def images() -> list[tuple[Path, str | None, str]]:
    """(Dockerfile, --target, llmesh service) of every image."""
    names = {s.name for s in catalog.SERVICES}
    targets = [t for t in stages(SERVICE_FILE) if t in names]
    out: list[tuple[Path, str | None, str]] = [(SERVICE_FILE, t, t) for t in targets]
    out += [(DOCKER / f"inference-{engine}.Dockerfile", None, "inference") for engine in ENGINES]
    return out


IMAGES = images()


def image_id(image: tuple[Path, str | None, str]) -> str:
    return f"{image[0].name}:{image[1]}" if image[1] else image[0].name


def extra_of(path: Path, service: str) -> str:
    """The pyproject.toml extra the image installs: the service's, the engine's for inference."""
    return path.name.removesuffix(".Dockerfile") if service == "inference" else service


def hadolint() -> str:
    return tool("hadolint")


def test_hadolint_clean() -> None:
    assert DOCKERFILES
    cmd = [hadolint(), "--config", str(DOCKER / "hadolint.yaml"), *map(str, DOCKERFILES)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_an_image_per_service() -> None:
    assert {service for _, _, service in IMAGES} == {s.name for s in catalog.SERVICES}
    # No Dockerfile beside these (a per-service file left behind would drift from its target).
    assert {p for p, _, _ in IMAGES} == set(DOCKERFILES)
    # Without --target Docker builds the last stage: it must stop, not build some service.
    last = list(stages(SERVICE_FILE).values())[-1]
    assert last[-1][0] == "RUN" and last[-1][1].endswith("exit 1")


@pytest.mark.parametrize("image", IMAGES, ids=image_id)
def test_image_installs_its_extra(image: tuple[Path, str | None, str]) -> None:
    path, target, service = image
    with (ROOT / "pyproject.toml").open("rb") as fh:
        extras = tomllib.load(fh)["project"]["optional-dependencies"]
    extra = extra_of(path, service)
    assert extra in extras
    # The venv the image copies comes from the stage that installs the project with that extra.
    copies = [args.split() for kw, args in final_stage(path, target) if kw == "COPY"]
    venv_from = next(words[0].removeprefix("--from=") for words in copies if words[-1] == "/opt/venv")
    installs = [args for kw, args in final_stage(path, venv_from) if kw == "RUN" and "pip install" in args]
    assert len(installs) == 1 and f'".[{extra}]"' in installs[0], installs


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_no_package_index_url(path: Path) -> None:
    """Index URLs (the CPU torch wheels) are build arguments, never written into the file."""
    for keyword, args in instructions(path):
        if keyword != "LABEL":
            assert "://" not in args, f"{keyword} {args}"


@pytest.mark.parametrize("image", IMAGES, ids=image_id)
def test_runtime_stage(image: tuple[Path, str | None, str]) -> None:
    path, target, name = image
    spec = next(s for s in catalog.SERVICES if s.name == name)
    steps = instructions(path)
    assert sum(1 for kw, _ in steps if kw == "FROM") >= 2, "multi-stage: build tools stay out of the image"
    stage = final_stage(path, target)
    assert not any("pip install" in args for kw, args in stage if kw == "RUN"), "installs in a build stage"
    keywords = [kw for kw, _ in stage]
    user = [args for kw, args in stage if kw == "USER"]
    assert user and not user[-1].startswith(("0", "root")), "runs as a non-root user"
    assert keywords.index("USER") > max(i for i, kw in enumerate(keywords) if kw == "RUN")
    entrypoint = next(args for kw, args in stage if kw == "ENTRYPOINT")
    assert entrypoint == f'["llmesh", "serve", "{name}"]'
    health = next(args for kw, args in stage if kw == "HEALTHCHECK")
    assert f'"/opt/llmesh/healthcheck.py", "{name}"' in health
    env = env_of(stage)
    prefix = spec.env_prefix
    # Listens on all interfaces, on the catalog's port, metrics on port + 1000 (Prometheus config).
    assert env[f"{prefix}HOST"] == "0.0.0.0"
    assert int(env[f"{prefix}PORT"]) == spec.port
    assert int(env[f"{prefix}METRICS_PORT"]) == spec.port + 1000
    exposed = {int(p) for kw, args in stage if kw == "EXPOSE" for p in args.split()}
    assert {spec.port, spec.port + 1000} <= exposed
    assert not unknown_variables(env) and not settings_errors(env)
    # Read-only root filesystem: every cache and home directory points at /tmp.
    assert env["HOME"] == "/tmp" and env["PYTHONDONTWRITEBYTECODE"] == "1"
    if name == "inference":
        assert env["LLMESH_INFERENCE_MODEL"].startswith("/opt/llmesh/models/")
        build = " ".join(args for kw, args in steps if kw == "RUN")
        assert "llmesh model prepare" in build, "the default model is prepared at build time"


def test_dockerignore_keeps_what_the_build_needs() -> None:
    ignored = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    assert "!deploy/docker/healthcheck.py" in ignored
    for needed in ("pyproject.toml", "README.md", "protos", "services"):
        assert needed not in ignored


async def _healthcheck(target: str, *flags: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(HEALTHCHECK),
        target,
        *flags,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    return int(proc.returncode or 0), out.decode()


async def test_healthcheck_follows_serving_state() -> None:
    server = await build_server(ServiceSettings(host="127.0.0.1", port=0), [])
    try:
        code, out = await _healthcheck(server.address)
        assert (code, out.split()[-1]) == (0, "SERVING")
        # Draining (SIGTERM) turns health NOT_SERVING: the container must turn unhealthy.
        await server.set_serving(False)
        code, out = await _healthcheck(server.address)
        assert (code, out.split()[-1]) == (1, "NOT_SERVING")
        # The liveness probe's check: the process still answers, so no restart.
        code, out = await _healthcheck(server.address, "--liveness")
        assert (code, out.split()[-1]) == (0, "SERVING"), out
    finally:
        await server.stop(0)
    code, out = await _healthcheck(server.address)
    assert (code, out.split()[-1]) == (1, "UNAVAILABLE")
    code, out = await _healthcheck(server.address, "--liveness")
    assert (code, out.split()[-1]) == (1, "UNAVAILABLE")


async def test_healthcheck_reads_the_service_port_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    server = await build_server(ServiceSettings(host="127.0.0.1", port=0), [])
    try:
        monkeypatch.setenv("LLMESH_CACHE_PORT", str(server.port))
        code, out = await _healthcheck("cache")
        assert code == 0, out
        assert out.split()[0] == server.address
    finally:
        await server.stop(0)


async def test_healthcheck_speaks_mutual_tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With LLMESH_TLS_* set (every deployment), the server requires a client certificate: the
    health check presents the container's own and still tells SERVING from NOT_SERVING."""
    create_ca(tmp_path)
    issue(tmp_path, "policy")
    tls = {
        "LLMESH_TLS_CERT_FILE": str(tmp_path / "policy.pem"),
        "LLMESH_TLS_KEY_FILE": str(tmp_path / "policy.key"),
        "LLMESH_TLS_CA_FILE": str(tmp_path / "ca.pem"),
    }
    for name, value in tls.items():
        monkeypatch.setenv(name, value)
    server = await build_server(ServiceSettings(host="127.0.0.1", port=0), [])
    try:
        code, out = await _healthcheck(server.address)
        assert (code, out.split()[-1]) == (0, "SERVING"), out
        await server.set_serving(False)
        code, out = await _healthcheck(server.address)
        assert (code, out.split()[-1]) == (1, "NOT_SERVING"), out
        # Without a certificate the handshake fails: unhealthy, never a false SERVING.
        for name in tls:
            monkeypatch.delenv(name)
        code, out = await _healthcheck(server.address)
        assert code == 1 and out.split()[-1] != "SERVING", out
        # Certificate files that cannot be read: unhealthy, and the message names the setting.
        monkeypatch.setenv("LLMESH_TLS_CERT_FILE", str(tmp_path / "missing.pem"))
        monkeypatch.setenv("LLMESH_TLS_KEY_FILE", str(tmp_path / "policy.key"))
        monkeypatch.setenv("LLMESH_TLS_CA_FILE", str(tmp_path / "ca.pem"))
        code, out = await _healthcheck(server.address)
        assert code == 1 and "LLMESH_TLS_CERT_FILE" in out, out
    finally:
        await server.stop(0)
