"""Client endpoint: a local TCP listener that a gRPC channel dials, carried over QUIC to one upstream.

Each accepted TCP connection (gRPC opens one or more per channel) becomes one QUIC stream of a
shared connection to ``quic://host:port``. The connection is made on demand, re-made with
exponential backoff after it fails, checked by keepalive PINGs, resumed with a session ticket (and,
when ``zero_rtt`` is on, sends its first bytes as 0-RTT data) and can move to a new local address
without dropping calls (``migrate``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import socket
from dataclasses import dataclass

from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import ConnectionTerminated
from aioquic.tls import SessionTicket

from services.runtime.quic import metrics
from services.runtime.quic.bridge import StreamBridge
from services.runtime.quic.config import QuicSettings, client_configuration, parse_quic_url
from services.runtime.quic.tunnel import TunnelProtocol
from services.runtime.quic.udp import BatchedUdpTransport, udp_socket

logger = logging.getLogger(__name__)

_TLS_ALERT_BASE = 0x100  # QUIC CRYPTO_ERROR range: 0x100 + TLS alert number
_BACKOFF_START_S = 0.1
_EAGER_WAIT_S = 2.0


class QuicConnectError(ConnectionError):
    """The QUIC connection to an upstream could not be made."""


class QuicHandshakeError(QuicConnectError):
    """TLS refused the connection (certificate not trusted, wrong name, ...); retrying won't help."""


@dataclass(frozen=True)
class _Target:
    url: str
    host: str
    port: int
    server_name: str


