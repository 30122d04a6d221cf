"""Per-key rate limits in Redis: requests per minute and tokens per minute.

Each limit is a token bucket kept in one Redis hash and updated by one Lua script
(atomic across gateway replicas; Redis' own clock, so gateways need no clock
agreement). Requests are charged one at admission. Tokens cannot be known before
the answer, so admission only checks that the token bucket is not in debt, and
the real usage is charged when the request ends (the bucket may go negative,
which holds later requests back until it refills). Redis down = limits are not
enforced (logged): the limiter must never take the API down.

A key allowed 1,200 requests a minute or more (two or more per ``LEASE_S``) does not
pay a Redis call per request: the gateway takes up to ``LEASE_S`` seconds' worth of its rate
from the bucket at once (at least one; fewer when the bucket holds fewer) and
spends them locally for at most ``LEASE_S``; one refill per key is in flight at a
time. No request is admitted that the bucket did not give, so every gateway
together stays within the limit; what a gateway leaves of a lease when it expires
is dropped (at most ``LEASE_S`` of the key's rate per gateway, refused to others
meanwhile). Keys allowed fewer requests a minute pay one call per request, as
before, and are refused at exactly their limit. Likewise a key allowed 1,200
tokens a minute or more reuses its bucket's "not in debt" answer for ``LEASE_S``
(until this gateway charges the key's tokens): a request that starts within
``LEASE_S`` of the bucket going into debt is admitted, as one in flight at that
moment already was, and its tokens are charged as every request's are.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any, Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.auth import Principal
from services.runtime import redis_client
from services.runtime.errors import ResourceExhausted

log = logging.getLogger(__name__)

# KEYS[1] bucket; ARGV: capacity, refill per second, cost, mode (1 = must fit, 0 = charge, -1 = peek
# debt, 2 = take up to cost, at least 1). Returns {allowed (0/1; mode 2: tokens taken), retry_after_ms}.
BUCKET_LUA = """
local cap = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local mode = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local state = redis.call('HMGET', KEYS[1], 'level', 'ts')
local level = tonumber(state[1])
local ts = tonumber(state[2])
if level == nil or ts == nil then
  level = cap
  ts = now
end
level = math.min(cap, level + (now - ts) * rate / 1000)
local allowed = 1
local wait = 0
if mode == 1 then
  if level >= cost then
    level = level - cost
  else
    allowed = 0
    wait = math.ceil((cost - level) * 1000 / rate)
  end
elseif mode == 2 then
  if level >= 1 then
    allowed = math.min(cost, math.floor(level))
    level = level - allowed
  else
    allowed = 0
    wait = math.ceil((1 - level) * 1000 / rate)
  end
elseif mode == 0 then
  level = level - cost
else
  if level < 0 then
    allowed = 0
    wait = math.ceil(-level * 1000 / rate)
  end
