"""The mesh the reliability tests attack: cache, policy and embeddings as their own processes,
the session's inference engine, and a gateway process with two tenants in front of them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.auth import hash_key
from services.runtime.cli import catalog
from tests.fixtures.otlp import Collector, collector_fixture, exporter_env
from tests.fixtures.ports import free_port
from tests.fixtures.processes import ServiceProcess, service_env

KEYS = {"alpha": "sk-rel-alpha", "beta": "sk-rel-beta", "gamma": "sk-rel-gamma"}
# gamma has a tiny request rate: the rate-limit isolation case exhausts it.
GAMMA_RPM = 2
MODULES = {
    "cache": ("cache", "LLMESH_CACHE_"),
    "policy": ("policy", "LLMESH_POLICY_"),
    "embeddings": ("services.embeddings", "LLMESH_EMBEDDINGS_"),
}


@dataclass
class Gateway:
    process: ServiceProcess
    url: str
    log_path: Path

    @property
    def grpc_address(self) -> str:
        return self.process.address


@pytest.fixture(scope="session")
def otlp() -> Iterator[Collector]:
    """An OTLP receiver every process of this mesh exports its spans to."""
    yield from collector_fixture()


@pytest.fixture(scope="session")
def service_processes(redis_url: str, otlp: Collector) -> Iterator[dict[str, ServiceProcess]]:
    started: dict[str, ServiceProcess] = {}
    try:
        for name, (module, prefix) in MODULES.items():
            spec = catalog.service(name)
            if spec is not None:
                env = service_env(prefix, REDIS_URL=redis_url, **exporter_env(otlp))
                started[name] = ServiceProcess(module, env, ready_timeout_s=spec.start_timeout_s)
        yield started
    finally:
        for proc in started.values():
            proc.close()


@pytest.fixture(scope="session")
def gateway(
    service_processes: dict[str, ServiceProcess],
    inference_address: str,
    redis_url: str,
    otlp: Collector,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Gateway]:
    if catalog.service("gateway") is None or len(service_processes) < len(MODULES):
        pytest.skip("needs the gateway, cache, policy and embeddings services")
    http_port = free_port()
    env = service_env(
        "LLMESH_GATEWAY_",
        REDIS_URL=redis_url,
        LLMESH_GATEWAY_HTTP_PORT=str(http_port),
        LLMESH_GATEWAY_INFERENCE_ADDRESSES=inference_address,
        LLMESH_GATEWAY_CACHE_ADDRESS=service_processes["cache"].address,
        LLMESH_GATEWAY_POLICY_ADDRESS=service_processes["policy"].address,
        LLMESH_GATEWAY_EMBEDDINGS_ADDRESS=service_processes["embeddings"].address,
        LLMESH_GATEWAY_API_KEYS=json.dumps({hash_key(key): tenant for tenant, key in KEYS.items()}),
        **exporter_env(otlp),
        LLMESH_GATEWAY_TENANTS=json.dumps(
            {"alpha": {}, "beta": {}, "gamma": {"requests_per_minute": GAMMA_RPM}}
        ),
    )
    log_path = tmp_path_factory.mktemp("gateway") / "gateway.log"
    proc = ServiceProcess("gateway", env, log_path=log_path)
    try:
        yield Gateway(proc, f"http://127.0.0.1:{http_port}", log_path)
    finally:
        proc.close()
