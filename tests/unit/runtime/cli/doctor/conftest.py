"""The doctor tests' settings: none of the machine's own, and a port the test holds."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _plain_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """No YAML file and no inference overrides of the machine running the tests."""
    monkeypatch.delenv("LLMESH_CONFIG", raising=False)
    for name in ("MODEL", "MALLOC", "KV_CACHE_SPACE_GIB", "OMP_THREADS_BIND", "TENSOR_PARALLEL_SIZE"):
        monkeypatch.delenv(f"LLMESH_INFERENCE_{name}", raising=False)
    monkeypatch.delenv("LLMESH_POLICY_METRICS_PORT", raising=False)


@pytest.fixture
def listener() -> Iterator[int]:
    """A loopback port this test holds, listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]
