"""A UDP transport that reads datagrams in batches.

asyncio's datagram transport reads one datagram per readiness callback, and aioquic's protocol builds
and sends packets after every datagram it receives: at a few thousand packets per second most of the
event loop's time goes into packet building for one ACK each. This transport drains up to
``BATCH`` datagrams per wakeup, handing each to the protocol; the protocol (``TunnelProtocol``)
defers its transmit with ``call_soon``, so a burst of datagrams costs one transmit, one ACK frame
covering them all and one timer re-arm.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import socket
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger(__name__)

BATCH = 64
_RECV_SIZE = 65535
_CLONE_NEWNET = 0x40000000
SOCKET_BUFFER = 8 * 1024 * 1024
# Linux values; Python 3.11's socket module does not name them.
_SO_SNDBUFFORCE = 32
_SO_RCVBUFFORCE = 33


class BatchedUdpTransport(asyncio.DatagramTransport):
    """Minimal ``asyncio.DatagramTransport`` over a non-blocking UDP socket, batched reads."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol: asyncio.DatagramProtocol
    ) -> None:
        super().__init__()
        self._loop = loop
        self._sock = sock
        self._protocol = protocol
        self._closing = False
        sock.setblocking(False)
        _grow_buffers(sock)
        loop.add_reader(sock.fileno(), self._read_ready)
        protocol.connection_made(self)

    def _read_ready(self) -> None:
        for _ in range(BATCH):
            try:
                data, addr = self._sock.recvfrom(_RECV_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                # ICMP errors surface here; QUIC's own loss detection handles them.
                self._protocol.error_received(exc)
                return
            self._protocol.datagram_received(data, addr)
            if self._closing:
                return

    def sendto(self, data: bytes | bytearray | memoryview, addr: Any = None) -> None:
        if self._closing:
            return
        try:
            self._sock.sendto(data, addr)
        except (BlockingIOError, InterruptedError):
            # A full socket buffer drops the datagram, as the network would; QUIC recovers it.
            pass
        except OSError as exc:
            self._protocol.error_received(exc)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "sockname":
            return self._sock.getsockname()
        if name == "socket":
            return self._sock
        return default

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        self._loop.call_soon(self._protocol.connection_lost, None)

    def abort(self) -> None:
        self.close()


def _grow_buffers(sock: socket.socket) -> None:
    # Bursts at tens of MB/s overflow the default ~200 KB receive buffer while the event loop is busy,
    # and every overflow is a loss to congestion control. The *FORCE options (CAP_NET_ADMIN) pass the
    # net.core.[rw]mem_max cap; without the capability the capped size is what we get.
    forced = ((_SO_RCVBUFFORCE, socket.SO_RCVBUF), (_SO_SNDBUFFORCE, socket.SO_SNDBUF))
    for force, plain in forced:
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, SOCKET_BUFFER)
        except OSError:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, plain, SOCKET_BUFFER)


def _setns(fd: int) -> None:
    if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


@contextlib.contextmanager
def in_netns(name: str) -> Iterator[None]:
    """Run the body inside network namespace ``name`` (``/run/netns/NAME``); keep it synchronous.

    Only this thread switches, and only for the body: a socket created there stays in that namespace.
    """
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(target)
        os.close(own)


def udp_socket(host: str, port: int, netns: str = "") -> socket.socket:
    """A UDP socket bound to ``host:port`` (port 0: any), created in ``netns`` when given."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with in_netns(netns) if netns else contextlib.nullcontext():
        sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def open_udp(
    loop: asyncio.AbstractEventLoop, host: str, port: int, protocol: asyncio.DatagramProtocol, netns: str = ""
) -> BatchedUdpTransport:
    """Bind ``host:port`` (port 0: any; in ``netns`` if given) and attach ``protocol`` to it."""
    return BatchedUdpTransport(loop, udp_socket(host, port, netns), protocol)
