"""Server endpoint: a QUIC listener whose every stream becomes a TCP connection to a local gRPC port.

Every client presents a certificate of the mesh's CA (``peer_auth``). The local TCP connection of
each stream is registered with the client's identity in ``services.runtime.authz.TUNNEL_PEERS``
while it is open, so the gRPC server authorises the QUIC client's identity for each call, never
the endpoint's loopback connection as such. (With gRPC mTLS on as well, the gRPC handshake inside
the tunnel is the client's own, end to end, and its identity must be allowed too.)
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass, field

from aioquic.asyncio.server import QuicServer
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import ConnectionTerminated
from aioquic.tls import SessionTicket

from services.runtime.authz import TUNNEL_PEERS
from services.runtime.quic import metrics
from services.runtime.quic.bridge import StreamBridge
from services.runtime.quic.config import QuicSettings, parse_listen, server_configuration
from services.runtime.quic.peer_auth import ClientCertificates
from services.runtime.quic.tunnel import CreditedConnection, TunnelProtocol
from services.runtime.quic.udp import BatchedUdpTransport, open_udp

logger = logging.getLogger(__name__)

_PEER = "server"
_TICKETS_KEPT = 4096


class SingleUseTickets:
    """Session tickets for resumption; each ticket works once, which makes 0-RTT data replay-safe
    against this process (a replayed ClientHello finds no ticket and gets a full handshake)."""

    def __init__(self, capacity: int = _TICKETS_KEPT) -> None:
        self._tickets: OrderedDict[bytes, SessionTicket] = OrderedDict()
        self._capacity = capacity

    def add(self, ticket: SessionTicket) -> None:
        self._tickets[ticket.ticket] = ticket
        while len(self._tickets) > self._capacity:
            self._tickets.popitem(last=False)

    def pop(self, label: bytes) -> SessionTicket | None:
        return self._tickets.pop(label, None)


class _IdentifiedBridge(StreamBridge):
    """A server-side bridge whose local socket stands for the QUIC client's identity while open."""

    def __init__(self, identity: str) -> None:
        super().__init__(_PEER, "server")
        self.identity = identity
        self._registered: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Registered before the first byte is written to the socket (super() flushes).
        if not self._finished:
            self._registered = TUNNEL_PEERS.add(transport.get_extra_info("sockname"), self.identity)
        super().connection_made(transport)

    def _finish(self) -> None:
        if self._registered is not None:
            TUNNEL_PEERS.remove(self._registered)
            self._registered = None
        super()._finish()


@dataclass
class ServerEndpoint:
    """A running QUIC listener; ``port`` is the bound UDP port."""

    host: str
    port: int
    grpc_target: str
    _server: QuicServer
    _transport: BatchedUdpTransport
    _protocols: set[TunnelProtocol] = field(default_factory=set)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def connections(self) -> int:
        return sum(1 for p in self._protocols if p.is_open)

    async def abort(self) -> None:
        """Stop without telling the peers (what a crashed host looks like to clients)."""
        for protocol in list(self._protocols):
            protocol.quic_event_received(
                ConnectionTerminated(error_code=0, frame_type=None, reason_phrase="server endpoint aborted")
            )
        self._protocols.clear()
        self._transport.close()
        await asyncio.sleep(0)

    async def close(self) -> None:
        """Close every QUIC connection (peers see CONNECTION_CLOSE) and stop listening."""
        for protocol in list(self._protocols):
            if protocol.is_open:
                protocol.close(reason_phrase="server endpoint closing")
            protocol.quic_event_received(
                ConnectionTerminated(error_code=0, frame_type=None, reason_phrase="server endpoint closing")
            )
        self._protocols.clear()
        self._transport.close()
        await asyncio.sleep(0)  # let connection_lost callbacks of aborted sockets run


async def start_server_endpoint(
    grpc_target: str, listen: str, settings: QuicSettings | None = None
) -> ServerEndpoint:
    """Listen for QUIC on ``listen`` (``host:port``, port 0 = any) and forward each stream to the
    gRPC server at ``grpc_target`` (``host:port``, normally ``127.0.0.1:<port>``)."""
    settings = settings or QuicSettings()
    loop = asyncio.get_running_loop()
    target_host, target_port = parse_listen(grpc_target)
    host, port = parse_listen(listen)
    tickets = SingleUseTickets()
    client_certificates = ClientCertificates()
    protocols: set[TunnelProtocol] = set()

    def on_peer_stream(tunnel: TunnelProtocol, stream_id: int) -> StreamBridge | None:
        identity = ClientCertificates.identity(tunnel._quic)
        if identity is None:  # cannot happen after a handshake peer_auth let through
            logger.warning("QUIC stream without a verified client identity; closing the connection")
            tunnel.close(error_code=0x1, reason_phrase="no verified client certificate")
            return None
        bridge = _IdentifiedBridge(identity)
        bridge.attach(tunnel, stream_id)
        bridge.task = loop.create_task(_connect_local(bridge, target_host, target_port))
        return bridge

    def create_protocol(connection: QuicConnection, stream_handler: object = None) -> TunnelProtocol:
        protocol = TunnelProtocol(
            connection,
            peer=_PEER,
            side="server",
            send_buffer_high=settings.send_buffer_high,
            on_peer_stream=on_peer_stream,
        )
        assert isinstance(connection, CreditedConnection)  # TunnelProtocol adopted it
        connection.on_tls = client_certificates.install
        protocols.difference_update([p for p in protocols if not p.is_open])
        protocols.add(protocol)
        return protocol

    server = QuicServer(
        configuration=server_configuration(settings),
        create_protocol=create_protocol,
        session_ticket_fetcher=tickets.pop,
        session_ticket_handler=tickets.add,
    )
    transport = open_udp(loop, host, port, server, settings.netns)
    bound_port = transport.get_extra_info("sockname")[1]
    logger.info("QUIC endpoint on %s:%s forwards to gRPC %s", host, bound_port, grpc_target)
    return ServerEndpoint(host, bound_port, grpc_target, server, transport, protocols)


async def _connect_local(bridge: StreamBridge, host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    try:
        await loop.create_connection(lambda: bridge, host, port)
    except OSError as exc:
        logger.warning("QUIC stream to local gRPC %s:%s failed: %s", host, port, exc)
        metrics.RESETS.labels(_PEER, "server").inc()
        bridge.on_stream_reset(f"local connect failed: {exc}")
