"""The QUIC connection of the tunnel: stream ↔ socket dispatch, credit-based flow control, metrics.

Relies on aioquic 1.7.2 internals in two places (the version is pinned in pyproject.toml):
``CreditedConnection`` replaces aioquic's receive-window growth (which doubles a window whenever half
of it has *arrived*, whether or not anything read it) by credit that follows what the local sockets
took, and the metrics read the loss-recovery state (RTT, congestion window).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.quic import events
from aioquic.quic.connection import NetworkAddress, QuicConnection

from services.runtime.quic import metrics
from services.runtime.quic.bridge import StreamBridge
from services.runtime.quic.congestion import TunnelCongestionControl, TunnelCubic
from services.runtime.quic.recovery import TunnelRecovery

logger = logging.getLogger(__name__)

_METRICS_EVERY_S = 0.5
_SEND_BUFFER_MIN = 64 * 1024
# Packet numbers the receiver tracks for duplicate detection (aioquic: 128).
REORDER_WINDOW = 4096


class CreditedConnection(QuicConnection):
    """QuicConnection whose MAX_DATA / MAX_STREAM_DATA follow what the application consumed.

    The peer may have at most ``window`` bytes outstanding beyond what the local sockets have taken.
    Updates go out once a quarter of a window has been freed, so a steady transfer sends a few
    credit frames per window instead of one per packet.
    """

    backlog_of: Callable[[int], int | None]
    backlog_total: Callable[[], int]
    # Runs once the TLS context exists, before the handshake (the server's client-certificate
    # check, services.runtime.quic.peer_auth).
    on_tls: Callable[[QuicConnection], None] | None = None

    @classmethod
    def adopt(
        cls,
        connection: QuicConnection,
        backlog_of: Callable[[int], int | None],
        backlog_total: Callable[[], int],
    ) -> CreditedConnection:
        """Turn a connection aioquic's server built into a CreditedConnection (no extra state)."""
        connection.__class__ = cls
        assert isinstance(connection, CreditedConnection)
        connection.backlog_of = backlog_of
        connection.backlog_total = backlog_total
        return connection

    def _initialize(self, peer_cid: bytes) -> None:
        super()._initialize(peer_cid)
        if self.on_tls is not None:
            self.on_tls(self)
        # aioquic treats a packet more than 128 numbers below the highest received as a duplicate
        # and drops it unacknowledged. A burst jittered on its way arrives reordered by more than
        # that, and every such packet became a real loss (and a halved window). Remember more.
        for space in self._spaces.values():
            space.received_packets._size = REORDER_WINDOW

    def _write_connection_limits(self, builder: Any, space: Any) -> None:
        limit = self._local_max_data
        window = self._configuration.max_data
        # Cheap test first: while over 3/4 of a window of credit is left no update can be due.
        if limit.value - limit.used < window - window // 4:
            target = limit.used - self.backlog_total() + window
            if target - limit.value >= window // 4:
                limit.value = target
        # aioquic doubles the limit when half of it is used; hide the usage so only our credit counts.
        used, limit.used = limit.used, 0
        try:
            super()._write_connection_limits(builder=builder, space=space)
        finally:
            limit.used = used

    def _write_stream_limits(self, builder: Any, space: Any, stream: Any) -> None:
        window = self._configuration.max_stream_data
        if (
            stream.max_stream_data_local
            and stream.max_stream_data_local - stream.receiver.highest_offset < window - window // 4
        ):
            backlog = self.backlog_of(stream.stream_id)
            received = stream.receiver.highest_offset
            consumed = received if backlog is None else received - backlog
            target = consumed + window
            if target - stream.max_stream_data_local >= window // 4:
                stream.max_stream_data_local = target
        highest, stream.receiver.highest_offset = stream.receiver.highest_offset, 0
        try:
            super()._write_stream_limits(builder=builder, space=space, stream=stream)
        finally:
            stream.receiver.highest_offset = highest


