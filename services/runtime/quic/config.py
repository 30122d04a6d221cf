"""Settings of the QUIC transport and the aioquic configuration built from them.

Environment: ``LLMESH_QUIC_<NAME>`` (e.g. ``LLMESH_QUIC_CA_FILE``); the ``quic`` section of the
``LLMESH_CONFIG`` YAML file may override. Defaults point at what ``llmesh certs create`` writes.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import ClassVar
from urllib.parse import parse_qs, urlsplit

from aioquic.quic.configuration import QuicConfiguration
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.runtime.certs import default_cert_dir
from services.runtime.quic import congestion
from services.runtime.settings import SectionSettings

ALPN = "llmesh-grpc-tunnel/1"


class QuicSettings(SectionSettings):
    """TLS material and tuning of both ends of the tunnel."""

    model_config = SettingsConfigDict(env_prefix="LLMESH_QUIC_", extra="ignore")
    service_name: ClassVar[str] = "quic"

    # Trust anchor the client verifies servers against (PEM). Empty: <data_dir>/certs/ca.pem.
    ca_file: str = ""
    # Certificate chain and key (PEM) this process serves with and, as a client, presents (the
    # server endpoint requires one; its Common Name is the identity services authorise).
    # Empty: <data_dir>/certs/<cert_name>.pem/.key.
    cert_file: str = ""
    key_file: str = ""
    # Empty: the service's own name (see for_service; services.runtime.entry sets it for the
    # whole process), as `llmesh certs create` names the files.
    cert_name: str = ""
    # Peer verification is on unless explicitly turned off (development only).
    verify: bool = True
    # Name checked against the server certificate; empty: the host of the quic:// URL.
    server_name: str = ""
    # Receive windows. Credit is handed back only as the local TCP side drains (backpressure), so
    # these bound memory per stream/connection; they must exceed the bandwidth-delay product.
    stream_window: int = 8 * 1024 * 1024
    connection_window: int = 32 * 1024 * 1024
    # Most bytes a gRPC socket may have waiting in its QUIC stream's send buffer before reading
    # pauses (the live limit is 2 x the congestion window, at least 64 KB). Must exceed what is in
    # flight (bandwidth x RTT); larger costs CPU (aioquic's buffer is one bytearray that appends
    # re-copy: ~2 ms per write at 4 MB) and holds more stale bytes after a cancelled call.
    send_buffer_high: int = 1024 * 1024
    congestion_control: str = congestion.NAME
    # UDP payload; 1350 fits the usual tunnels and VPNs without path-MTU discovery.
    max_datagram_size: int = 1350
    idle_timeout_s: float = 30.0
    keepalive_interval_s: float = 5.0
    keepalive_timeout_s: float = 10.0
    connect_timeout_s: float = 5.0
    reconnect_backoff_max_s: float = 5.0
    # 0-RTT sends the first request before the handshake completes; replayable, so opt-in.
    zero_rtt: bool = False
    initial_rtt_s: float = Field(default=0.1, gt=0)
    # Create the UDP socket inside this network namespace (/run/netns/NAME); empty: the current one.
    # For hosts that keep the cross-zone interface in its own namespace, and the link emulator.
    netns: str = ""

    @classmethod
    def for_service(cls, service_name: str) -> QuicSettings:
        """Settings from the environment, with the service's own certificate unless one is named."""
        settings = cls()
        return settings if settings.cert_name else settings.model_copy(update={"cert_name": service_name})

    def ca_path(self) -> Path:
        return Path(self.ca_file) if self.ca_file else default_cert_dir() / "ca.pem"

    def cert_paths(self) -> tuple[Path, Path]:
        name = self.cert_name or "inference"
        cert = Path(self.cert_file) if self.cert_file else default_cert_dir() / f"{name}.pem"
        key = Path(self.key_file) if self.key_file else cert.with_suffix(".key")
        return cert, key


def _base(settings: QuicSettings, *, is_client: bool) -> QuicConfiguration:
    return QuicConfiguration(
        is_client=is_client,
        alpn_protocols=[ALPN],
        congestion_control_algorithm=settings.congestion_control,
        idle_timeout=settings.idle_timeout_s,
        max_data=settings.connection_window,
        max_stream_data=settings.stream_window,
        max_datagram_size=settings.max_datagram_size,
        initial_rtt=settings.initial_rtt_s,
    )


def server_configuration(settings: QuicSettings) -> QuicConfiguration:
    """aioquic configuration of the server endpoint: its certificate chain, and the CA every
    client's certificate must chain to (required: ``services.runtime.quic.peer_auth``)."""
    cert, key = settings.cert_paths()
    configuration = _base(settings, is_client=False)
    configuration.load_cert_chain(str(cert), str(key))
    configuration.verify_mode = ssl.CERT_REQUIRED
    configuration.load_verify_locations(cafile=str(settings.ca_path()))
    return configuration


def client_configuration(settings: QuicSettings, server_name: str) -> QuicConfiguration:
    """aioquic configuration of the client endpoint: the server verified against the CA file, and
    this process's certificate (the same files as its server certificate) for the server to
    verify. Without one (no such files) the server refuses the connection."""
    configuration = _base(settings, is_client=True)
    configuration.server_name = settings.server_name or server_name
    cert, key = settings.cert_paths()
    if settings.cert_file or cert.exists():
        configuration.load_cert_chain(str(cert), str(key))
    if settings.verify:
        configuration.verify_mode = ssl.CERT_REQUIRED
        configuration.load_verify_locations(cafile=str(settings.ca_path()))
    else:
        configuration.verify_mode = ssl.CERT_NONE
    return configuration


def parse_quic_url(url: str) -> tuple[str, int, str | None]:
    """``quic://host:port[?server_name=NAME]`` → (host, port, server name override)."""
    parts = urlsplit(url)
    if parts.scheme != "quic" or not parts.hostname or parts.port is None:
        raise ValueError(f"not a quic://host:port address: {url!r}")
    names = parse_qs(parts.query).get("server_name")
    return parts.hostname, parts.port, names[0] if names else None


def parse_listen(listen: str) -> tuple[str, int]:
    """``host:port`` / ``[v6]:port`` / ``:port`` → (host, port); an empty host means all IPv4."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)
