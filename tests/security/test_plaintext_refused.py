"""Without TLS nobody is authenticated: a service serves plaintext gRPC on loopback only."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.runtime import certs
from tests.fixtures.processes import ServiceProcess, service_env


def _cache_env(**extra: str) -> dict[str, str]:
    return service_env("LLMESH_CACHE_", LLMESH_CACHE_HOST="0.0.0.0", **extra)


def test_plaintext_beyond_loopback_refuses_to_start() -> None:
    with pytest.raises(RuntimeError) as refused:
        ServiceProcess("cache", _cache_env()).close()
    message = str(refused.value)
    assert "exit code 1" in message, message
    assert "refusing plaintext gRPC on '0.0.0.0'" in message and "LLMESH_TLS_CERT_FILE" in message


def test_mutual_tls_beyond_loopback_starts(tmp_path: Path) -> None:
    certs.create_ca(tmp_path)
    issued = certs.issue(tmp_path, "cache")
    env = _cache_env(
        LLMESH_TLS_CERT_FILE=str(issued.cert),
        LLMESH_TLS_KEY_FILE=str(issued.key),
        LLMESH_TLS_CA_FILE=str(tmp_path / "ca.pem"),
    )
    with ServiceProcess("cache", env) as cache:
        assert cache.alive()
        assert cache.stop() == 0


def test_plaintext_beyond_loopback_starts_when_the_operator_says_so() -> None:
    with ServiceProcess("cache", _cache_env(LLMESH_TLS_ALLOW_PLAINTEXT="true")) as cache:
        assert cache.alive()
        assert cache.stop() == 0


def test_plaintext_on_loopback_starts() -> None:
    with ServiceProcess("cache", service_env("LLMESH_CACHE_")) as cache:
        assert cache.alive()
        assert cache.stop() == 0
