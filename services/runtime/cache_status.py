"""How a request was served with respect to the response cache.

One enum for every representation: the proto ``llmesh.v1.CacheStatus`` on the
wire, the ``x-llmesh-cache-status`` trailer and ``x-cache-status`` header (the
member's value), and the cache service's lookup results.
"""

from __future__ import annotations

import enum

from llmesh.v1 import common_pb2


class CacheStatus(enum.StrEnum):
    """HIT: served from the cache; MISS: none stored; STALE: one stored but outside the
    caller's bounds; BYPASS: the cache was not used (not cacheable, down, not configured)."""

    HIT = "HIT"
    MISS = "MISS"
    STALE = "STALE"
    BYPASS = "BYPASS"

    def to_pb(self) -> common_pb2.CacheStatus:
        """The proto enum value of this status."""
        return _TO_PB[self]

    @classmethod
    def from_pb(cls, value: common_pb2.CacheStatus) -> CacheStatus | None:
        """The status of a proto enum value; None for ``CACHE_STATUS_UNSPECIFIED`` (or a value
        this build does not know, from a newer peer)."""
        return _FROM_PB.get(value)


def status_pb(status: CacheStatus | None) -> common_pb2.CacheStatus:
    """The proto value of an optional status (``CACHE_STATUS_UNSPECIFIED`` for None)."""
    return common_pb2.CACHE_STATUS_UNSPECIFIED if status is None else status.to_pb()


_TO_PB: dict[CacheStatus, common_pb2.CacheStatus] = {
    CacheStatus.HIT: common_pb2.CACHE_STATUS_HIT,
    CacheStatus.MISS: common_pb2.CACHE_STATUS_MISS,
    CacheStatus.STALE: common_pb2.CACHE_STATUS_STALE,
    CacheStatus.BYPASS: common_pb2.CACHE_STATUS_BYPASS,
}
_FROM_PB: dict[common_pb2.CacheStatus, CacheStatus] = {pb: status for status, pb in _TO_PB.items()}


def describe_match(semantic: bool, similarity: float = 0.0, verifier: str = "", score: float = 0.0) -> str:
    """How a HIT matched, as the ``x-llmesh-cache-match`` trailer and ``X-Cache-Match`` say it:
    ``exact``, or ``semantic; similarity=S[; verifier=NAME; score=V]``."""
    if not semantic:
        return "exact"
    text = f"semantic; similarity={similarity:.3f}"
    if verifier:
        text += f"; verifier={verifier}; score={score:.3f}"
    return text
