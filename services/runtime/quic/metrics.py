"""Prometheus metrics of the QUIC transport (``llmesh_quic_*``).

``peer`` is the upstream's ``quic://host:port`` on the client side and ``server`` on the server side,
so the label stays bounded by the number of configured upstreams.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

RTT = Gauge("llmesh_quic_rtt_seconds", "Smoothed round-trip time of the QUIC connection", ["peer"])
MIN_RTT = Gauge(
    "llmesh_quic_min_rtt_seconds", "Minimum round-trip time seen on the QUIC connection", ["peer"]
)
CWND = Gauge("llmesh_quic_congestion_window_bytes", "Congestion window of the QUIC connection", ["peer"])
IN_FLIGHT = Gauge("llmesh_quic_bytes_in_flight", "Unacknowledged bytes in flight", ["peer"])
STREAMS = Gauge("llmesh_quic_streams_active", "QUIC streams carrying a gRPC connection", ["peer", "side"])
CONNECTED = Gauge("llmesh_quic_connected", "1 while a QUIC connection to the upstream is up", ["peer"])
BYTES = Counter(
    "llmesh_quic_stream_bytes_total", "Payload bytes carried over QUIC streams", ["peer", "direction"]
)
LOST = Counter("llmesh_quic_lost_packets_total", "Packets declared lost by loss detection", ["peer"])
SPURIOUS = Counter(
    "llmesh_quic_spurious_losses_total", "Packets declared lost that arrived after all (reordering)", ["peer"]
)
MIGRATIONS = Counter(
    "llmesh_quic_migrations_total", "Client address changes (connection migration)", ["peer"]
)
RECONNECTS = Counter("llmesh_quic_connects_total", "QUIC connection attempts by outcome", ["peer", "outcome"])
RESETS = Counter(
    "llmesh_quic_stream_resets_total", "Streams reset (the gRPC connection is then closed)", ["peer", "side"]
)
KEEPALIVE_FAILURES = Counter(
    "llmesh_quic_keepalive_failures_total", "Keepalive PINGs that got no answer in time", ["peer"]
)
