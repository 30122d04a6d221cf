"""A real service process with ``quic_port`` set serves gRPC through its QUIC endpoint."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.runtime import certs
from services.runtime.quic import QuicSettings, get_client_endpoint
from tests.fixtures.ports import free_port
from tests.fixtures.processes import ServiceProcess


@pytest.fixture
def cert_dir(tmp_path: Path) -> Path:
    """What `llmesh certs create` writes into <data_dir>/certs (the service is named "service")."""
    certs.cli(["create", "--dir", str(tmp_path / "certs"), "--service", "service", "--service", "gateway"])
    return tmp_path / "certs"


@pytest.fixture
def service(cert_dir: Path) -> Iterator[tuple[ServiceProcess, int]]:
    port = free_port(socket.SOCK_DGRAM)
    # The service finds its certificate by its name under LLMESH_DATA_DIR, as in a deployment.
    env = {"LLMESH_QUIC_PORT": str(port), "LLMESH_DATA_DIR": str(cert_dir.parent)}
    svc = ServiceProcess("tests.integration.runtime.chain", env=env)
    yield svc, port
    svc.close()


async def test_service_answers_health_over_quic(service: tuple[ServiceProcess, int], cert_dir: Path) -> None:
    _, port = service
    endpoint = await get_client_endpoint(
        f"quic://127.0.0.1:{port}?server_name=service",
        QuicSettings(
            ca_file=str(cert_dir / "ca.pem"),
            cert_file=str(cert_dir / "gateway.pem"),
            key_file=str(cert_dir / "gateway.key"),
        ),
    )
    try:
        async with grpc.aio.insecure_channel(endpoint.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            reply = await asyncio.wait_for(stub.Check(health_pb2.HealthCheckRequest()), 20)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await endpoint.close()
