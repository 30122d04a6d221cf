"""One local TCP connection (a gRPC HTTP/2 connection) carried by one bidirectional QUIC stream.

Backpressure both ways:

* TCP → QUIC: bytes read from the socket go into the stream's send buffer; reading pauses while
  that buffer (unsent + unacknowledged bytes) is above ``send_buffer_high`` and resumes when the
  tunnel's transmit finds it below a quarter of that.
* QUIC → TCP: bytes from the stream are written to the socket; what the socket has not taken yet is
  this bridge's ``backlog()``. ``CreditedConnection`` only extends the peer's flow-control credit by
  what has actually left for the socket, so a slow gRPC reader stalls its peer instead of growing a
  buffer here.

A reset stream aborts the socket (gRPC sees a connection error, not a hang); an aborted socket resets
the stream and asks the peer to stop sending.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, cast

from services.runtime.quic import metrics

if TYPE_CHECKING:
    from services.runtime.quic.tunnel import TunnelProtocol

logger = logging.getLogger(__name__)

# Application error code on RESET_STREAM / STOP_SENDING when the local socket went away.
ERROR_SOCKET_CLOSED = 0x1


class StreamBridge(asyncio.Protocol):
    """asyncio protocol of the local socket, bound to one stream of a ``TunnelProtocol``."""

    def __init__(self, peer: str, side: str) -> None:
        self.peer = peer
        self.side = side
        self.tunnel: TunnelProtocol | None = None
        self.stream_id: int | None = None
        self.transport: asyncio.Transport | None = None
        # Bytes received from QUIC and handed to the socket (or queued until it exists).
        self.delivered = 0
        # Bytes read from the socket and given to QUIC.
        self.forwarded = 0
        # QUIC → TCP bytes not yet written: coalesced until the tunnel flushes after a datagram batch,
        # one socket write per batch instead of one per packet (each wakes gRPC's poller thread).
        self._queued: list[bytes] = []
        self._queued_bytes = 0
        self._bytes_sent = metrics.BYTES.labels(peer, "sent")
        self._bytes_received = metrics.BYTES.labels(peer, "received")
        self._queued_eof = False
        self._reading_paused = False
        self._fin_sent = False
        self._fin_received = False
        self._finished = False
        self.closed = asyncio.get_running_loop().create_future()
        # The task wiring this bridge up (connecting the socket or the stream), kept referenced.
        self.task: asyncio.Task[None] | None = None

    # -- wiring -------------------------------------------------------------------------------

    def attach(self, tunnel: TunnelProtocol, stream_id: int) -> None:
        """Bind to a stream; the socket starts being read if it is connected."""
        self.tunnel = tunnel
        self.stream_id = stream_id
        tunnel.register(stream_id, self)
        metrics.STREAMS.labels(self.peer, self.side).inc()
        if self.transport is not None and self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()

    def backlog(self) -> int:
        """Bytes received from QUIC that the socket has not taken yet."""
        if self.transport is None:
            return self._queued_bytes
        return self._queued_bytes + self.transport.get_write_buffer_size()

    # -- TCP side (asyncio.Protocol) ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport: asyncio's, or uvloop's (which does not subclass asyncio.Transport).
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        if self._finished:  # the stream was reset while this socket was still connecting
            transport.abort()
            return
        # Let the socket buffer up to a window's worth before asyncio reports it full.
        transport.set_write_buffer_limits(high=256 * 1024)
        if self.tunnel is None:
            transport.pause_reading()
            self._reading_paused = True
        self.flush()

    def data_received(self, data: bytes) -> None:
        tunnel, stream_id = self.tunnel, self.stream_id
        if tunnel is None or stream_id is None or self._fin_sent:
            return
        tunnel.send(stream_id, data)
        self.forwarded += len(data)
        self._bytes_sent.inc(len(data))
        if tunnel.send_buffered(stream_id) > tunnel.send_buffer_high and self.transport is not None:
            self.transport.pause_reading()
            self._reading_paused = True
            tunnel.watch_send_buffer(self)

    def maybe_resume_reading(self) -> bool:
        """Called by the tunnel after transmitting; True once reading resumed."""
        tunnel, stream_id = self.tunnel, self.stream_id
        if tunnel is None or stream_id is None or self.transport is None or self._finished:
            return True
        if tunnel.send_buffered(stream_id) <= tunnel.send_buffer_high // 4:
            self._reading_paused = False
            self.transport.resume_reading()
            return True
        return False

    def eof_received(self) -> bool:
        if self.tunnel is not None and self.stream_id is not None and not self._fin_sent:
            self._fin_sent = True
            self.tunnel.send(self.stream_id, b"", end_stream=True)
        if self._fin_received and self.transport is not None:
            self.transport.close()  # both directions are done
        return True  # keep the socket open for the other direction

    def pause_writing(self) -> None:
        return  # credit is computed from backlog(); nothing to do until it drains

    def resume_writing(self) -> None:
        # The socket drained: let the tunnel send the credit it now allows.
        if self.tunnel is not None:
            self.tunnel.transmit_soon()

    def connection_lost(self, exc: Exception | None) -> None:
        logger.debug("socket of stream %s (%s) closed: %r", self.stream_id, self.side, exc)
        tunnel, stream_id = self.tunnel, self.stream_id
        if not self._finished and tunnel is not None and stream_id is not None:
            if not self._fin_sent:
                if exc is None:
                    tunnel.send(stream_id, b"", end_stream=True)
                else:
                    tunnel.reset(stream_id, ERROR_SOCKET_CLOSED)
                    metrics.RESETS.labels(self.peer, self.side).inc()
            if not self._fin_received:
                tunnel.stop(stream_id, ERROR_SOCKET_CLOSED)
            self._fin_sent = True
        self._finish()

    # -- QUIC side (called by TunnelProtocol) --------------------------------------------------

    def on_stream_data(self, data: bytes, end_stream: bool) -> None:
        if data:
            self.delivered += len(data)
            self._bytes_received.inc(len(data))
            self._queued.append(data)
            self._queued_bytes += len(data)
        if end_stream:
            self._fin_received = True
            self._queued_eof = True
        if self.tunnel is not None:
            self.tunnel.flush_later(self)

    def flush(self) -> None:
        """Write what QUIC delivered since the last flush to the socket in one go."""
        transport = self.transport
        if transport is None:
            return
        if self._queued:
            if not transport.is_closing():
                transport.write(b"".join(self._queued) if len(self._queued) > 1 else self._queued[0])
            self._queued.clear()
            self._queued_bytes = 0
        if self._queued_eof:
            self._queued_eof = False
            self._write_eof()

    def on_stream_reset(self, reason: str) -> None:
        """The peer reset the stream (or the whole connection ended): drop the socket."""
        logger.debug("stream %s to %s reset: %s", self.stream_id, self.peer, reason)
        if self.tunnel is not None and self.stream_id is not None and not self._fin_sent:
            self.tunnel.reset(self.stream_id, ERROR_SOCKET_CLOSED)
        self._fin_sent = self._fin_received = True
        if self.transport is not None:
            self.transport.abort()
        self._finish()

    def _write_eof(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self._fin_sent:
            transport.close()  # both directions are done
        elif transport.can_write_eof():
            transport.write_eof()
        else:
            transport.close()

    def _finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        if self.tunnel is not None and self.stream_id is not None:
            self.tunnel.unregister(self.stream_id)
            metrics.STREAMS.labels(self.peer, self.side).dec()
        if not self.closed.done():
            self.closed.set_result(None)