class ClientEndpoint:
    """Local ``127.0.0.1:PORT`` listener for one ``quic://`` upstream."""

    def __init__(self, url: str, settings: QuicSettings) -> None:
        host, port, server_name = parse_quic_url(url)
        self.target = _Target(url, host, port, server_name or host)
        self.settings = settings
        self.address = ""
        self._loop = asyncio.get_running_loop()
        self._tcp: asyncio.Server | None = None
        self._conn: TunnelProtocol | None = None
        self._attempt: asyncio.Task[TunnelProtocol] | None = None
        self._keepalive: asyncio.Task[None] | None = None
        self._ticket: SessionTicket | None = None
        self._backoff = 0.0
        self._next_attempt_at = 0.0
        self._closing = False
        self.last_error: BaseException | None = None

    @property
    def peer(self) -> str:
        return self.target.url

    async def start(self) -> str:
        self._tcp = await self._loop.create_server(self._accept, "127.0.0.1", 0)
        port = self._tcp.sockets[0].getsockname()[1]
        self.address = f"127.0.0.1:{port}"
        return self.address

    # -- connection management ----------------------------------------------------------------

    async def connection(self) -> TunnelProtocol:
        """The live QUIC connection, made (after any backoff) if there is none."""
        if self._conn is not None and self._conn.is_open:
            return self._conn
        if self._closing:
            raise QuicConnectError(f"{self.peer}: endpoint closed")
        if self._attempt is None or self._attempt.done():
            self._attempt = self._loop.create_task(self._connect_after_backoff())
        return await asyncio.shield(self._attempt)

    async def _connect_after_backoff(self) -> TunnelProtocol:
        delay = self._next_attempt_at - self._loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        try:
            conn = await self._connect()
        except QuicHandshakeError as exc:
            self._note_failure(exc, "handshake_refused")
            raise
        except TimeoutError as exc:
            self._note_failure(exc, "failed")
            raise QuicConnectError(str(exc)) from exc
        except OSError as exc:
            self._note_failure(exc, "failed")
            raise QuicConnectError(f"{self.peer}: {exc}") from exc
        self._backoff = 0.0
        self._next_attempt_at = 0.0
        metrics.RECONNECTS.labels(self.peer, "ok").inc()
        return conn

    def _note_failure(self, exc: BaseException, outcome: str) -> None:
        self.last_error = exc
        metrics.RECONNECTS.labels(self.peer, outcome).inc()
        self._backoff = min(self.settings.reconnect_backoff_max_s, max(_BACKOFF_START_S, self._backoff * 2))
        self._next_attempt_at = self._loop.time() + self._backoff * random.uniform(0.8, 1.2)
        logger.warning("QUIC connect to %s failed (%s); next try in %.1fs", self.peer, exc, self._backoff)

    async def _resolve(self) -> tuple[socket.AddressFamily, tuple[str, int]]:
        infos = await self._loop.getaddrinfo(self.target.host, self.target.port, type=socket.SOCK_DGRAM)
        family, _, _, _, addr = infos[0]
        return family, (str(addr[0]), int(addr[1]))

    def _bind(self, family: socket.AddressFamily, local_host: str | None) -> socket.socket:
        host = local_host or ("::" if family == socket.AF_INET6 else "0.0.0.0")
        return udp_socket(host, 0, self.settings.netns)

    async def _connect(self) -> TunnelProtocol:
        family, addr = await self._resolve()
        configuration = client_configuration(self.settings, self.target.server_name)
        ticket, self._ticket = self._ticket, None  # tickets are single use on the server
        if ticket is not None and ticket.server_name == configuration.server_name:
            if not self.settings.zero_rtt:  # resume, but offer no early data
                ticket = dataclasses.replace(ticket, max_early_data_size=None)
            configuration.session_ticket = ticket
        quic = QuicConnection(configuration=configuration, session_ticket_handler=self._store_ticket)
        protocol = TunnelProtocol(
            quic, peer=self.peer, side="client", send_buffer_high=self.settings.send_buffer_high
        )
        BatchedUdpTransport(self._loop, self._bind(family, None), protocol)
        protocol.connect(addr)
        early = (
            self.settings.zero_rtt
            and configuration.session_ticket is not None
            and configuration.session_ticket.max_early_data_size is not None
        )
        if not early:
            await self._wait_handshake(protocol)
        self._conn = protocol
        metrics.CONNECTED.labels(self.peer).set(1)
        self._keepalive = self._loop.create_task(self._keepalive_loop(protocol))
        logger.info("QUIC connected to %s (%s)%s", self.peer, addr, " with 0-RTT" if early else "")
        return protocol

    async def _wait_handshake(self, protocol: TunnelProtocol) -> None:
        try:
            await asyncio.wait_for(protocol.wait_connected(), self.settings.connect_timeout_s)
            # The server verifies this client's certificate after our side of the handshake is
            # done; wait for its verdict so that a refusal surfaces here, not as failed calls.
            await asyncio.wait_for(protocol.wait_confirmed(), self.settings.connect_timeout_s)
        except TimeoutError:
            self._drop(protocol, "handshake timed out")
            raise TimeoutError(
                f"no QUIC handshake with {self.peer} within {self.settings.connect_timeout_s:.1f}s"
            ) from None
        except ConnectionError:
            event = protocol.terminated
            self._drop(protocol, "handshake failed")
            reason = event.reason_phrase if event is not None else "connection closed"
            code = event.error_code if event is not None else 0
            if protocol.handshake is not None and _TLS_ALERT_BASE <= code < _TLS_ALERT_BASE + 0x100:
                cert, _ = self.settings.cert_paths()
                raise QuicHandshakeError(
                    f"{self.peer} refused this client's certificate: {reason or 'TLS alert'} "
                    f"(alert {code - _TLS_ALERT_BASE}); the server requires a client certificate "
                    f"signed by its CA: check LLMESH_QUIC_CERT_FILE/LLMESH_QUIC_KEY_FILE (now {cert})"
                ) from None
            if _TLS_ALERT_BASE <= code < _TLS_ALERT_BASE + 0x100:
                raise QuicHandshakeError(
                    f"TLS handshake with {self.peer} refused: {reason or 'TLS alert'} "
                    f"(alert {code - _TLS_ALERT_BASE}); check that LLMESH_QUIC_CA_FILE trusts the "
                    f"server certificate and that it names {self.target.server_name!r}"
                ) from None
            raise QuicConnectError(f"QUIC connection to {self.peer} closed: {reason}") from None

    def _store_ticket(self, ticket: SessionTicket) -> None:
        self._ticket = ticket

    def _drop(self, protocol: TunnelProtocol, reason: str) -> None:
        """Give up on a connection now: its sockets are aborted so gRPC reconnects."""
        # Waiters whose awaiting side already gave up (timed-out PING or handshake) would otherwise
        # get the connection's end as an exception nobody retrieves.
        for waiter in [*protocol._ping_waiters.values(), protocol._connected_waiter]:
            if waiter is not None and not waiter.done():
                waiter.cancel()
        protocol._ping_waiters.clear()
        protocol._connected_waiter = None
        if protocol.is_open:
            protocol.close(reason_phrase=reason)
            protocol.quic_event_received(
                ConnectionTerminated(error_code=0, frame_type=None, reason_phrase=reason)
            )
        transport = protocol._transport
        if transport is not None:
            transport.close()  # close() above already sent CONNECTION_CLOSE
        if self._conn is protocol:
            self._conn = None
            metrics.CONNECTED.labels(self.peer).set(0)

    async def _keepalive_loop(self, protocol: TunnelProtocol) -> None:
        interval = self.settings.keepalive_interval_s
        while protocol.is_open and not self._closing:
            await asyncio.sleep(interval)
            if not protocol.is_open:
                break
            try:
                await asyncio.wait_for(protocol.ping(), self.settings.keepalive_timeout_s)
            except (TimeoutError, ConnectionError):
                metrics.KEEPALIVE_FAILURES.labels(self.peer).inc()
                logger.warning("QUIC keepalive to %s unanswered; reconnecting", self.peer)
                break
            protocol.sample_metrics()
        # Keepalive failed, or the peer closed: sockets on this connection are aborted (gRPC
        # reconnects through the endpoint, which dials a new connection).
        self._drop(protocol, "keepalive failed" if protocol.is_open else "connection closed")

    # -- local sockets ------------------------------------------------------------------------

    def _accept(self) -> StreamBridge:
        bridge = StreamBridge(self.peer, "client")
        bridge.task = self._loop.create_task(self._bind_stream(bridge))
        return bridge

    async def _bind_stream(self, bridge: StreamBridge) -> None:
        try:
            conn = await self.connection()
        except QuicConnectError as exc:
            logger.error("gRPC connection to %s dropped: %s", self.peer, exc)
            bridge.on_stream_reset(str(exc))
            return
        if bridge.transport is not None and bridge.transport.is_closing():
            return  # gRPC gave up on this connection while we were connecting
        conn.open_stream(bridge)

    # -- migration and shutdown ---------------------------------------------------------------

    async def migrate(self, local_host: str | None = None) -> tuple[str, int]:
        """Move the live connection to a new local UDP socket (new port, or ``local_host``).

        The server validates the new path and carries on; calls in flight do not notice. Returns the
        new local address.
        """
        conn = await self.connection()
        family, _ = await self._resolve()
        old = conn._transport
        transport = BatchedUdpTransport(self._loop, self._bind(family, local_host), conn)
        conn.rebind(old)
        metrics.MIGRATIONS.labels(self.peer).inc()
        local: tuple[str, int] = transport.get_extra_info("sockname")[:2]
        logger.info("QUIC connection to %s migrated to local %s", self.peer, local)
        return local

    async def close(self) -> None:
        """Stop listening, close the QUIC connection and forget this endpoint."""
        self._closing = True
        if _endpoints.get(self.target.url) is self:
            del _endpoints[self.target.url]
        if self._tcp is not None:
            self._tcp.close()
        if self._attempt is not None and not self._attempt.done():
            self._attempt.cancel()
        if self._conn is not None:
            self._drop(self._conn, "client endpoint closing")
        if self._keepalive is not None:
            self._keepalive.cancel()
        if self._tcp is not None:
            await self._tcp.wait_closed()


