"""Gateway-local copies of what the cache and the policy service answered: exact response hits
and input verdicts, served without a call when the gateway can prove they are still current.

A copy is kept only if its source said which versions it depends on, and it is served only if:

* the :class:`~services.runtime.invalidations.VersionWatch` was connected before the source was
  read and has seen no push for any of those version keys since (no bump, expiry, flush, lost
  connection), and a barrier started after the request arrived confirms that (so a bump
  acknowledged anywhere before this request is applied here first);
* the caller's floors are at most the copy's versions, and the copy's age (bounded from above:
  the age the cache reported plus the time since the lookup was sent) is below the caller's
  max-age and its remaining lifetime in the cache.

Anything else goes to the service, exactly as without local copies. Copies are bounded in bytes,
per tenant and in all (least recently used goes first), so one tenant cannot push out the others.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from services.runtime.invalidations import Mark, VersionWatch
from services.runtime.versions import version_key

V = TypeVar("V")

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_TENANT_BYTES = 8 * 1024 * 1024


def digest(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=20)
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.digest()


@dataclass(slots=True)
class Copy(Generic[V]):
    value: V
    stamps: dict[str, int]
    keys: tuple[str, ...]
    size: int
    # Upper bound of the age: age_ms at the monotonic time t0 (when the read was sent).
    age_ms: int
    t0: float
    # Monotonic time after which the source would no longer serve it.
    expires: float


@dataclass(slots=True)
class _Tenant:
    copies: OrderedDict[bytes, Copy[object]] = field(default_factory=OrderedDict)
    size: int = 0


class LocalCopies(Generic[V]):
    """Bounded per-tenant copies, dropped by the watch's pushes (module doc)."""

    def __init__(
        self,
        watch: VersionWatch,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        tenant_bytes: int = DEFAULT_TENANT_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.watch = watch
        self.max_bytes = max_bytes
        self.tenant_bytes = min(tenant_bytes, max_bytes)
        self._clock = clock
        self._tenants: dict[str, _Tenant] = {}
        self._lru: OrderedDict[tuple[str, bytes], None] = OrderedDict()
        self._by_key: dict[str, set[tuple[str, bytes]]] = {}
        self.size = 0
        # What happened to the copies (tests and benchmarks read these).
        self.hits = 0
        self.kept = 0
        self.refused = 0
        watch.subscribe(self._invalidated)

    def __len__(self) -> int:
        return len(self._lru)

    # -- reads ---------------------------------------------------------------------------------

    def peek(
        self, tenant: str, key: bytes, floor_for: Callable[[str], int], max_age_ms: int | None
    ) -> Copy[V] | None:
        """The copy if nothing local rules it out (the caller still needs a barrier)."""
        bucket = self._tenants.get(tenant)
        copy = None if bucket is None else bucket.copies.get(key)
        if copy is None:
            return None
        now = self._clock()
        if now >= copy.expires:
            self._drop(tenant, key)
            return None
        if max_age_ms is not None and _age_ms(copy, now) >= max_age_ms:
            return None
        for namespace, version in copy.stamps.items():
            if version < floor_for(namespace):
                return None
        return copy  # type: ignore[return-value]

    async def get(
        self, tenant: str, key: bytes, floor_for: Callable[[str], int], max_age_ms: int | None
    ) -> tuple[Copy[V], int] | None:
        """A copy proven current (module doc) and its age in ms, or None (ask the source)."""
        if self.peek(tenant, key, floor_for, max_age_ms) is None:
            return None
        if not await self.watch.barrier():
            return None
        # Pushes applied during the barrier may have dropped it; limits are checked again.
        copy = self.peek(tenant, key, floor_for, max_age_ms)
        if copy is None:
            return None
        bucket = self._tenants[tenant]
        bucket.copies.move_to_end(key)
        self._lru.move_to_end((tenant, key))
        self.hits += 1
        return copy, _age_ms(copy, self._clock())

    # -- writes --------------------------------------------------------------------------------

    def put(
        self,
        tenant: str,
        key: bytes,
        value: V,
        *,
        stamps: Mapping[str, int],
        extra_keys: Sequence[str] = (),
        mark: Mark | None,
        t0: float,
        age_ms: int,
        ttl_ms: int,
        size: int,
    ) -> bool:
        """Keeps ``value`` if the watch saw nothing change since ``mark`` (taken before the read
        that produced it, at monotonic time ``t0``); False when it cannot be kept."""
        keys = tuple(version_key(tenant, ns) for ns in stamps) + tuple(extra_keys)
        if mark is None or ttl_ms <= 0 or size > self.tenant_bytes or self.watch.changed_since(mark, keys):
            self.refused += 1
            return False
        self.kept += 1
        self._drop(tenant, key)
        copy: Copy[object] = Copy(value, dict(stamps), keys, size, age_ms, t0, t0 + ttl_ms / 1000)
        bucket = self._tenants.setdefault(tenant, _Tenant())
        bucket.copies[key] = copy
        bucket.size += size
        self.size += size
        self._lru[(tenant, key)] = None
        for name in keys:
            self._by_key.setdefault(name, set()).add((tenant, key))
        while bucket.size > self.tenant_bytes and bucket.copies:
            self._drop(tenant, next(iter(bucket.copies)))
        while self.size > self.max_bytes and self._lru:
            self._drop(*next(iter(self._lru)))
        return True

    def clear(self) -> None:
        self._tenants.clear()
        self._lru.clear()
        self._by_key.clear()
        self.size = 0

    def _invalidated(self, keys: Sequence[str] | None) -> None:
        if keys is None:
            self.clear()
            return
        for name in keys:
            for tenant, key in list(self._by_key.get(name, ())):
                self._drop(tenant, key)

    def _drop(self, tenant: str, key: bytes) -> None:
        bucket = self._tenants.get(tenant)
        if bucket is None:
            return
        copy = bucket.copies.pop(key, None)
        if copy is None:
            return
        bucket.size -= copy.size
        self.size -= copy.size
        self._lru.pop((tenant, key), None)
        for name in copy.keys:
            holders = self._by_key.get(name)
            if holders is not None:
                holders.discard((tenant, key))
                if not holders:
                    del self._by_key[name]
        if not bucket.copies:
            del self._tenants[tenant]


def _age_ms(copy: Copy[Any], now: float) -> int:
    """The copy's age at ``now``, never understated (its read happened after ``t0``)."""
    return copy.age_ms + math.ceil((now - copy.t0) * 1000)
