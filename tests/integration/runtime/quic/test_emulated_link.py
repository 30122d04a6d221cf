"""gRPC over QUIC across the emulated link: two namespaces, delay, jitter with reordering, loss.

Needs root and /dev/net/tun (skipped with the reason otherwise). Each test makes and removes its own
namespaces; traffic never leaves them.
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client import REGISTRY

from benchmarks.quic.echo import (
    CHANNEL_OPTIONS,
    EchoClient,
    EchoServer,
    start_echo_server,
    stream_request,
)
from benchmarks.quic.linkemu import EmulatedLink, LinkSpec, unavailable_reason
from services.runtime import certs
from services.runtime.quic import QuicSettings, ServerEndpoint, get_client_endpoint, start_server_endpoint
from services.runtime.quic.client import ClientEndpoint

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or "")

WAIT_S = 20.0
LOSSY = LinkSpec(rtt_ms=20, jitter_ms=10, loss=0.02, reorder=True)


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def cert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs")
    certs.cli(["create", "--dir", str(directory), "--service", "inference"])
    return directory


@pytest.fixture
def link() -> Iterator[EmulatedLink]:
    with EmulatedLink(LOSSY) as made:
        yield made


class LinkTunnel:
    def __init__(
        self, echo: EchoServer, server: ServerEndpoint, client: ClientEndpoint, channel: grpc.aio.Channel
    ) -> None:
        self.echo, self.server, self.client, self.channel = echo, server, client, channel
        self.stub = EchoClient(channel)


@pytest.fixture
async def tunnel(link: EmulatedLink, cert_dir: Path) -> AsyncIterator[LinkTunnel]:
    base = {
        "ca_file": str(cert_dir / "ca.pem"),
        "cert_file": str(cert_dir / "inference.pem"),
        "key_file": str(cert_dir / "inference.key"),
    }
    echo = await start_echo_server()
    server = await start_server_endpoint(
        echo.target, f"{link.addr_b}:0", QuicSettings.model_validate({**base, "netns": link.ns_b})
    )
    client = await get_client_endpoint(
        f"quic://{link.addr_b}:{server.port}?server_name=inference",
        QuicSettings.model_validate({**base, "netns": link.ns_a}),
    )
    channel = grpc.aio.insecure_channel(client.address, options=CHANNEL_OPTIONS)
    try:
        yield LinkTunnel(echo, server, client, channel)
    finally:
        await channel.close()
        await client.close()
        await server.close()
        await echo.server.stop(0)


async def test_calls_survive_a_lossy_reordering_link(tunnel: LinkTunnel) -> None:
    for i in range(20):
        assert await tunnel.stub.unary(b"%d" % i, timeout=WAIT_S) == b"%d" % i
    sizes = [len(m) async for m in tunnel.stub.stream(stream_request(64, 16384), timeout=WAIT_S)]
    assert sizes == [16384] * 64
    conn = await tunnel.client.connection()
    assert conn._quic._network_paths[0].addr[0] == tunnel.client.target.host


async def test_client_moves_to_a_new_address_mid_stream(tunnel: LinkTunnel, link: EmulatedLink) -> None:
    before = REGISTRY.get_sample_value("llmesh_quic_migrations_total", {"peer": "server"}) or 0.0
    received = 0
    async for message in tunnel.stub.stream(stream_request(200, 8192), timeout=WAIT_S):
        assert len(message) == 8192
        received += 1
        if received == 50:
            local = await tunnel.client.migrate(local_host=link.addr_a2)
            assert local[0] == link.addr_a2
    assert received == 200
    assert await tunnel.stub.unary(b"after", timeout=WAIT_S) == b"after"
    (protocol,) = [p for p in tunnel.server._protocols if p.is_open]
    assert protocol._quic._network_paths[0].addr[0] == link.addr_a2
    after = REGISTRY.get_sample_value("llmesh_quic_migrations_total", {"peer": "server"}) or 0.0
    assert after > before


def test_namespaces_are_removed_even_when_the_body_fails() -> None:
    with pytest.raises(RuntimeError, match="boom"), EmulatedLink(LinkSpec(rtt_ms=5)) as made:
        names = (made.ns_a, made.ns_b)
        assert all(name in _namespaces() for name in names)
        raise RuntimeError("boom")
    listed = _namespaces()
    assert not any(name in listed for name in names)
