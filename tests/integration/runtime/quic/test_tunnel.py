"""gRPC through the QUIC tunnel on loopback: real grpc.aio server and channel, real aioquic.

Covers unary and streaming calls with metadata, trailers and deadlines, 1 MB messages, grpcurl with
reflection, several streams per upstream, backpressure, stream resets, connection migration, server
restarts and certificate refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from prometheus_client import REGISTRY

from benchmarks.quic import echo
from benchmarks.quic.echo import (
    CHANNEL_OPTIONS,
    EchoClient,
    EchoServer,
    start_echo_server,
    stream_request,
)
from services.runtime import certs
from services.runtime.cli.smoke import grpcurl_path
from services.runtime.quic import (
    ClientEndpoint,
    QuicHandshakeError,
    QuicSettings,
    ServerEndpoint,
    get_client_endpoint,
    start_server_endpoint,
)
from tests.fixtures.ports import free_port

WAIT_S = 10.0


@pytest.fixture(scope="module")
def cert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs")
    certs.cli(["create", "--dir", str(directory), "--service", "inference"])
    return directory


def _settings(cert_dir: Path, **overrides: object) -> QuicSettings:
    values: dict[str, object] = {
        "ca_file": str(cert_dir / "ca.pem"),
        "cert_file": str(cert_dir / "inference.pem"),
        "key_file": str(cert_dir / "inference.key"),
        # Long enough that a loaded machine (event loop stalled for seconds) keeps its connection;
        # the crash test shortens it.
        "keepalive_interval_s": 1.0,
        "keepalive_timeout_s": 8.0,
        "connect_timeout_s": 3.0,
        "reconnect_backoff_max_s": 0.5,
    }
    values.update(overrides)
    return QuicSettings.model_validate(values)


@dataclass
class Tunnel:
    echo: EchoServer
    server: ServerEndpoint
    client: ClientEndpoint
    channel: grpc.aio.Channel
    stub: EchoClient
    settings: QuicSettings

    @property
    def url(self) -> str:
        return self.client.target.url


@contextlib.asynccontextmanager
async def open_tunnel(settings: QuicSettings, port: int = 0) -> AsyncIterator[Tunnel]:
    echo = await start_echo_server()
    server = await start_server_endpoint(echo.target, f"127.0.0.1:{port}", settings)
    client = await get_client_endpoint(f"quic://127.0.0.1:{server.port}?server_name=inference", settings)
    channel = grpc.aio.insecure_channel(client.address, options=CHANNEL_OPTIONS)
    try:
        yield Tunnel(echo, server, client, channel, EchoClient(channel), settings)
    finally:
        await channel.close()
        await client.close()
        await server.close()
        await echo.server.stop(0)


@pytest.fixture
async def tunnel(cert_dir: Path) -> AsyncIterator[Tunnel]:
    async with open_tunnel(_settings(cert_dir)) as opened:
        yield opened


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait (bounded) for a condition the event loop makes true."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def _metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_unary_carries_metadata_and_trailers(tunnel: Tunnel) -> None:
    call = tunnel.stub.unary(
        b"hello", metadata=(("x-echo", "abc"), ("x-echo-trailer", "xyz")), timeout=WAIT_S
    )
    assert await call == b"hello"
    assert ("x-echo", "abc") in tuple(await call.initial_metadata())
    assert ("x-echo-trailer", "xyz") in tuple(await call.trailing_metadata())
    assert await call.code() == grpc.StatusCode.OK


async def test_server_streaming_delivers_every_message(tunnel: Tunnel) -> None:
    sizes = [len(m) async for m in tunnel.stub.stream(stream_request(200, 4096), timeout=WAIT_S)]
    assert sizes == [4096] * 200


async def test_one_megabyte_messages_both_ways(tunnel: Tunnel) -> None:
    payload = bytes(range(256)) * 4096
    assert len(payload) == 1 << 20
    assert await tunnel.stub.unary(payload, timeout=WAIT_S) == payload
    received = [m async for m in tunnel.stub.stream(stream_request(4, 1 << 20), timeout=WAIT_S)]
    assert [len(m) for m in received] == [1 << 20] * 4


async def test_deadline_is_enforced_through_the_tunnel(tunnel: Tunnel) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await tunnel.stub.sleep(b"5000", timeout=0.3)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert await tunnel.stub.unary(b"after", timeout=WAIT_S) == b"after"


async def test_each_grpc_connection_gets_its_own_stream(tunnel: Tunnel) -> None:
    second = grpc.aio.insecure_channel(
        tunnel.client.address, options=[*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
    )
    slow = asyncio.ensure_future(tunnel.stub.sleep(b"8000", timeout=WAIT_S))
    try:
        fast = [await EchoClient(second).unary(b"%d" % i, timeout=WAIT_S) for i in range(20)]
        assert fast == [b"%d" % i for i in range(20)]
        assert not slow.done()  # twenty calls on the other stream finished while this one waits
        (protocol,) = [p for p in tunnel.server._protocols if p.is_open]
        await until(lambda: protocol.stream_count == 2, "one stream per gRPC connection")
    finally:
        slow.cancel()
        await second.close()


async def test_grpcurl_reflection_and_health_through_the_tunnel(tunnel: Tunnel) -> None:
    async def grpcurl(*args: str) -> str:
        # Asynchronous: the tunnel runs on this event loop while grpcurl talks through it.
        process = await asyncio.create_subprocess_exec(
            grpcurl_path(), "-plaintext", tunnel.client.address, *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), WAIT_S * 3)
        assert process.returncode == 0, err.decode()
        return out.decode()

    assert "grpc.health.v1.Health" in await grpcurl("list")
    assert "rpc Check" in await grpcurl("describe", "grpc.health.v1.Health")
    assert "SERVING" in await grpcurl("grpc.health.v1.Health/Check")


async def test_slow_reader_backpressures_the_server(cert_dir: Path) -> None:
    settings = _settings(cert_dir, stream_window=512 * 1024, connection_window=1024 * 1024)
    settings = settings.model_copy(update={"send_buffer_high": 256 * 1024})
    async with open_tunnel(settings) as tunnel:
        total = 256 * 256 * 1024  # 64 MB the server would like to send
        call = tunnel.stub.stream(stream_request(256, 256 * 1024), timeout=60)
        stream = call.__aiter__()
        await stream.__anext__()
        (protocol,) = [p for p in tunnel.server._protocols if p.is_open]
        (bridge,) = protocol._bridges.values()
        # The reader stops; the server-side socket reading must pause with a bounded buffer.
        await until(lambda: bridge._reading_paused, "server side to stop reading gRPC")
        assert protocol.send_buffered(bridge.stream_id or 0) <= 2 * settings.send_buffer_high
        assert bridge.forwarded < total // 4
        # Reading again drains everything.
        count = 1 + len([m async for m in stream])
        assert count == 256


async def test_slow_server_backpressures_the_client(cert_dir: Path) -> None:
    settings = _settings(cert_dir, stream_window=512 * 1024, connection_window=1024 * 1024)
    settings = settings.model_copy(update={"send_buffer_high": 256 * 1024})
    async with open_tunnel(settings) as tunnel:
        tunnel.echo.release.clear()  # the server's handler reads nothing for now
        chunk = bytes(256 * 1024)
        sent = 0

        async def requests() -> AsyncIterator[bytes]:
            nonlocal sent
            for _ in range(32):  # 8 MB the client would like to send
                sent += len(chunk)
                yield chunk

        call = asyncio.ensure_future(tunnel.stub.upload(requests(), timeout=60))
        await until(
            lambda: tunnel.client._conn is not None and tunnel.client._conn.stream_count == 1, "stream"
        )
        conn = tunnel.client._conn
        assert conn is not None
        (bridge,) = conn._bridges.values()
        await until(lambda: bridge._reading_paused, "client side to stop reading gRPC")
        assert bridge.forwarded < 4 * 1024 * 1024  # credit (512 KB) + send buffer, not all 8 MB
        (server_side,) = [b for p in tunnel.server._protocols for b in p._bridges.values()]
        assert server_side.backlog() <= 2 * settings.stream_window
        tunnel.echo.release.set()
        assert await call == str(32 * len(chunk)).encode()
        assert sent == 32 * len(chunk)


async def test_reset_stream_fails_the_call_instead_of_hanging(tunnel: Tunnel) -> None:
    call = tunnel.stub.sleep(b"5000", timeout=WAIT_S)
    task = asyncio.ensure_future(call)

    def server_sockets() -> list[asyncio.Transport]:
        bridges = [b for p in tunnel.server._protocols for b in p._bridges.values()]
        return [b.transport for b in bridges if b.transport is not None]

    # Wait for the handler itself: a connection that dies before the call was sent is
    # retried transparently by gRPC (and then rightly succeeds).
    await until(lambda: echo.sleeping > 0 and bool(server_sockets()), "the call to reach its handler")
    for transport in server_sockets():
        transport.abort()  # the server's gRPC connection dies under the stream
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await task
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert await tunnel.stub.unary(b"again", timeout=WAIT_S, wait_for_ready=True) == b"again"


async def test_client_address_change_mid_stream_loses_nothing(tunnel: Tunnel) -> None:
    before = _metric("llmesh_quic_migrations_total", peer="server")
    old_local = tunnel.client._conn._transport.get_extra_info("sockname")  # type: ignore[union-attr]
    received = 0
    async for message in tunnel.stub.stream(stream_request(400, 8192), timeout=WAIT_S * 2):
        assert len(message) == 8192
        received += 1
        if received == 100:
            new_local = await tunnel.client.migrate()
            assert new_local[1] != old_local[1]
        if received == 200:
            assert await tunnel.stub.unary(b"during", timeout=WAIT_S) == b"during"
    assert received == 400
    await until(lambda: _metric("llmesh_quic_migrations_total", peer="server") > before, "server to move")
    assert await tunnel.stub.unary(b"after", timeout=WAIT_S) == b"after"


async def _grpc_noticed(channel: grpc.aio.Channel) -> None:
    """Wait until gRPC has seen its connection through the tunnel close (it leaves READY)."""
    if channel.get_state() == grpc.ChannelConnectivity.READY:
        await asyncio.wait_for(channel.wait_for_state_change(grpc.ChannelConnectivity.READY), WAIT_S)


async def test_server_restart_then_new_calls_succeed(cert_dir: Path) -> None:
    settings = _settings(cert_dir, keepalive_timeout_s=3.0)
    echo = await start_echo_server()
    server = await start_server_endpoint(echo.target, "127.0.0.1:0", settings)
    port = server.port
    client = await get_client_endpoint(f"quic://127.0.0.1:{port}?server_name=inference", settings)
    channel = grpc.aio.insecure_channel(client.address, options=CHANNEL_OPTIONS)
    stub = EchoClient(channel)
    try:
        assert await stub.unary(b"one", timeout=WAIT_S) == b"one"
        first = client._conn
        # Graceful restart: peers get CONNECTION_CLOSE.
        await server.close()
        server = await start_server_endpoint(echo.target, f"127.0.0.1:{port}", settings)
        # Calls in flight at the restart fail (UNAVAILABLE) as they would over TCP; once the client
        # has seen the close, new calls go through a new connection.
        await until(lambda: client._conn is not first, "client to see the close")
        await _grpc_noticed(channel)
        assert await stub.unary(b"two", timeout=WAIT_S, wait_for_ready=True) == b"two"
        assert client._conn is not None and client._conn is not first
        # Crash: the listener vanishes without a word; keepalive notices and the client reconnects.
        second = client._conn
        await server.abort()
        server = await start_server_endpoint(echo.target, f"127.0.0.1:{port}", settings)
        await until(lambda: client._conn is not second, "keepalive to give up on the dead connection")
        await _grpc_noticed(channel)
        assert await stub.unary(b"three", timeout=WAIT_S, wait_for_ready=True) == b"three"
        assert client._conn is not None and client._conn is not second
    finally:
        await channel.close()
        await client.close()
        await server.close()
        await echo.server.stop(0)


async def test_untrusted_certificate_is_refused_with_a_clear_error(cert_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    certs.cli(["create", "--dir", str(other), "--service", "inference"])
    echo = await start_echo_server()
    server = await start_server_endpoint(echo.target, "127.0.0.1:0", _settings(cert_dir))
    try:
        wrong_ca = _settings(cert_dir, ca_file=str(other / "ca.pem"))
        with pytest.raises(QuicHandshakeError, match=r"refused.*LLMESH_QUIC_CA_FILE"):
            await get_client_endpoint(f"quic://127.0.0.1:{server.port}?server_name=inference", wrong_ca)
        with pytest.raises(QuicHandshakeError, match="'elsewhere'"):
            url = f"quic://127.0.0.1:{server.port}?server_name=elsewhere"
            await get_client_endpoint(url, _settings(cert_dir))
        await until(lambda: server.connections == 0, "the refused connections to close")
    finally:
        await server.close()
        await echo.server.stop(0)


@pytest.mark.parametrize("zero_rtt", [False, True])
async def test_reconnect_resumes_the_session(cert_dir: Path, zero_rtt: bool) -> None:
    async with open_tunnel(_settings(cert_dir, zero_rtt=zero_rtt)) as tunnel:
        assert await tunnel.stub.unary(b"first", timeout=WAIT_S) == b"first"
        first = tunnel.client._conn
        assert first is not None
        await until(lambda: tunnel.client._ticket is not None, "a session ticket")
        tunnel.client._drop(first, "test: reconnect")
        await _grpc_noticed(tunnel.channel)
        assert await tunnel.stub.unary(b"second", timeout=WAIT_S, wait_for_ready=True) == b"second"
        second = tunnel.client._conn
        assert second is not None and second is not first
        assert second._quic.tls.session_resumed
        assert second._quic.tls.early_data_accepted is zero_rtt


async def test_upstream_down_at_start_then_up(cert_dir: Path) -> None:
    port = free_port(socket.SOCK_DGRAM)
    settings = _settings(cert_dir, connect_timeout_s=0.5)
    client = await get_client_endpoint(f"quic://127.0.0.1:{port}?server_name=inference", settings)
    channel = grpc.aio.insecure_channel(client.address, options=CHANNEL_OPTIONS)
    echo = await start_echo_server()
    server = None
    try:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await EchoClient(channel).unary(b"early", timeout=WAIT_S)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        server = await start_server_endpoint(echo.target, f"127.0.0.1:{port}", settings)
        assert await EchoClient(channel).unary(b"late", timeout=WAIT_S, wait_for_ready=True) == b"late"
        assert _metric("llmesh_quic_connects_total", peer=client.peer, outcome="failed") >= 1
    finally:
        await channel.close()
        await client.close()
        if server is not None:
            await server.close()
        await echo.server.stop(0)
