"""Server endpoint: a QUIC listener whose every stream becomes a TCP connection to a local gRPC port."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass, field

from aioquic.asyncio.server import QuicServer
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import ConnectionTerminated
from aioquic.tls import SessionTicket

from services.runtime.quic import metrics
from services.runtime.quic.bridge import StreamBridge
from services.runtime.quic.config import QuicSettings, parse_listen, server_configuration
from services.runtime.quic.tunnel import TunnelProtocol
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
    protocols: set[TunnelProtocol] = set()

    def on_peer_stream(tunnel: TunnelProtocol, stream_id: int) -> StreamBridge:
        bridge = StreamBridge(_PEER, "server")
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
