"""`llmesh doctor`'s Redis and port checks, against a real Redis and real sockets."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from services.runtime.cli import catalog
from services.runtime.cli.doctor import mesh
from services.runtime.cli.doctor.report import Status, Target
from tests.fixtures.ports import free_port


def _policy_port() -> int:
    policy = catalog.service("policy")
    assert policy is not None
    return policy.port


POLICY_PORT = _policy_port()


def test_a_running_redis_passes_with_its_version(monkeypatch: pytest.MonkeyPatch, redis_url: str) -> None:
    monkeypatch.setenv("REDIS_URL", redis_url)
    result = mesh.check_redis(Target())
    assert result.status is Status.OK, result
    assert result.detail.startswith("Redis ") and redis_url in result.detail


def test_a_stopped_redis_fails_when_up_could_not_start_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url = f"redis://127.0.0.1:{free_port()}/11"
    monkeypatch.setenv("REDIS_URL", url)
    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server
    result = mesh.check_redis(Target())
    assert result.status is Status.FAIL
    assert result.detail.startswith(f"Redis does not answer at {url}")
    assert result.fix == "install redis-server (llmesh up then starts it), or set REDIS_URL"


def test_a_stopped_remote_redis_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    # 127.0.0.2 is loopback, but not a host `llmesh up` starts Redis for.
    url = f"redis://127.0.0.2:{free_port()}/11"
    monkeypatch.setenv("REDIS_URL", url)
    result = mesh.check_redis(Target())
    assert result.status is Status.FAIL
    assert "does not answer" in result.detail


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server installed")
def test_a_stopped_local_redis_is_a_warning_when_up_starts_one(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    monkeypatch.setenv("REDIS_URL", f"redis://127.0.0.1:{port}/11")
    result = mesh.check_redis(Target())
    assert result.status is Status.WARN
    assert "llmesh up starts" in result.detail and f"on port {port}" in result.detail


def test_a_port_that_does_not_speak_redis_fails(monkeypatch: pytest.MonkeyPatch, listener: int) -> None:
    monkeypatch.setenv("REDIS_URL", f"redis://127.0.0.1:{listener}/11")
    result = mesh.check_redis(Target())
    assert result.status is Status.FAIL
    assert f"something listens at 127.0.0.1:{listener} but does not answer as Redis" in result.detail
    assert f"port {listener}" in result.fix


def test_a_password_is_not_printed() -> None:
    assert mesh._redact("redis://user:s3cret@host:6379/0") == "redis://user:***@host:6379/0"


# -- ports ----------------------------------------------------------------------------------


def test_a_taken_port_fails_with_port_offset_as_the_fix(listener: int) -> None:
    result = mesh.check_ports(policy_at(listener))
    assert result.status is Status.FAIL
    assert result.detail == f"127.0.0.1:{listener} (policy gRPC) is taken"
    assert f"sport = :{listener}" in result.fix and "--port-offset N" in result.fix


def test_free_ports_pass_and_cover_metrics_and_http() -> None:
    result = mesh.check_ports(policy_at(free_port()))
    assert result.status is Status.OK, result
    planned = {what for what, _host, _port in mesh.planned_ports(Target(only=("policy", "gateway")))}
    assert planned == {"policy gRPC", "policy metrics", "gateway gRPC", "gateway metrics", "gateway HTTP"}


def test_one_metrics_port_for_two_instances_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMESH_POLICY_METRICS_PORT", str(free_port()))
    result = mesh.check_ports(Target(only=("policy",), instances={"policy": 2}))
    assert result.status is Status.FAIL
    assert "policy-1 metrics and policy-2 metrics" in result.detail


def test_a_host_of_another_machine_fails() -> None:
    result = mesh.check_ports(Target(only=("policy",), host="192.0.2.1"))  # TEST-NET-1
    assert result.status is Status.FAIL
    assert "is not an address of this machine" in result.detail


def policy_at(port: int) -> Target:
    """``llmesh up --only policy`` with the port offset that puts policy's gRPC port at ``port``."""
    return Target(only=("policy",), port_offset=port - POLICY_PORT)
