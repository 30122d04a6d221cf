"""Per (tenant, namespace) monotonic versions in Redis, shared by every service.

A version is a hybrid logical clock reading: a bump sets it to
``max(current + 1, now_us)`` with ``now_us`` from Redis ``TIME``, in one Lua call.
Versions therefore stay monotonic when Redis restarts empty (the clock moved on
since any version a client holds), and versions of different namespaces are
comparable, which is what makes a bare integer floor meaningful. Reading a
namespace that has no version yet initialises it from the clock (``SET NX``), so a
restart can cause misses but never a stale hit or a stuck client.

Keys: ``llmesh:ver:{<tenant>:<namespace>}``. The hash tag is the (tenant,
namespace) pair, so a service that keeps that namespace's data under keys with
the same tag (see :func:`slot_tag`) can update data and version in one MULTI or
Lua call on a Redis Cluster.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.asyncio.cluster import RedisCluster

from services.runtime.errors import InvalidArgument

# Lua functions other scripts embed (e.g. a session append that writes its turns
# and bumps the session's version in one call): ``hlc_bump(key)`` and
# ``hlc_read(key)`` both return the version as a decimal string.
HLC_LUA = """
local function hlc_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function hlc_bump(key)
  local v = tonumber(redis.call('GET', key) or '0') + 1
  local now = hlc_now()
  if now > v then v = now end
  local s = string.format('%d', v)
  redis.call('SET', key, s, 'KEEPTTL')
  return s
end
local function hlc_read(key)
  redis.call('SET', key, string.format('%d', hlc_now()), 'NX')
  return redis.call('GET', key)
end
"""

_BUMP = HLC_LUA + "return hlc_bump(KEYS[1])"

_READ = (
    HLC_LUA
    + """
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = hlc_read(key)
end
return out
"""
)

MAX_NAMESPACE_LENGTH = 256


def slot_tag(tenant: str, namespace: str) -> str:
    """The Redis Cluster hash tag of a (tenant, namespace): ``{tenant:namespace}``."""
    if not namespace or len(namespace) > MAX_NAMESPACE_LENGTH or any(c in namespace for c in "{}\n"):
        raise InvalidArgument(
            f"namespace must be 1-{MAX_NAMESPACE_LENGTH} characters without braces or newlines"
        )
    return "{" + tenant + ":" + namespace + "}"


def version_key(tenant: str, namespace: str) -> str:
    return "llmesh:ver:" + slot_tag(tenant, namespace)


class VersionStore:
    """Bumps and reads versions; works on a plain Redis and on a Redis Cluster client."""

    def __init__(self, redis: Any) -> None:
        self._redis = redis
        self._bump = redis.register_script(_BUMP)
        self._read = redis.register_script(_READ)

    async def bump(self, tenant: str, namespace: str) -> int:
        """Advances the namespace's version and returns the new one."""
        return int(await self._bump(keys=[version_key(tenant, namespace)]))

    async def get(self, tenant: str, namespace: str) -> int:
        """The namespace's current version (initialised from the clock if missing)."""
        values = await self._read(keys=[version_key(tenant, namespace)])
        return int(values[0])

    async def get_many(self, tenant: str, namespaces: Sequence[str]) -> dict[str, int]:
        """Current versions of several namespaces, in one round trip (one script call per namespace,
        pipelined, or concurrent on a cluster, because the namespaces live in different slots)."""
        unique = list(dict.fromkeys(namespaces))
        if not unique:
            return {}
        if len(unique) == 1:
            return {unique[0]: await self.get(tenant, unique[0])}
        if isinstance(self._redis, RedisCluster):
            # redis-py refuses EVALSHA in a cluster pipeline: concurrent calls instead (each
            # goes to the node of its slot; still about one round trip in all).
            values = await asyncio.gather(*(self.get(tenant, namespace) for namespace in unique))
            return dict(zip(unique, values, strict=True))
        async with self._redis.pipeline(transaction=False) as pipe:
            for namespace in unique:
                await self._read(keys=[version_key(tenant, namespace)], client=pipe)
            results = await pipe.execute()
        return {namespace: int(values[0]) for namespace, values in zip(unique, results, strict=True)}
