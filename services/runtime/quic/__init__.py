"""QUIC transport for cross-zone links: gRPC's HTTP/2 bytes carried over QUIC streams.

* ``start_server_endpoint(grpc_target, listen, settings)`` — QUIC listener forwarding each stream to a
  local gRPC port (``services.runtime.entry`` starts it when ``quic_port`` > 0).
* ``client_endpoint_for(quic_url, settings)`` — ``"127.0.0.1:PORT"`` a gRPC channel dials instead of
  ``quic://host:port`` (``services.runtime.channels.connect`` calls it).
"""

from services.runtime.quic.client import (
    ClientEndpoint,
    QuicConnectError,
    QuicHandshakeError,
    client_endpoint_for,
    close_client_endpoints,
    get_client_endpoint,
)
from services.runtime.quic.config import QuicSettings
from services.runtime.quic.server import ServerEndpoint, start_server_endpoint

__all__ = [
    "ClientEndpoint",
    "QuicConnectError",
    "QuicHandshakeError",
    "QuicSettings",
    "ServerEndpoint",
    "client_endpoint_for",
    "close_client_endpoints",
    "get_client_endpoint",
    "start_server_endpoint",
]
