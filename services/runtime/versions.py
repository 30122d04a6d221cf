"""Per (tenant, namespace) monotonic versions in Redis, shared by every service.

A version is a hybrid logical clock reading: a bump sets it to
``max(current + 1, now_us)`` with ``now_us`` from Redis ``TIME``, in one Lua call.
Versions therefore stay monotonic when Redis restarts empty (the clock moved on
since any version a client holds), and versions of different namespaces are
comparable, which is what makes a bare integer floor meaningful. Reading a
namespace that has no version yet initialises it from the clock (``SET NX``), so a
restart can cause misses but never a stale hit or a stuck client.

Lifetimes. A version key may vanish at any moment without breaking that guarantee:
whatever removes it (a restart, eviction, a TTL running out), the next read or bump
starts again from the clock, above every version handed out before (a bump runs
ahead of the clock only by bumps of the same key within one microsecond, and one Lua
call takes longer than that). The cost of a lost key is misses: entries stamped with
the old version are judged stale. So keys are bounded instead of living forever,
which would let anyone who can name a namespace (a fresh RAG collection, a session
id, a response scope: one per request) fill Redis with keys that a ``volatile-*``
eviction policy can never remove. A read says how long the key must hold (:data:`Hold`):

* ``peek``: write nothing. A missing key reads as the clock now, which is monotonic
  too (later readings are larger, and so is whatever the owner later creates). It
  is not *stable*: two peeks of a missing key differ, so an entry stamped with one is
  never served; that is right for a namespace whose owner never made it (a RAG
  collection that does not exist), and for judging an entry, whose own stamps were
  created when it was stored;
* ``read``: a missing key is created, living ``read_ttl_s`` (short: long enough for a
  single-flight producer elected on that read to store);
* ``keep``: created or kept for at least ``ttl_s``, longer than anything stamped with
  it; a bump keeps the key that long as well, so an active namespace never expires.

A key that has less than the lifetime a read asks for left is extended to *twice* that
lifetime, so a busy namespace's key is rewritten about once per lifetime, not on every read:
every rewrite is a change that the processes watching versions are pushed
(:mod:`services.runtime.invalidations`), and drops their copies of everything stamped with it.

TTLs only ever grow (a read never shortens a longer one) and a *permanent* key stays
permanent: only a write with TTL 0 makes one, and only the owner of durable data does
that (a RAG collection's version lives as long as its documents and change log,
whose entry ids are its versions).

Keys: ``llmesh:ver:{<tenant>:<namespace>}``. The hash tag is the (tenant,
namespace) pair, so a service that keeps that namespace's data under keys with
the same tag (see :func:`slot_tag`) can update data and version in one MULTI or
Lua call on a Redis Cluster.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from services.runtime.errors import InvalidArgument

# Lua functions other scripts embed (e.g. a session append that writes its turns
# and bumps the session's version in one call); each returns the version as a decimal
# string. ``ttl`` (seconds) is the least lifetime the key keeps afterwards: 0 makes it
# permanent (durable data only); for ``hlc_read``, a negative ``ttl`` is a peek.
HLC_LUA = """
local function hlc_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function hlc_keep(key, ttl)
  if ttl <= 0 then return end
  local left = redis.call('PTTL', key)
  if left >= 0 and left < ttl * 1000 then redis.call('PEXPIRE', key, ttl * 2000) end
end
local function hlc_peek(key)
  return redis.call('GET', key) or string.format('%d', hlc_now())
end
local function hlc_bump(key, ttl)
  local v = tonumber(redis.call('GET', key) or '0') + 1
  local now = hlc_now()
  if now > v then v = now end
  local s = string.format('%d', v)
  if ttl <= 0 then
    redis.call('SET', key, s)
  elseif redis.call('SET', key, s, 'KEEPTTL', 'GET') then
    hlc_keep(key, ttl)
  else
    redis.call('EXPIRE', key, ttl * 2)
  end
  return s
end
local function hlc_read(key, ttl)
  if ttl < 0 then return hlc_peek(key) end
  local v = redis.call('GET', key)
  if v then
    hlc_keep(key, ttl)
    return v
  end
  v = string.format('%d', hlc_now())
  if ttl > 0 then redis.call('SET', key, v, 'EX', ttl * 2) else redis.call('SET', key, v) end
  return v
end
"""

_BUMP = HLC_LUA + "return hlc_bump(KEYS[1], tonumber(ARGV[1]))"
# A bump of a key that exists; a missing one is peeked (nothing was stamped with it that a
# version made now would not already judge stale), so no key is made.
_BUMP_EXISTING = (
    HLC_LUA
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return hlc_peek(KEYS[1]) end
return hlc_bump(KEYS[1], tonumber(ARGV[1]))
"""
)

