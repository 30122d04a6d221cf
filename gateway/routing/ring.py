"""Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018).

Each replica owns ``virtual_nodes`` points on a 64-bit ring. A key goes to the
first replica clockwise from its hash whose load stays within
``ceil(load_factor * (total_load + 1) / replicas)``, so a hot key spills to the
next replica instead of piling onto one, and a replica leaving the ring moves
only its own keys.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Callable, Collection


def _point(label: str) -> int:
    return int.from_bytes(hashlib.blake2b(label.encode(), digest_size=8).digest(), "big")


class HashRing:
    """Replica ids on a ring; lookups honour a load bound and an eligibility set."""

    def __init__(self, virtual_nodes: int = 64, load_factor: float = 1.25) -> None:
        if virtual_nodes <= 0 or load_factor < 1.0:
            raise ValueError("virtual_nodes must be > 0 and load_factor >= 1")
        self._vnodes = virtual_nodes
        self.load_factor = load_factor
        self._points: list[int] = []
        self._owners: list[str] = []
        self._members: set[str] = set()

    @property
    def members(self) -> frozenset[str]:
        return frozenset(self._members)

    def add(self, replica: str) -> None:
        if replica in self._members:
            return
        self._members.add(replica)
        for i in range(self._vnodes):
            point = _point(f"{replica}#{i}")
            at = bisect.bisect(self._points, point)
            self._points.insert(at, point)
            self._owners.insert(at, replica)

    def remove(self, replica: str) -> None:
        if replica not in self._members:
            return
        self._members.discard(replica)
        keep = [(p, o) for p, o in zip(self._points, self._owners, strict=True) if o != replica]
        self._points = [p for p, _ in keep]
        self._owners = [o for _, o in keep]

    def bound(self, total_load: int, replicas: int) -> int:
        """Most requests one replica may hold when one more arrives."""
        return max(1, math.ceil(self.load_factor * (total_load + 1) / max(1, replicas)))

    def within_bound(self, replica: str, load: Callable[[str], int], eligible: Collection[str]) -> bool:
        total = sum(load(r) for r in eligible)
        return load(replica) < self.bound(total, len(eligible))

    def lookup(self, key: int, load: Callable[[str], int], eligible: Collection[str]) -> str | None:
        """The first eligible replica clockwise from ``key`` under the load bound (None if none)."""
        candidates = [r for r in eligible if r in self._members]
        if not candidates:
            return None
        limit = self.bound(sum(load(r) for r in candidates), len(candidates))
        start = bisect.bisect(self._points, key % (1 << 64))
        tried: set[str] = set()
        for i in range(len(self._points)):
            owner = self._owners[(start + i) % len(self._points)]
            if owner in tried or owner not in candidates:
                continue
            if load(owner) < limit:
                return owner
            tried.add(owner)
            if len(tried) == len(candidates):
                break
        # Every replica is at the bound (cannot happen with factor >= 1, but loads race): least loaded.
        return min(candidates, key=load)
