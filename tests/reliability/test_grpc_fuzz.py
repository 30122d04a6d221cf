"""Hypothesis-generated and byte-mangled protobuf messages against every gRPC service.

Each service runs as its own process on real Redis (and the real models). Every
answer must be OK or a documented client-error status — never INTERNAL/UNKNOWN,
never a hang — and the service must still be alive and SERVING afterwards.
Examples per method: ``LLMESH_FUZZ_EXAMPLES`` (default 20, derandomized so CI is
repeatable; set ``LLMESH_FUZZ_RANDOM=1`` for fresh random runs).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llmesh.v1 import cache_pb2, embeddings_pb2, policy_pb2

from services.cli import catalog
from tests.fixtures.processes import ServiceProcess, service_env
from tests.reliability.protofuzz import ACCEPTABLE, call_raw, mangled, message_strategy

EXAMPLES = int(os.environ.get("LLMESH_FUZZ_EXAMPLES", "20"))
RANDOM = os.environ.get("LLMESH_FUZZ_RANDOM") == "1"
CALL_TIMEOUT_S = 10.0
METADATA = (("x-llmesh-tenant", "fuzz-tenant"), ("x-request-id", "fuzz"))

SERVICES = {
    "cache": (cache_pb2.DESCRIPTOR.services_by_name["ContextCacheService"], "cache", "LLMESH_CACHE_"),
    "policy": (policy_pb2.DESCRIPTOR.services_by_name["PolicyService"], "policy", "LLMESH_POLICY_"),
    "embeddings": (
        embeddings_pb2.DESCRIPTOR.services_by_name["EmbeddingService"],
        "services.embeddings",
        "LLMESH_EMBEDDINGS_",
    ),
}
CASES = [
    pytest.param(name, method.name, id=f"{name}.{method.name}")
    for name, (service, _module, _prefix) in SERVICES.items()
    for method in service.methods
]


@pytest.fixture(scope="module")
def processes(redis_url: str) -> Iterator[dict[str, ServiceProcess]]:
    started: dict[str, ServiceProcess] = {}
    try:
        for name, (_service, module, prefix) in SERVICES.items():
            if catalog.service(name) is None:
                continue
            started[name] = ServiceProcess(module, service_env(prefix, REDIS_URL=redis_url))
        yield started
    finally:
        for proc in started.values():
            proc.close()


def _payloads(data: st.DataObject, method: object) -> list[bytes]:
    descriptor = method.input_type  # type: ignore[attr-defined]
    one = st.one_of(message_strategy(descriptor).map(lambda m: m.SerializeToString()), mangled(descriptor))
    count = data.draw(st.integers(1, 4)) if method.client_streaming else 1  # type: ignore[attr-defined]
    return [data.draw(one) for _ in range(count)]


@pytest.mark.parametrize(("service_name", "method_name"), CASES)
def test_arbitrary_messages_get_a_clean_answer(
    processes: dict[str, ServiceProcess], service_name: str, method_name: str
) -> None:
    if service_name not in processes:
        pytest.skip(f"the {service_name} service is not in this tree")
    proc = processes[service_name]
    method = SERVICES[service_name][0].methods_by_name[method_name]
    bad: list[str] = []
    with grpc.insecure_channel(proc.address) as channel:

        @settings(
            max_examples=EXAMPLES,
            derandomize=not RANDOM,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(data=st.data())
        def run(data: st.DataObject) -> None:
            outcome = call_raw(
                channel, method, _payloads(data, method), timeout=CALL_TIMEOUT_S, metadata=METADATA
            )
            if outcome.code not in ACCEPTABLE:
                bad.append(f"{outcome.code.name} after {outcome.elapsed_s:.2f}s: {outcome.details[:200]}")
            assert outcome.code in ACCEPTABLE, bad[-1]

        run()
    assert proc.alive(), f"{service_name} died"


@pytest.mark.parametrize("service_name", list(SERVICES))
def test_service_still_serving_after_fuzzing(processes: dict[str, ServiceProcess], service_name: str) -> None:
    if service_name not in processes:
        pytest.skip(f"the {service_name} service is not in this tree")
    proc = processes[service_name]
    assert proc.alive()
    with grpc.insecure_channel(proc.address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