# Each key read with its own ttl (ARGV[i]), or all with ARGV[1].
_READ = (
    HLC_LUA
    + """
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = hlc_read(key, tonumber(ARGV[i] or ARGV[1]))
end
return out
"""
)

# How long a read needs the version key to hold (see the module doc).
Hold = Literal["peek", "read", "keep"]

# A bumped or kept namespace stays at least a day after its last bump or stamped read: longer
# than any response entry stamped with it (cache.defaults.RESPONSE_TTL_S is an hour).
DEFAULT_TTL_S = 24 * 3600
# A namespace only read stays 15 minutes: longer than a single-flight producer may take
# between the lookup that elected it and its store (cache.defaults LEASE_MS + LEASE_GRACE_MS).
DEFAULT_READ_TTL_S = 15 * 60

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
    """Bumps and reads versions; works on a plain Redis and on a Redis Cluster client.

    ``ttl_s`` / ``read_ttl_s``: the key lifetimes of the module doc (both > 0: versions this
    store makes are never permanent).
    """

    def __init__(
        self, redis: Any, *, ttl_s: int = DEFAULT_TTL_S, read_ttl_s: int = DEFAULT_READ_TTL_S
    ) -> None:
        if not 0 < read_ttl_s <= ttl_s:
            raise ValueError(f"version TTLs must satisfy 0 < read_ttl_s <= ttl_s, got {read_ttl_s}, {ttl_s}")
        self._redis = redis
        self.ttl_s = ttl_s
        self.read_ttl_s = read_ttl_s
        self._bump = redis.register_script(_BUMP)
        self._bump_existing = redis.register_script(_BUMP_EXISTING)
        self._read = redis.register_script(_READ)
        # Set once a server refused one script call over several namespaces' keys (get_many).
        self._cross_slot_refused = False

    async def bump(self, tenant: str, namespace: str) -> int:
        """Advances the namespace's version and returns the new one."""
        return int(await self._bump(keys=[version_key(tenant, namespace)], args=[self.ttl_s]))

    async def bump_existing(self, tenant: str, namespace: str) -> int:
        """Advances the namespace's version if it has one and returns it; a namespace without
        one is peeked instead (the clock now, nothing written): everything stamped with a
        version it had is already older than any version it gets later."""
        return int(await self._bump_existing(keys=[version_key(tenant, namespace)], args=[self.ttl_s]))

    async def get(self, tenant: str, namespace: str, *, hold: Hold = "read") -> int:
        """The namespace's current version; ``hold``: what a missing key becomes (module doc)."""
        values = await self._read(keys=[version_key(tenant, namespace)], args=[self._ttl(hold)])
        return int(values[0])

    async def get_many(
        self, tenant: str, namespaces: Sequence[str], *, hold: Hold = "read"
    ) -> dict[str, int]:
        """Current versions of several namespaces, each read as ``hold`` says (:meth:`get_held`)."""
        return await self.get_held(tenant, dict.fromkeys(namespaces, hold))

    async def get_held(self, tenant: str, holds: Mapping[str, Hold]) -> dict[str, int]:
        """Current versions of several namespaces, each read as its own hold says, in one round
        trip: one script call over all their keys on a single Redis; on a cluster, where the
        namespaces live in different slots, one call per namespace, concurrent (each goes to
        the node of its slot)."""
        unique = list(holds)
        if not unique:
            return {}
        if len(unique) == 1:
            return {unique[0]: await self.get(tenant, unique[0], hold=holds[unique[0]])}
        if isinstance(self._redis, RedisCluster):
            # redis-py refuses EVALSHA in a cluster pipeline: concurrent calls instead (still
            # about one round trip in all).
            values = await asyncio.gather(*(self.get(tenant, ns, hold=holds[ns]) for ns in unique))
            return dict(zip(unique, values, strict=True))
        ttls = [self._ttl(holds[ns]) for ns in unique]
        if not self._cross_slot_refused:
            try:
                read = await self._read(
                    keys=[version_key(tenant, ns) for ns in unique],
                    args=ttls[:1] if len(set(ttls)) == 1 else ttls,
                )
            except ResponseError as exc:
                # A proxy in front of a sharded Redis refuses keys of several slots in one call:
                # from then on, one call per namespace in a pipeline.
                if "CROSSSLOT" not in str(exc):
                    raise
                self._cross_slot_refused = True
            else:
                return {namespace: int(value) for namespace, value in zip(unique, read, strict=True)}
        async with self._redis.pipeline(transaction=False) as pipe:
            for namespace, ttl in zip(unique, ttls, strict=True):
                await self._read(keys=[version_key(tenant, namespace)], args=[ttl], client=pipe)
            results = await pipe.execute()
        return {namespace: int(values[0]) for namespace, values in zip(unique, results, strict=True)}

    def _ttl(self, hold: Hold) -> int:
        if hold == "peek":
            return -1
        return self.ttl_s if hold == "keep" else self.read_ttl_s
