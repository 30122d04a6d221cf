"""`llmesh doctor` and `llmesh up`'s checks through the real command: FAIL with the fix, exit code 1."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.runtime.cli import catalog
from tests.fixtures.ports import free_port, free_port_offset
from tests.fixtures.processes import ROOT

CLI = [sys.executable, "-m", "services.runtime.cli.main"]


def _port_of(service: str) -> int:
    spec = catalog.service(service)
    assert spec is not None
    return spec.port


@pytest.fixture
def taken_port() -> Iterator[int]:
    """The policy service's gRPC port at an offset whose every port was free (outside the
    ephemeral range, where an outgoing connection may hold its metrics port), listened on here."""
    port = _port_of("policy") + free_port_offset(["policy"])
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        yield port


@pytest.fixture
def env(tmp_path: Path, redis_url: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("LLMESH_")}
    return {**base, "LLMESH_DATA_DIR": str(tmp_path), "REDIS_URL": redis_url, "PYTHONPATH": str(ROOT)}


def llmesh(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_doctor_fails_on_a_taken_port_with_the_fix(taken_port: int, env: dict[str, str]) -> None:
    offset = str(taken_port - _port_of("policy"))
    done = llmesh(["doctor", "--only", "policy", "--port-offset", offset], env)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    failed = [line for line in lines if line.startswith("FAIL")]
    assert failed == [f"FAIL  ports     127.0.0.1:{taken_port} (policy gRPC) is taken"], done.stdout
    fix = lines[lines.index(failed[0]) + 1].strip()
    assert fix == (
        f"fix: stop what listens there (ss -ltnp 'sport = :{taken_port}'), or move every port: "
        f"--port-offset N (now {offset})"
    )
    assert lines[-1].endswith("1 failures")


def test_up_stops_at_the_failed_check_before_starting_anything(
    taken_port: int, env: dict[str, str], tmp_path: Path
) -> None:
    offset = str(taken_port - _port_of("policy"))
    done = llmesh(["up", "--only", "policy", "--port-offset", offset], env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"llmesh up: ports check failed: 127.0.0.1:{taken_port} (policy gRPC) is taken" in done.stderr
    assert "  fix: stop what listens there" in done.stderr
    assert not (tmp_path / "run" / "logs").exists(), "up started something"


def test_doctor_fails_on_a_stopped_redis_and_a_missing_model(env: dict[str, str], tmp_path: Path) -> None:
    env["REDIS_URL"] = f"redis://127.0.0.1:{free_port()}/11"
    env["PATH"] = str(tmp_path)  # no redis-server for `llmesh up` to start
    env["LLMESH_INFERENCE_MODEL"] = str(tmp_path / "no-such-model")
    offset = str(free_port() - _port_of("inference"))
    done = llmesh(["doctor", "--only", "inference", "--port-offset", offset], env)
    assert done.returncode == 1, done.stdout + done.stderr
    failed = {line.split()[1] for line in done.stdout.splitlines() if line.startswith("FAIL")}
    assert failed == {"redis", "model"}, done.stdout
    assert "fix: install redis-server (llmesh up then starts it), or set REDIS_URL" in done.stdout
    assert f"model directory {tmp_path / 'no-such-model'} does not exist" in done.stdout