class TunnelProtocol(QuicConnectionProtocol):
    """One QUIC connection carrying many local sockets, one bidirectional stream each."""

    def __init__(
        self,
        quic: QuicConnection,
        stream_handler: Any = None,
        *,
        peer: str,
        side: str,
        send_buffer_high: int,
        on_peer_stream: Callable[[TunnelProtocol, int], StreamBridge | None] | None = None,
    ) -> None:
        super().__init__(quic, stream_handler)
        self.peer = peer
        self.side = side
        self._send_buffer_max = send_buffer_high
        self._on_peer_stream = on_peer_stream
        self._bridges: dict[int, StreamBridge] = {}
        self._watched: set[StreamBridge] = set()
        self._unflushed: dict[StreamBridge, None] = {}  # ordered set
        # Peer-opened streams seen here: every ID of the peer's kind below ``_peer_seen_below``, and
        # those in ``_peer_seen`` above it. A stream's first frame may arrive after a later stream's
        # (two local sockets accepted together write in either order), so "below the highest ID
        # seen" does not mean "already closed". None until the first one fixes the kind (ID % 4).
        self._peer_seen_below: int | None = None
        self._peer_seen: set[int] = set()
        self._metrics_at = 0.0
        self._primary_addr: NetworkAddress | None = None
        self.terminated: events.ConnectionTerminated | None = None
        self.handshake: events.HandshakeCompleted | None = None
        # Set when the peer confirmed the handshake (the server's HANDSHAKE_DONE): a server that
        # refuses this client's certificate closes the connection before that.
        self._confirmed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        CreditedConnection.adopt(quic, self._backlog_of, self._backlog_total)
        recovery = TunnelRecovery.adopt(quic._loss)
        recovery.on_spurious = metrics.SPURIOUS.labels(peer).inc
        cc = recovery._cc
        if isinstance(cc, TunnelCongestionControl | TunnelCubic):
            cc.on_loss = metrics.LOST.labels(peer).inc

    # -- used by bridges ----------------------------------------------------------------------

    @property
    def send_buffer_high(self) -> int:
        """Pause reading a socket above this many buffered bytes: twice the congestion window (what
        can be in flight, plus as much queued), at least 64 KB, at most the configured maximum.

        Bytes queued here are already committed to the stream: after a cancelled call they must
        drain before the next call's bytes. On a lossy link the window is small and so is that
        backlog; a fixed megabyte would hold seconds of stale data there.
        """
        window = 2 * int(self._quic._loss.congestion_window)
        return min(self._send_buffer_max, max(_SEND_BUFFER_MIN, window))

    @property
    def is_open(self) -> bool:
        return self.terminated is None and not self._closed.is_set()

    def open_stream(self, bridge: StreamBridge) -> int:
        stream_id = self._quic.get_next_available_stream_id()
        # The ID is only taken once the stream exists: create it now, or the next socket accepted
        # before this one sends anything would be given the same stream.
        self._quic.send_stream_data(stream_id, b"")
        bridge.attach(self, stream_id)
        return stream_id

    def register(self, stream_id: int, bridge: StreamBridge) -> None:
        self._bridges[stream_id] = bridge

    def unregister(self, stream_id: int) -> None:
        bridge = self._bridges.pop(stream_id, None)
        if bridge is not None:
            self._watched.discard(bridge)
        self.transmit_soon()

    def send(self, stream_id: int, data: bytes, end_stream: bool = False) -> None:
        if not self.is_open:
            return
        self._quic.send_stream_data(stream_id, data, end_stream=end_stream)
        self.transmit_soon()

    def send_buffered(self, stream_id: int) -> int:
        stream = self._quic._streams.get(stream_id)
        if stream is None:
            return 0
        sender = stream.sender
        return int(sender._buffer_stop - sender._buffer_start)

    def flush_later(self, bridge: StreamBridge) -> None:
        """Queue ``bridge``'s socket write for the end of this datagram batch."""
        self._unflushed[bridge] = None
        self._transmit_soon()

    def watch_send_buffer(self, bridge: StreamBridge) -> None:
        self._watched.add(bridge)

    def reset(self, stream_id: int, error_code: int) -> None:
        if not self.is_open:
            return
        self._quic.reset_stream(stream_id, error_code)
        self.transmit_soon()

    def stop(self, stream_id: int, error_code: int) -> None:
        if not self.is_open:
            return
        try:
            self._quic.stop_stream(stream_id, error_code)
        except ValueError:  # already finished and discarded
            return
        self.transmit_soon()

    def transmit_soon(self) -> None:
        self._transmit_soon()

    @property
    def stream_count(self) -> int:
        return len(self._bridges)

    def rebind(self, old: asyncio.BaseTransport | None) -> None:
        """Migrate: a new local socket has been attached (``connection_made``); drop ``old`` and
        announce the new path at once."""
        if old is not None and old is not self._transport:
            old.close()
        # A fresh connection ID on the new path keeps the two paths unlinkable for observers.
        self._quic.change_connection_id()
        self._quic.send_ping(0)
        self.transmit()

    # -- asyncio / aioquic hooks --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # aioquic's server attaches the shared socket; the client attaches its own.
        self._transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        return  # the UDP socket closing is not the QUIC connection ending

    async def wait_confirmed(self) -> None:
        """Returns once the handshake is confirmed; ConnectionError if the connection ended first."""
        await asyncio.shield(self._confirmed)

    def datagram_received(self, data: bytes | str, addr: NetworkAddress) -> None:
        self._quic.receive_datagram(data, addr, now=self._loop.time())  # type: ignore[arg-type]
        self._process_events()
        if not self._confirmed.done() and self._quic._handshake_confirmed:
            self._confirmed.set_result(None)
        self._transmit_soon()  # one transmit per batch of datagrams (see udp.py)
        if self.side == "server" and self._quic._network_paths:
            primary = self._quic._network_paths[0].addr
            if self._primary_addr is not None and primary != self._primary_addr:
                logger.info("QUIC peer moved from %s to %s", self._primary_addr, primary)
                metrics.MIGRATIONS.labels(self.peer).inc()
            self._primary_addr = primary

    def transmit(self) -> None:
        if self._unflushed:
            bridges = list(self._unflushed)
            self._unflushed.clear()
            for bridge in bridges:
                bridge.flush()
        super().transmit()
        if self._watched:
            for bridge in [b for b in self._watched if b.maybe_resume_reading()]:
                self._watched.discard(bridge)
        now = self._loop.time()
        if now >= self._metrics_at:
            self._metrics_at = now + _METRICS_EVERY_S
            self.sample_metrics()

    def sample_metrics(self) -> None:
        loss = self._quic._loss
        if self.side == "client":
            metrics.RTT.labels(self.peer).set(loss._rtt_smoothed)
            if loss._rtt_min != float("inf"):
                metrics.MIN_RTT.labels(self.peer).set(loss._rtt_min)
            metrics.CWND.labels(self.peer).set(loss.congestion_window)
            metrics.IN_FLIGHT.labels(self.peer).set(loss.bytes_in_flight)

    def quic_event_received(self, event: events.QuicEvent) -> None:
        if isinstance(event, events.StreamDataReceived):
            bridge = self._bridges.get(event.stream_id)
            if bridge is None:
                bridge = self._new_peer_stream(event.stream_id)
            if bridge is not None:
                bridge.on_stream_data(event.data, event.end_stream)
        elif isinstance(event, events.StreamReset | events.StopSendingReceived):
            bridge = self._bridges.get(event.stream_id)
            if bridge is not None:
                metrics.RESETS.labels(self.peer, self.side).inc()
                bridge.on_stream_reset(f"peer error code {event.error_code}")
        elif isinstance(event, events.HandshakeCompleted):
            self.handshake = event
        elif isinstance(event, events.ConnectionTerminated):
            self.terminated = event
            if not self._confirmed.done():
                self._confirmed.set_exception(ConnectionError(event.reason_phrase or "connection closed"))
                self._confirmed.exception()  # retrieved: nobody may be waiting
            for bridge in list(self._bridges.values()):
                bridge.on_stream_reset(f"connection closed: {event.reason_phrase or event.error_code}")
            self._bridges.clear()
            self._watched.clear()

    def _new_peer_stream(self, stream_id: int) -> StreamBridge | None:
        if self._on_peer_stream is None:
            return None
        if self._peer_seen_below is None:
            self._peer_seen_below = stream_id % 4
        if stream_id < self._peer_seen_below or stream_id in self._peer_seen:
            return None  # a late frame of a stream already closed here
        self._peer_seen.add(stream_id)
        # IDs of one kind step by 4: fold the contiguous run into the low-water mark.
        while self._peer_seen_below in self._peer_seen:
            self._peer_seen.discard(self._peer_seen_below)
            self._peer_seen_below += 4
        return self._on_peer_stream(self, stream_id)

    # -- bookkeeping for CreditedConnection ---------------------------------------------------

    def _backlog_of(self, stream_id: int) -> int | None:
        bridge = self._bridges.get(stream_id)
        return None if bridge is None else bridge.backlog()

    def _backlog_total(self) -> int:
        return sum(bridge.backlog() for bridge in self._bridges.values())