_endpoints: dict[str, ClientEndpoint] = {}
_creating: dict[str, asyncio.Task[ClientEndpoint]] = {}


async def client_endpoint_for(quic_url: str, settings: QuicSettings | None = None) -> str:
    """``"127.0.0.1:PORT"`` for a gRPC channel to dial instead of ``quic_url`` (one per URL).

    The first call tries to connect once: a TLS refusal (untrusted or misnamed certificate) raises
    ``QuicHandshakeError`` with the reason; an unreachable upstream only logs, and the endpoint keeps
    retrying with backoff as gRPC connects through it.
    """
    endpoint = await get_client_endpoint(quic_url, settings)
    return endpoint.address


async def get_client_endpoint(quic_url: str, settings: QuicSettings | None = None) -> ClientEndpoint:
    """The cached ``ClientEndpoint`` of ``quic_url`` (for migration, metrics, shutdown)."""
    loop = asyncio.get_running_loop()
    endpoint = _endpoints.get(quic_url)
    if endpoint is not None and endpoint._loop is loop and not endpoint._closing:
        return endpoint
    task = _creating.get(quic_url)
    if task is None or task.get_loop() is not loop:
        task = loop.create_task(_create(quic_url, settings or QuicSettings()))
        _creating[quic_url] = task
    try:
        return await asyncio.shield(task)
    finally:
        if task.done() and _creating.get(quic_url) is task:
            del _creating[quic_url]


async def _create(quic_url: str, settings: QuicSettings) -> ClientEndpoint:
    endpoint = ClientEndpoint(quic_url, settings)
    await endpoint.start()
    # One eager attempt, so that a TLS refusal surfaces here; an upstream that does not answer only
    # delays the caller's start by _EAGER_WAIT_S, then the attempt goes on in the background.
    attempt = asyncio.ensure_future(endpoint.connection())
    attempt.add_done_callback(lambda done: done.cancelled() or done.exception())
    try:
        await asyncio.wait_for(asyncio.shield(attempt), min(_EAGER_WAIT_S, settings.connect_timeout_s))
    except QuicHandshakeError:
        await endpoint.close()
        raise
    except (QuicConnectError, TimeoutError) as exc:
        logger.warning("QUIC upstream %s not reachable yet (%s); will retry", quic_url, exc or "no answer")
    _endpoints[quic_url] = endpoint
    return endpoint


async def close_client_endpoints() -> None:
    """Close every cached client endpoint (service shutdown, tests)."""
    endpoints = list(_endpoints.values())
    _endpoints.clear()
    for endpoint in endpoints:
        await endpoint.close()
