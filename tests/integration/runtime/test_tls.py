"""Mutual TLS between services: a caller without a valid certificate is refused."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from services.runtime import certs
from services.runtime.channels import connect
from services.runtime.server import RunningServer, build_server
from services.runtime.settings import ServiceSettings
from tests.integration.runtime.chain import CALL, ChainServicer


def _identity(b: bytes) -> bytes:
    return b


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    good = tmp_path_factory.mktemp("pki")
    certs.create_ca(good)
    service = certs.issue(good, "cache")
    client = certs.issue(good, "gateway")
    rogue = tmp_path_factory.mktemp("rogue")
    certs.create_ca(rogue)
    intruder = certs.issue(rogue, "gateway")
    return {
        "ca": good / "ca.pem",
        "cert": service.cert,
        "key": service.key,
        "client_cert": client.cert,
        "client_key": client.key,
        "rogue_cert": intruder.cert,
        "rogue_key": intruder.key,
    }


@pytest.fixture
async def tls_server(pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[RunningServer]:
    monkeypatch.setenv("LLMESH_TLS_CERT_FILE", str(pki["cert"]))
    monkeypatch.setenv("LLMESH_TLS_KEY_FILE", str(pki["key"]))
    monkeypatch.setenv("LLMESH_TLS_CA_FILE", str(pki["ca"]))
    running = await build_server(ServiceSettings(port=0), [ChainServicer(1, None).binding()])
    yield running
    await running.stop(0)


async def _call(channel: grpc.aio.Channel) -> dict[str, object]:
    reply = await channel.unary_unary(CALL, _identity, _identity)(b"{}", timeout=5)
    result: dict[str, object] = json.loads(reply)
    return result


async def test_client_with_valid_certificate_is_served(
    tls_server: RunningServer, pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMESH_TLS_CERT_FILE", str(pki["client_cert"]))
    monkeypatch.setenv("LLMESH_TLS_KEY_FILE", str(pki["client_key"]))
    channel = await connect(f"localhost:{tls_server.port}")
    try:
        assert (await _call(channel))["views"]
    finally:
        await channel.close()


@pytest.mark.parametrize("client", ["plaintext", "no-certificate", "foreign-ca"])
async def test_client_without_valid_certificate_is_refused(
    tls_server: RunningServer, pki: dict[str, Path], client: str
) -> None:
    target = f"localhost:{tls_server.port}"
    ca = pki["ca"].read_bytes()
    if client == "plaintext":
        channel = grpc.aio.insecure_channel(target)
    elif client == "no-certificate":
        channel = grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=ca))
    else:
        creds = grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=pki["rogue_key"].read_bytes(),
            certificate_chain=pki["rogue_cert"].read_bytes(),
        )
        channel = grpc.aio.secure_channel(target, creds)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _call(channel)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await channel.close()
