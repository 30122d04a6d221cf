"""Per-key rate limits in Redis: requests per minute and tokens per minute.

Each limit is a token bucket kept in one Redis hash and updated by one Lua script
(atomic across gateway replicas; Redis' own clock, so gateways need no clock
agreement). Requests are charged one at admission. Tokens cannot be known before
the answer, so admission only checks that the token bucket is not in debt, and
the real usage is charged when the request ends (the bucket may go negative,
which holds later requests back until it refills). Redis down = limits are not
enforced (logged): the limiter must never take the API down.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.auth import Principal
from services.runtime import redis_client
from services.runtime.errors import ResourceExhausted

log = logging.getLogger(__name__)

# KEYS[1] bucket; ARGV: capacity, refill per second, cost, mode (1 = must fit, 0 = charge, -1 = peek debt)
# Returns {allowed (0/1), retry_after_ms}.
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

    def __init__(self, client: aioredis.Redis) -> None:
        self._redis = client
        self._script: Any = client.register_script(BUCKET_LUA)

    @classmethod
    def from_url(cls, url: str) -> RedisLimiter:
        return cls(redis_client.connect(url, socket_connect_timeout=1.0, socket_timeout=1.0))

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
            wait = await self._bucket(base + ":tpm", limits.tokens_per_minute, 0, -1)
            if wait is not None:
                raise ResourceExhausted(
                    f"token rate limit of {limits.tokens_per_minute}/min reached; "
                    f"retry in {math.ceil(wait)} s",
                    retry_after_s=wait,
                )
        if limits.requests_per_minute > 0:
            wait = await self._bucket(base + ":rpm", limits.requests_per_minute, 1, 1)
            if wait is not None:
                raise ResourceExhausted(
                    f"request rate limit of {limits.requests_per_minute}/min reached; "
                    f"retry in {math.ceil(wait)} s",
                    retry_after_s=wait,
                )

    async def charge_tokens(self, principal: Principal, tokens: int) -> None:
        limit = principal.settings.tokens_per_minute
        if limit > 0 and tokens > 0:
            base = f"llmesh:rl:{{{principal.tenant}:{principal.key_id}}}"
            await self._bucket(base + ":tpm", limit, tokens, 0)