end
redis.call('HSET', KEYS[1], 'level', tostring(level), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(cap * 1000 / rate) + 60000)
return {allowed, wait}
"""

# Seconds of a key's request rate a gateway takes from its bucket at once (module doc).
LEASE_S = 0.1
# Keys with a lease or a "not in debt" answer held at once before the lapsed ones are dropped.
HELD_KEYS = 10_000


class Limiter(Protocol):
    async def admit(self, principal: Principal) -> None: ...

    async def charge_tokens(self, principal: Principal, tokens: int) -> None: ...

    async def close(self) -> None: ...


class NoLimits:
    """The limiter when no Redis is configured."""

    async def admit(self, principal: Principal) -> None:
        return None

    async def charge_tokens(self, principal: Principal, tokens: int) -> None:
        return None

    async def close(self) -> None:
        return None


class RedisLimiter:
    """Token buckets per API key in Redis (see the module docstring)."""

    def __init__(
        self, client: aioredis.Redis, *, lease_s: float = LEASE_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._redis = client
        self._script: Any = client.register_script(BUCKET_LUA)
        self._lease_s = lease_s
        self._clock = clock
        # Requests bucket key -> (requests left in its lease, monotonic time the lease lapses);
        # the refills in flight.
        self._leases: dict[str, tuple[int, float]] = {}
        self._refills: dict[str, asyncio.Future[float | None]] = {}
        # Tokens bucket key -> monotonic time its last "not in debt" answer lapses.
        self._solvent: dict[str, float] = {}

    @classmethod
    def from_url(
        cls, url: str, *, lease_s: float = LEASE_S, clock: Callable[[], float] = time.monotonic
    ) -> RedisLimiter:
        client = redis_client.connect(url, socket_connect_timeout=1.0, socket_timeout=1.0)
        return cls(client, lease_s=lease_s, clock=clock)

    async def close(self) -> None:
        await self._redis.aclose()

    async def _bucket(self, key: str, per_minute: int, cost: int, mode: int) -> float | None:
        """None when allowed, else seconds until it would be."""
        try:
            allowed, wait_ms = await self._script(
                keys=[key], args=[per_minute, per_minute / 60.0, cost, mode]
            )
        except (RedisError, OSError) as exc:
            log.warning("rate limiter unavailable (%s): not enforcing limits", exc)
            return None
        return None if int(allowed) else max(0.001, int(wait_ms) / 1000)

    async def admit(self, principal: Principal) -> None:
        """Charges one request; ResourceExhausted (429 + Retry-After) when over a limit."""
        limits = principal.settings
        base = f"llmesh:rl:{{{principal.tenant}:{principal.key_id}}}"
        if limits.tokens_per_minute > 0:
            wait = await self._peek_tokens(base + ":tpm", limits.tokens_per_minute)
            if wait is not None:
                raise ResourceExhausted(
                    f"token rate limit of {limits.tokens_per_minute}/min reached; "
                    f"retry in {math.ceil(wait)} s",
                    retry_after_s=wait,
                )
        if limits.requests_per_minute > 0:
            wait = await self._take_request(base + ":rpm", limits.requests_per_minute)
            if wait is not None:
                raise ResourceExhausted(
                    f"request rate limit of {limits.requests_per_minute}/min reached; "
                    f"retry in {math.ceil(wait)} s",
                    retry_after_s=wait,
                )

    async def _take_request(self, key: str, per_minute: int) -> float | None:
        """One request from ``key``'s bucket, from this gateway's lease when it holds one
        (module doc); None when allowed, else seconds until it would be."""
        batch = int(per_minute / 60 * self._lease_s)
        if batch <= 1:
            return await self._bucket(key, per_minute, 1, 1)
        while True:
            left, lapses = self._leases.get(key, (0, 0.0))
            if left > 0 and self._clock() < lapses:
                self._leases[key] = (left - 1, lapses)
                return None
            pending = self._refills.get(key)
            if pending is None:
                break
            # Another request is refilling: 0.0 = done (or given up), try the lease again;
            # None = Redis failed (not enforcing, as for that request); else refused.
            outcome = await asyncio.shield(pending)
            if outcome is None or outcome > 0:
                return outcome
        refill: asyncio.Future[float | None] = asyncio.get_running_loop().create_future()
        self._refills[key] = refill
        outcome = 0.0
        try:
            lapses = self._clock() + self._lease_s
            try:
                args = [per_minute, per_minute / 60.0, batch, 2]
                taken, wait_ms = await self._script(keys=[key], args=args)
            except (RedisError, OSError) as exc:
                log.warning("rate limiter unavailable (%s): not enforcing limits", exc)
                self._leases.pop(key, None)
                outcome = None
                return None
            if int(taken) > 0:
                if len(self._leases) >= HELD_KEYS:
                    now = self._clock()
                    self._leases = {k: v for k, v in self._leases.items() if v[1] > now}
                self._leases[key] = (int(taken) - 1, lapses)
                return None
            self._leases.pop(key, None)
            outcome = max(0.001, int(wait_ms) / 1000)
            return outcome
        finally:
            del self._refills[key]
            refill.set_result(outcome)

    async def _peek_tokens(self, key: str, per_minute: int) -> float | None:
        """Whether ``key``'s tokens bucket is in debt; a key at 1,200 a minute or more reuses a
        "not in debt" answer for ``lease_s`` (module doc)."""
        if int(per_minute / 60 * self._lease_s) <= 1:
            return await self._bucket(key, per_minute, 0, -1)
        if self._clock() < self._solvent.get(key, 0.0):
            return None
        lapses = self._clock() + self._lease_s
        wait = await self._bucket(key, per_minute, 0, -1)
        if wait is None:
            if len(self._solvent) >= HELD_KEYS:
                now = self._clock()
                self._solvent = {k: v for k, v in self._solvent.items() if v > now}
            self._solvent[key] = lapses
        else:
            self._solvent.pop(key, None)
        return wait

    async def charge_tokens(self, principal: Principal, tokens: int) -> None:
        limit = principal.settings.tokens_per_minute
        if limit > 0 and tokens > 0:
            base = f"llmesh:rl:{{{principal.tenant}:{principal.key_id}}}"
            self._solvent.pop(base + ":tpm", None)  # the next request asks Redis again
            await self._bucket(base + ":tpm", limit, tokens, 0)
