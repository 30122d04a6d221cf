"""Settings for how the gateway bounds its waits on upstreams that stop answering.

A mixin of :class:`gateway.config.GatewaySettings` (same ``LLMESH_GATEWAY_*``
environment names and YAML section), kept in its own module so the fault
settings stay beside each other.
"""

from __future__ import annotations

from pydantic import BaseModel


class ResilienceSettings(BaseModel):
    """Per-call bounds on cache calls, first-token overdue detection, inference liveness probes."""

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
    # Liveness of inference replicas: a health check every probe_interval_s that must answer
    # within probe_timeout_s. A replica that does not (frozen, wedged event loop, partitioned:
    # its connection and health stream stay open) leaves the ring, and its calls in flight are
    # cut: before their first token they move to another replica, mid-stream they end with
    # a clear error. It rejoins when its health stream says SERVING again.
    inference_probe_interval_s: float = 1.0
    inference_probe_timeout_s: float = 2.0
