"""A per-replica circuit breaker: consecutive failures or a time to first token far
above the replica's norm open it; after ``open_s`` one trial request is let
through (half-open) and its outcome closes or reopens it.

"Far above the norm" is :meth:`CircuitBreaker.first_token_bound`: ``ttft_factor``
times the replica's TTFT norm, at least ``ttft_floor_s`` (a replica answering in
5 ms is not faulty at 60 ms), and ``ttft_cold_s`` until the norm is known — all
scaled by the replica's load when the request was sent (``1 + load``: the other
requests in flight there), because a busy replica is slow without being faulty.
The norm itself is kept per unit of load. Without that scaling a burst (every
first token queued behind the others) opened the breaker of a healthy replica, and
of the only one: requests failed with "no inference replica is available" exactly
when the mesh was busiest. The gateway also uses the bound to give up on a first
token that has not come at all (a frozen replica: no load makes that normal)."""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import Enum


class BreakerState(Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """Closed -> open on trouble; open -> half-open after a pause; half-open -> closed on success."""

    # TTFT samples before the norm is trusted, and the EWMA weight of a new sample.
    MIN_SAMPLES = 8
    ALPHA = 0.1

    def __init__(
        self,
        failures: int = 3,
        open_s: float = 10.0,
        ttft_factor: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        ttft_floor_s: float = 2.0,
        ttft_cold_s: float = 30.0,
    ) -> None:
        self._threshold = failures
        self._open_s = open_s
        self._ttft_factor = ttft_factor
        self._ttft_floor_s = ttft_floor_s
        self._ttft_cold_s = ttft_cold_s
        self._clock = clock
        self._failures = 0
        self._opened_at = 0.0
        self._trial_out = False
        self.state = BreakerState.CLOSED
        self.ttft_norm_s: float | None = None
        self._samples = 0

    def allows(self) -> bool:
        """True if a request may go to the replica now (takes the half-open trial slot)."""
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN and self._clock() - self._opened_at >= self._open_s:
            self.state = BreakerState.HALF_OPEN
            self._trial_out = False
        if self.state is BreakerState.HALF_OPEN and not self._trial_out:
            self._trial_out = True
            return True
        return False

    def available(self) -> bool:
        """Like :meth:`allows` without taking the trial slot (for ranking replicas)."""
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN:
            return self._clock() - self._opened_at >= self._open_s
        return not self._trial_out

    def success(self, ttft_s: float | None = None, *, load: int = 0, count_slow: bool = True) -> None:
        """An answer; its first token came after ``ttft_s`` with ``load`` other requests in
        flight on the replica. A slow one is a failure unless ``count_slow`` is false (the
        replica was the only one left: slow beats none)."""
        if ttft_s is not None and self._slow(ttft_s, load):
            if count_slow:
                self.failure()
            return
        self._failures = 0
        if self.state is not BreakerState.CLOSED:
            self.state = BreakerState.CLOSED
        if ttft_s is not None:
            sample = ttft_s / (1 + max(0, load))
            self._samples += 1
            self.ttft_norm_s = (
                sample
                if self.ttft_norm_s is None
                else (1 - self.ALPHA) * self.ttft_norm_s + self.ALPHA * sample
            )

    def failure(self) -> None:
        self._failures += 1
        if self.state is BreakerState.HALF_OPEN or self._failures >= self._threshold:
            self.state = BreakerState.OPEN
            self._opened_at = self._clock()
            self._trial_out = False

    def first_token_bound(self, load: int = 0) -> float:
        """Seconds after which a first token is overdue on this replica when ``load`` other
        requests were in flight there as it was sent."""
        scale = 1 + max(0, load)
        if self._samples < self.MIN_SAMPLES or self.ttft_norm_s is None:
            return self._ttft_cold_s * scale
        return max(self._ttft_factor * self.ttft_norm_s, self._ttft_floor_s) * scale

    def _slow(self, ttft_s: float, load: int) -> bool:
        return ttft_s > self.first_token_bound(load)
