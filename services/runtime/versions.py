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

from collections.abc import Sequence
from typing import Any

from services.runtime.errors import InvalidArgument

_BUMP = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local v = cur + 1
if now > v then v = now end
redis.call('SET', KEYS[1], string.format('%d', v))
return string.format('%d', v)
"""

_READ = """
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2]))
local out = {}
for i, key in ipairs(KEYS) do
  redis.call('SET', key, now, 'NX')
  out[i] = redis.call('GET', key)
end
return out
"""

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
        """Current versions of several namespaces (one call per namespace on a cluster)."""
        out: dict[str, int] = {}
        for namespace in dict.fromkeys(namespaces):
            out[namespace] = await self.get(tenant, namespace)
        return out
