"""Settings for how the gateway bounds its waits on upstreams that stop answering.

A mixin of :class:`gateway.config.GatewaySettings` (same ``LLMESH_GATEWAY_*``
environment names and YAML section), kept in its own module so the fault
settings stay beside each other.
"""

from __future__ import annotations

from pydantic import BaseModel


class ResilienceSettings(BaseModel):
    """Per-call bounds on cache calls, first-token overdue detection, inference keepalive."""

    # A cache read (response lookup, session read) that has not answered within this many
    # seconds triggers a health probe of the cache (same bound); a cache that does not answer
    # the probe either is treated as down for this call (BYPASS). A live cache (e.g. a
    # single-flight waiter) is waited for, up to the request deadline.
    cache_timeout_s: float = 0.3
    # The same bound for cache writes (StoreResponse, AppendTurns, ReleaseLease).
    cache_write_timeout_s: float = 1.5
    # A stream whose first token is overdue (breaker_ttft_factor x the replica's TTFT norm,
    # at least first_token_floor_s; first_token_cold_s while the norm is not yet known)
    # counts as a breaker failure and, if another replica is eligible, is retried there.
    first_token_floor_s: float = 2.0
    first_token_cold_s: float = 30.0
    # HTTP/2 keepalive on the inference channels: a replica that stops answering pings
    # (frozen, partitioned) breaks its health stream and leaves the ring within time + timeout.
    inference_keepalive_time_ms: int = 5_000
    inference_keepalive_timeout_ms: int = 2_000
