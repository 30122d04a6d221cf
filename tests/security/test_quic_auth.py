"""The cross-zone QUIC endpoint requires a client certificate of the mesh's CA, and the gRPC server
behind it authorises the QUIC client's identity (not the endpoint's loopback connection).

Real aioquic endpoints in front of a real gRPC InferenceService server (the runtime's server with
its interceptors; a fake engine behind it), certificates from ``llmesh certs create``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from llmesh.v1 import inference_pb2, inference_pb2_grpc

from services.runtime import certs
from services.runtime.quic import (
    QuicHandshakeError,
    QuicSettings,
    ServerEndpoint,
    get_client_endpoint,
    start_server_endpoint,
)
from services.runtime.server import RunningServer
from tests.fixtures.fake_inference import FakeInference, start_fake

REQUEST = inference_pb2.GenerateRequest(prompt="hello", sampling={"max_tokens": 2})


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    assert certs.cli(["create", "--dir", str(directory)]) == 0
    return directory


def settings(pki: Path, identity: str | None, ca: Path | None = None) -> QuicSettings:
    """A QUIC client (or, with "inference", the server) presenting ``identity``'s certificate."""
    values = {"ca_file": str(ca or pki / "ca.pem"), "connect_timeout_s": 5.0}
    if identity is None:
        values["cert_file"] = values["key_file"] = ""
        values["cert_name"] = "nobody"  # no such files: no client certificate
    else:
        values["cert_file"] = str(pki / f"{identity}.pem")
        values["key_file"] = str(pki / f"{identity}.key")
    return QuicSettings.model_validate(values)


@pytest.fixture
async def upstream(pki: Path) -> AsyncIterator[tuple[FakeInference, RunningServer, ServerEndpoint]]:
    fake = FakeInference()
    grpc_server = await start_fake(fake)  # plaintext gRPC on loopback, as the tunnel's target
    endpoint = await start_server_endpoint(grpc_server.address, "127.0.0.1:0", settings(pki, "inference"))
    try:
        yield fake, grpc_server, endpoint
    finally:
        await endpoint.close()
        await grpc_server.stop(0)


def url(endpoint: ServerEndpoint) -> str:
    return f"quic://127.0.0.1:{endpoint.port}?server_name=inference"


async def test_client_without_certificate_is_refused(
    upstream: tuple[FakeInference, RunningServer, ServerEndpoint], pki: Path, tmp_path: Path
) -> None:
    fake, _, endpoint = upstream
    with pytest.raises(QuicHandshakeError, match=r"refused this client's certificate.*certificate required"):
        await get_client_endpoint(url(endpoint), settings(pki, None))
    other = tmp_path / "other"
    certs.cli(["create", "--dir", str(other), "--service", "gateway"])
    foreign = QuicSettings.model_validate(
        {
            "ca_file": str(pki / "ca.pem"),  # trusts the server, but its own CA is not the mesh's
            "cert_file": str(other / "gateway.pem"),
            "key_file": str(other / "gateway.key"),
        }
    )
    with pytest.raises(QuicHandshakeError, match="refused this client's certificate"):
        await get_client_endpoint(url(endpoint), foreign)
    assert fake.calls == []


@pytest.mark.parametrize(("identity", "allowed"), [("cache", False), ("gateway", True)])
async def test_the_quic_clients_identity_is_what_is_authorised(
    upstream: tuple[FakeInference, RunningServer, ServerEndpoint], pki: Path, identity: str, allowed: bool
) -> None:
    fake, grpc_server, endpoint = upstream
    client = await get_client_endpoint(url(endpoint), settings(pki, identity))
    try:
        async with grpc.aio.insecure_channel(client.address) as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            if allowed:
                assert (await stub.Generate(REQUEST, timeout=10)).choices
                assert len(fake.calls) == 1
            else:
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.Generate(REQUEST, timeout=10)
                assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert f"identity {identity!r} may not call /llmesh.v1.InferenceService/Generate" in (
                    caught.value.details() or ""
                )
                assert fake.calls == []
    finally:
        await client.close()
    # The same server, dialled directly on plaintext loopback (llmesh up), has no identity to check.
    async with grpc.aio.insecure_channel(grpc_server.address) as channel:
        assert (await inference_pb2_grpc.InferenceServiceStub(channel).Generate(REQUEST, timeout=10)).choices
