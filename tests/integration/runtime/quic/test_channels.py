"""``channels.connect("quic://...")``: a normal llmesh channel that crosses the tunnel and says so."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from benchmarks.quic.echo import EchoClient, start_echo_server
from services.runtime import certs, channels
from services.runtime.quic import QuicSettings, get_client_endpoint, start_server_endpoint
from services.runtime.quic.tracing import PEER_ATTRIBUTE, TRANSPORT_ATTRIBUTE
from tests.fixtures.spans import capture_spans


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return capture_spans()


async def test_connect_quic_address_marks_the_span(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exporter: InMemorySpanExporter
) -> None:
    certs.cli(["create", "--dir", str(tmp_path), "--service", "inference", "--service", "gateway"])
    monkeypatch.setenv("LLMESH_QUIC_CA_FILE", str(tmp_path / "ca.pem"))
    # The client's own certificate: the server endpoint requires one.
    monkeypatch.setenv("LLMESH_QUIC_CERT_FILE", str(tmp_path / "gateway.pem"))
    monkeypatch.setenv("LLMESH_QUIC_KEY_FILE", str(tmp_path / "gateway.key"))
    echo = await start_echo_server()
    server = await start_server_endpoint(
        echo.target,
        "127.0.0.1:0",
        QuicSettings(cert_file=str(tmp_path / "inference.pem"), key_file=str(tmp_path / "inference.key")),
    )
    url = f"quic://127.0.0.1:{server.port}?server_name=inference"
    channel = await channels.connect(url)
    try:
        with trace.get_tracer("test").start_as_current_span("caller"):
            assert await EchoClient(channel).unary(b"ping", timeout=10) == b"ping"
        (span,) = [s for s in exporter.get_finished_spans() if s.name == "caller"]
        assert span.attributes is not None
        assert span.attributes[TRANSPORT_ATTRIBUTE] == "quic"
        assert span.attributes[PEER_ATTRIBUTE] == url
    finally:
        await channel.close()
        await (await get_client_endpoint(url)).close()
        await server.close()
        await echo.server.stop(0)
