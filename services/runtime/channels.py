"""Channels to other llmesh services, each with the context-propagating interceptors.

An upstream address is one of:

- ``host:port``: one instance (gRPC's default ``pick_first``);
- ``10.0.0.1:7001,10.0.0.2:7001``: several instances, IP literals (``localhost`` is
  taken as ``127.0.0.1``; IPv6 as ``[::1]:7001``), all of one family;
- ``dns:///name:port``: every address the name resolves to (a Kubernetes headless
  Service), re-resolved by gRPC when a connection drops;
- ``quic://host:port``: one instance across zones over the QUIC transport
  (``services.runtime.quic``).

A list or a ``dns:`` target gets the ``round_robin`` balancer with gRPC's client-side
health checking on the service's own health status: an instance that drains
(``NOT_SERVING`` at SIGTERM, see ``services.runtime.server``) stops getting new calls
as soon as its health stream says so, while its calls in flight finish.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from typing import Any

import grpc

from services.runtime.interceptors import client_interceptors
from services.runtime.tls import TLSSettings, tls_settings

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Target:
    """What gRPC gets for an address, and whether it spans several instances."""

    target: str
    balanced: bool = False
    quic: bool = False


def _endpoint(part: str, address: str) -> tuple[int, str]:
    """(IP version, ``ip:port`` as gRPC's ipv4:/ipv6: schemes want it) of one list entry."""
    host, sep, port = part.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{address!r}: {part!r} is not host:port")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{address!r}: {part!r} has no valid port (1-65535)")
    bracketed = host.startswith("[") and host.endswith("]")
    if host == "localhost":
        host = "127.0.0.1"
    try:
        ip = ipaddress.ip_address(host[1:-1] if bracketed else host)
    except ValueError:
        raise ValueError(
            f"{address!r}: {host!r} is not an IP address; a list of instances takes IP addresses "
            "(for a name that resolves to several, use dns:///name:port)"
        ) from None
    if ip.version == 6 and not bracketed:
        raise ValueError(f"{address!r}: write an IPv6 address in brackets, e.g. [{ip}]:{port}")
    return ip.version, f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def parse_address(address: str) -> Target:
    """The gRPC target for an upstream address setting; ValueError says what is wrong with it."""
    address = address.strip()
    if not address:
        raise ValueError("empty address")
    if address.startswith("quic://"):
        if "," in address:
            raise ValueError(
                f"{address!r}: a quic:// address names one instance (list several instances only "
                "on direct gRPC addresses)"
            )
        return Target(address, quic=True)
    if address.startswith("dns:"):
        name = address.rsplit("/", 1)[-1]
        if "," in address or not name or name.startswith(":"):
            raise ValueError(f"{address!r}: write a DNS target as dns:///name:port")
        return Target(address, balanced=True)
    scheme = ""
    body = address
    if address.startswith(("ipv4:", "ipv6:")):
        scheme, body = address[:4], address[5:]
    elif "," not in address:
        return Target(address)
    parts = [p.strip() for p in body.split(",")]
    if any(not p for p in parts):
        raise ValueError(f"{address!r}: empty entry in the list of instances")
    endpoints = [_endpoint(p, address) for p in parts]
    versions = {v for v, _ in endpoints}
    if len(versions) > 1:
        raise ValueError(f"{address!r}: mixes IPv4 and IPv6 instances; list one family")
    version = versions.pop()
    if scheme and scheme != f"ipv{version}":
        raise ValueError(f"{address!r}: {scheme}: target with IPv{version} addresses")
    names = [e for _, e in endpoints]
    twice = sorted({e for e in names if names.count(e) > 1})
    if twice:
        raise ValueError(f"{address!r}: {', '.join(twice)} listed more than once")
    return Target(f"ipv{version}:{','.join(names)}", balanced=True)


def validate_address(value: str) -> str:
    """For settings validators: the address stripped, empty allowed (the upstream is off)."""
    value = value.strip()
    if value:
        parse_address(value)
    return value


def balanced_service_config(health_service: str) -> str:
    """round_robin over every instance, each checked with grpc.health.v1 for ``health_service``."""
    return json.dumps(
        {
            "loadBalancingConfig": [{"round_robin": {}}],
            "healthCheckConfig": {"serviceName": health_service},
        }
    )


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


async def connect(
    address: str,
    *,
    health_service: str = "",
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    tls: TLSSettings | None = None,
) -> grpc.aio.Channel:
    """A channel to ``address`` with llmesh's client interceptors (TLS when ``LLMESH_TLS_*`` say so,
    or as ``tls`` says when given).

    ``health_service`` is the full name of the service called (``llmesh.v1.PolicyService``):
    with several instances, each is health-checked for it ("" = the server as a whole).
    """
    parsed = parse_address(address)
    target = parsed.target
    options = channel_options(max_message_bytes)
    interceptors = client_interceptors()
    if parsed.quic:
        from services.runtime.quic import client_endpoint_for
        from services.runtime.quic.tracing import transport_interceptors

        target = await client_endpoint_for(address.strip())
        interceptors += transport_interceptors(address.strip())
    if parsed.balanced:
        options += [
            ("grpc.service_config", balanced_service_config(health_service)),
            # The balancing comes from our setting, never from a DNS TXT record.
            ("grpc.service_config_disable_resolution", 1),
        ]
    tls = tls or tls_settings()
    if tls.enabled:
        if tls.server_name:
            options.append(("grpc.ssl_target_name_override", tls.server_name))
        return grpc.aio.secure_channel(
            target, tls.channel_credentials(), options=options, interceptors=interceptors
        )
    return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
