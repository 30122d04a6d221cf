"""Channels to other llmesh services, each with the context-propagating interceptors.

An address is ``host:port``, or ``quic://host:port`` for a link that crosses zones
over the QUIC transport (``services.runtime.quic``).
"""

from __future__ import annotations

from typing import Any

import grpc

from services.runtime.interceptors import client_interceptors
from services.runtime.tls import tls_settings

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


def channel_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # Reconnect fast after a peer restarts (defaults back off up to 120 s).
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 5_000),
        ("grpc.enable_retries", 0),
    ]


async def connect(address: str, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> grpc.aio.Channel:
    """A channel to ``address`` with llmesh's client interceptors (TLS when ``LLMESH_TLS_*`` say so)."""
    target = address
    options = channel_options(max_message_bytes)
    interceptors = client_interceptors()
    if address.startswith("quic://"):
        from services.runtime.quic import client_endpoint_for
        from services.runtime.quic.tracing import transport_interceptors

        target = await client_endpoint_for(address)
        interceptors += transport_interceptors(address)
    tls = tls_settings()
    if tls.enabled:
        if tls.server_name:
            options.append(("grpc.ssl_target_name_override", tls.server_name))
        return grpc.aio.secure_channel(
            target, tls.channel_credentials(), options=options, interceptors=interceptors
        )
    return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
