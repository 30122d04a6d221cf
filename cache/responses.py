"""The exact response store in Redis: entries, single-flight leases, and the freshness rule.

An entry is a Redis hash (payload, version stamps, created/expiry times on the
Redis clock) written in one Lua call together with the release of its lease and a
wake-up message, so no reader ever sees half an entry and no waiter misses the
moment it lands. Whether an entry may be served is :func:`judge`'s decision.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cache.backend import Backend
from cache.domain import CacheEntry
from cache.keys import RedisKeys
from services.runtime import namespaces
from services.runtime.versions import HLC_LUA, version_key

WAKE_CHANNEL = "llmesh:cache:done"
# Where the cache publishes its lease terms while callers may decide a miss in Redis themselves
# (:class:`DirectAcquire`); absent (it expires) when they may not.
DIRECT_TERMS_KEY = "llmesh:cache:direct"

_NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

_READ = (
    _NOW_MS
    + """
return {string.format('%d', now), redis.call('HGETALL', KEYS[1])}
"""
)

# The fast path on a single Redis: the entry, the clock, and the current versions of the
# namespaces the entry was derived from, in one call. The version keys are derived from
# the entry, so they cannot be declared up front: on a Redis Cluster (where they live in
# other slots) the service reads them in a second round trip instead.
# KEYS: entry. ARGV: version-key prefix of the tenant ("llmesh:ver:{<tenant>:"). The versions
# are peeked (never written): the store made the entry's stamps outlive it, so a missing one was
# lost, and the clock it reads as instead judges the entry stale (services.runtime.versions).
# (The entry as ``flat``, its versions as ``versions``: shared with _READ_OR_ACQUIRE.)
_ENTRY_AND_VERSIONS = """
local flat = redis.call('HGETALL', KEYS[1])
local versions = {}
if #flat > 0 then
  local stamps = nil
  for i = 1, #flat, 2 do
    if flat[i] == 'd' then stamps = flat[i + 1] end
  end
  if stamps then
    local ok, decoded = pcall(cjson.decode, stamps)
    if ok and type(decoded) == 'table' then
      for ns, _ in pairs(decoded) do
        versions[#versions + 1] = ns
        versions[#versions + 1] = hlc_peek(ARGV[1] .. ns .. '}')
      end
    end
  end
end
"""
_READ_FRESH = HLC_LUA + _NOW_MS + _ENTRY_AND_VERSIONS + "return {string.format('%d', now), flat, versions}\n"

# A lease is granted with two keys: the lease itself (expires after lease_ms, so a dead
# producer does not block the key for long) and the grant (who got the lease last, and
# when, on the Redis clock; lives lease_ms + grace_ms). A producer whose lease ran out
# while it was still generating may still store when the grant is still its own (no
# one was granted the lease since) and no entry was written since it was granted.
# A token is good for one store or release: both drop the grant.
_GRANT_CHECK = """
local function grant_ok(key, token, entry)
  local g = redis.call('GET', key)
  if not g then return false end
  local sep = string.find(g, '|', 1, true)
  if not sep or string.sub(g, 1, sep - 1) ~= token then return false end
  local c = redis.call('HGET', entry, 'c')
  if c and tonumber(c) >= tonumber(string.sub(g, sep + 1)) then return false end
  return true
end
"""

# KEYS: entry, lease, grant. ARGV: token ('' = none), ttl_ms, payload, stamps, model, digest.
_STORE = (
    _NOW_MS
    + _GRANT_CHECK
    + """
if ARGV[1] ~= '' then
  local holder = redis.call('GET', KEYS[2])
  if holder == ARGV[1] then
    redis.call('DEL', KEYS[2])
  elseif holder or not grant_ok(KEYS[3], ARGV[1], KEYS[1]) then
    return {'lost'}
  end
  redis.call('DEL', KEYS[3])
end
local ttl = tonumber(ARGV[2])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'p', ARGV[3], 'd', ARGV[4], 'm', ARGV[5],
  'c', string.format('%d', now), 'e', string.format('%d', now + ttl))
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PUBLISH', '"""
    + WAKE_CHANNEL
    + """', ARGV[6])
return {'ok', string.format('%d', now)}
"""
)

# Takes the lease if nobody holds it, and records the grant; after _NOW_MS.
_TAKE_LEASE = """
local function take_lease(lease, grant, token, lease_ms, grace_ms)
  if not redis.call('SET', lease, token, 'NX', 'PX', lease_ms) then return false end
  redis.call('SET', grant, token .. '|' .. string.format('%d', now),
    'PX', tonumber(lease_ms) + tonumber(grace_ms))
  return true
end
"""

# KEYS: entry, lease, grant. ARGV: token, lease_ms, created_at the caller already judged
# ('' = none), grace_ms.
_ACQUIRE = (
    _NOW_MS
    + _TAKE_LEASE
    + """
local c = redis.call('HGET', KEYS[1], 'c')
if c and c ~= ARGV[3] then return {'changed', '0'} end
if take_lease(KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[4]) then return {'acquired', ARGV[2]} end
return {'busy', tostring(redis.call('PTTL', KEYS[2]))}
"""
)

# A miss's whole lookup on a single Redis, in one call: the entry as _READ_FRESH reads it;
# when there is none, the tenant's and the scope's versions read as a lease's token needs them
# (created if missing, living ARGV[2] seconds: services.runtime.versions, hold "read") and the
# lease tried as _ACQUIRE tries it. Nothing happens in between that the separate calls allowed
# (it is one atomic call), so it decides as they did with no other client in between.
# KEYS: entry, lease, grant, tenant version, scope version. ARGV: version-key prefix of the
# tenant, read TTL (s), lease id, lease_ms, grace_ms. Returns {now, entry fields, versions,
# outcome, token or PTTL}: outcome '' when there is an entry (the caller judges it).
_READ_OR_ACQUIRE = (
    HLC_LUA
    + _NOW_MS
    + _TAKE_LEASE
    + _ENTRY_AND_VERSIONS
    + """
if #flat > 0 then return {string.format('%d', now), flat, versions, '', ''} end
local ttl = tonumber(ARGV[2])
local token = ARGV[3] .. '.' .. hlc_read(KEYS[4], ttl) .. '.' .. hlc_read(KEYS[5], ttl)
if take_lease(KEYS[2], KEYS[3], token, ARGV[4], ARGV[5]) then
  return {string.format('%d', now), flat, versions, 'acquired', token}
end
return {string.format('%d', now), flat, versions, 'busy', tostring(redis.call('PTTL', KEYS[2]))}
"""
)

# A miss decided and its lease taken as _READ_OR_ACQUIRE does, by a caller whose Redis user may
# read versions and entries but not write them (the gateway: gateway/direct_lookup.py). It goes
# on only where both versions exist and hlc_read would leave them as they are (no TTL to extend:
# at least the read TTL left, or none), so the token is the one _READ_OR_ACQUIRE would make in
# the same state; otherwise it changes nothing and says why: 'entry' (one to judge), 'versions'
# (one to make or extend) or 'busy' (another producer). Only the keys it writes are declared (a
# script's declared keys need write access under ACLs); the ones it reads come as arguments,
# which is why it needs one plain Redis, as _READ_OR_ACQUIRE does.
# KEYS: lease, grant. ARGV: entry, tenant version, scope version, read TTL (s), lease id,
# lease_ms, grace_ms.
_ACQUIRE_IF_MISSING = (
    _NOW_MS
    + _TAKE_LEASE
    + """
if redis.call('EXISTS', ARGV[1]) == 1 then return {'entry', ''} end
local ttl = tonumber(ARGV[4])
local function held(key)
  local v = redis.call('GET', key)
  if not v then return false end
  local left = redis.call('PTTL', key)
  if ttl > 0 and left >= 0 and left < ttl * 1000 then return false end
  return v
end
local a, b = held(ARGV[2]), held(ARGV[3])
if not a or not b then return {'versions', ''} end
local token = ARGV[5] .. '.' .. a .. '.' .. b
if take_lease(KEYS[1], KEYS[2], token, ARGV[6], ARGV[7]) then return {'acquired', token} end
return {'busy', ''}
"""
)

# KEYS: lease, grant. ARGV: token, digest.
_RELEASE = (
    """
local g = redis.call('GET', KEYS[2])
if g and string.sub(g, 1, #ARGV[1] + 1) == ARGV[1] .. '|' then redis.call('DEL', KEYS[2]) end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', '"""
    + WAKE_CHANNEL
    + """', ARGV[2])
return 1
"""
)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def version_prefix(tenant: str) -> str:
    """What a tenant's version keys start with: the Lua reads add ``<namespace>}``."""
    return version_key(tenant, "x")[:-2]


@dataclass(frozen=True, slots=True)
class LeaseTerms:
    """How a miss's lease is taken (the cache's settings), published under
    :data:`DIRECT_TERMS_KEY` for callers that take leases themselves."""

    read_ttl_s: int
    lease_ms: int
    grace_ms: int
    max_key_bytes: int

    def dump(self) -> str:
        return json.dumps(
            {
                "read_ttl_s": self.read_ttl_s,
                "lease_ms": self.lease_ms,
                "grace_ms": self.grace_ms,
                "max_key_bytes": self.max_key_bytes,
            },
            separators=(",", ":"),
        )

    @classmethod
    def load(cls, raw: bytes | str | None) -> LeaseTerms | None:
        """The terms, or None when ``raw`` is absent or not what :meth:`dump` writes."""
        if raw is None:
            return None
        try:
            fields = json.loads(raw)
            terms = cls(
                read_ttl_s=int(fields["read_ttl_s"]),
                lease_ms=int(fields["lease_ms"]),
                grace_ms=int(fields["grace_ms"]),
                max_key_bytes=int(fields["max_key_bytes"]),
            )
        except (ValueError, TypeError, KeyError):
            return None
        if min(terms.read_ttl_s, terms.lease_ms, terms.max_key_bytes) <= 0 or terms.grace_ms < 0:
            return None
        return terms


def _lookup_call(
    tenant: str, keys: RedisKeys, scope_namespace: str, terms: LeaseTerms
) -> tuple[list[str], list[str | int]]:
    """KEYS and ARGV of _READ_OR_ACQUIRE and _ACQUIRE_IF_MISSING (one place, so both take the
    same lease with the same token)."""
    return (
        [
            keys.entry,
            keys.lease,
            keys.grant,
            version_key(tenant, namespaces.TENANT),
            version_key(tenant, scope_namespace),
        ],
        [version_prefix(tenant), terms.read_ttl_s, uuid.uuid4().hex, terms.lease_ms, terms.grace_ms],
    )


class DirectAcquire:
    """A miss's lease taken in Redis by a caller other than the cache (_ACQUIRE_IF_MISSING):
    ``"acquired"`` and the token the cache's own lookup would have given, or the reason it
    leaves the lookup to the cache (``"entry"``, ``"versions"``, ``"busy"``) and ``""``."""

    def __init__(self, redis: Any) -> None:
        self._redis = redis
        self._script = redis.register_script(_ACQUIRE_IF_MISSING)

    async def terms(self) -> LeaseTerms | None:
        """The terms the cache publishes, or None while it publishes none."""
        return LeaseTerms.load(await self._redis.get(DIRECT_TERMS_KEY))

    async def __call__(
        self, tenant: str, keys: RedisKeys, scope_namespace: str, terms: LeaseTerms
    ) -> tuple[str, str]:
        (entry, lease, grant, *versions), (_, *args) = _lookup_call(tenant, keys, scope_namespace, terms)
        outcome, token = await self._script(keys=[lease, grant], args=[entry, *versions, *args])
        return _text(outcome), _text(token)


@dataclass(frozen=True, slots=True)
class Verdict:
    fresh: bool
    age_ms: int
    reason: str = ""


def judge(
    entry: CacheEntry,
    now_ms: int,
    floor_for: Callable[[str], int],
    current: Mapping[str, int],
    max_age_ms: int | None,
) -> Verdict:
    """May ``entry`` be served? Every stamp must be at least the caller's floor and the
    namespace's current version (no invalidation since), and the entry younger than the
    caller's max-age and its own TTL."""
    age = max(0, now_ms - entry.created_at_ms)
    if now_ms >= entry.expires_at_ms:
        return Verdict(False, age, "expired")
    if max_age_ms is not None and age >= max_age_ms:
        return Verdict(False, age, f"age {age} ms is not below max-age {max_age_ms} ms")
    for namespace, version in sorted(entry.derived_from.items()):
        floor = floor_for(namespace)
        if version < floor:
            return Verdict(False, age, f"{namespace} version {version} is below the floor {floor}")
        now_version = current.get(namespace, version)
        if version < now_version:
            return Verdict(False, age, f"{namespace} moved on to version {now_version} since {version}")
    return Verdict(True, age)


@dataclass(frozen=True, slots=True)
class Acquire:
    outcome: str  # "acquired", "busy" or "changed"
    ttl_ms: int


class ResponseStore:
    """Redis operations on response entries and their leases (no policy: see :mod:`cache.service`)."""

    def __init__(self, backend: Backend, *, cluster: bool = False, versions_here: bool = True) -> None:
        self._backend = backend
        # The one-call read of entry + versions needs one plain Redis holding both.
        self._fast = versions_here and not cluster
        redis = backend.redis
        self._read = redis.register_script(_READ)
        self._read_fresh = redis.register_script(_READ_FRESH)
        self._store = redis.register_script(_STORE)
        self._acquire = redis.register_script(_ACQUIRE)
        self._read_or_acquire = redis.register_script(_READ_OR_ACQUIRE)
        self._release = redis.register_script(_RELEASE)

    async def read(self, entry_key: str) -> tuple[CacheEntry | None, int]:
        """The entry (or None) and the Redis clock in ms, in one atomic call."""
        raw_now, flat = await self._backend.call(self._read(keys=[entry_key]))
        return self._entry(flat), int(raw_now)

    async def read_fresh(
        self, entry_key: str, prefix: str
    ) -> tuple[CacheEntry | None, int, dict[str, int] | None]:
        """Like :meth:`read`, plus the current versions of the entry's namespaces (None on a
        cluster, or when the versions live in another Redis: the caller reads them separately)."""
        if not self._fast:
            entry, now = await self.read(entry_key)
            return entry, now, None
        raw_now, flat, raw_versions = await self._backend.call(
            self._read_fresh(keys=[entry_key], args=[prefix])
        )
        current = {_text(raw_versions[i]): int(raw_versions[i + 1]) for i in range(0, len(raw_versions), 2)}
        return self._entry(flat), int(raw_now), current

    @property
    def one_call_lookup(self) -> bool:
        """Entries and versions in one plain Redis: :meth:`read_or_acquire` may be used."""
        return self._fast

    async def read_or_acquire(
        self, tenant: str, keys: RedisKeys, scope_namespace: str, terms: LeaseTerms
    ) -> tuple[CacheEntry | None, int, dict[str, int], Acquire | None, str]:
        """:meth:`read_fresh`, and where there is no entry, the lease tried in the same call (its
        token carries the tenant's and the scope's versions). Returns the entry, the clock, its
        versions, the lease outcome (None when there is an entry) and the token when acquired."""
        assert self._fast, "one call needs entries and versions in one plain Redis"
        script_keys, args = _lookup_call(tenant, keys, scope_namespace, terms)
        raw_now, flat, raw_versions, outcome, extra = await self._backend.call(
            self._read_or_acquire(keys=script_keys, args=args)
        )
        current = {_text(raw_versions[i]): int(raw_versions[i + 1]) for i in range(0, len(raw_versions), 2)}
        entry = self._entry(flat)
        kind = _text(outcome)
        if not kind:
            return entry, int(raw_now), current, None, ""
        if kind == "acquired":
            return entry, int(raw_now), current, Acquire("acquired", terms.lease_ms), _text(extra)
        return entry, int(raw_now), current, Acquire(kind, int(extra)), ""

    async def publish_terms(self, terms: LeaseTerms, ttl_ms: int) -> None:
        """Offers the callers :class:`DirectAcquire` for ``ttl_ms`` (renewed by the caller)."""
        await self._backend.call(self._backend.redis.set(DIRECT_TERMS_KEY, terms.dump(), px=ttl_ms))

    @staticmethod
    def _entry(flat: list[bytes]) -> CacheEntry | None:
        if not flat:
            return None
        fields = {_text(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}
        try:
            stamps = {str(k): int(v) for k, v in json.loads(fields["d"]).items()}
            entry = CacheEntry(
                payload=bytes(fields["p"]),
                derived_from=stamps,
                created_at_ms=int(fields["c"]),
                expires_at_ms=int(fields["e"]),
                model=_text(fields.get("m", b"")),
            )
        except (KeyError, ValueError):
            # Not something this code wrote whole: treat as absent rather than serve it.
            return None
        return entry

    async def write(
        self,
        keys: RedisKeys,
        *,
        payload: bytes,
        stamps: Mapping[str, int],
        model: str,
        ttl_ms: int,
        token: str = "",
    ) -> int | None:
        """Stores an entry (releasing ``token``'s lease); its creation time, or None if the lease was
        lost: another producer holds it or was granted it since, or an entry was written since."""
        blob = json.dumps(dict(stamps), separators=(",", ":"))
        result = await self._backend.call(
            self._store(
                keys=[keys.entry, keys.lease, keys.grant],
                args=[token, ttl_ms, payload, blob, model, keys.digest],
            )
        )
        if _text(result[0]) != "ok":
            return None
        return int(result[1])

    async def acquire(
        self, keys: RedisKeys, token: str, lease_ms: int, seen_created: int | None, grace_ms: int = 0
    ) -> Acquire:
        seen = "" if seen_created is None else str(seen_created)
        outcome, ttl = await self._backend.call(
            self._acquire(keys=[keys.entry, keys.lease, keys.grant], args=[token, lease_ms, seen, grace_ms])
        )
        return Acquire(outcome=_text(outcome), ttl_ms=int(ttl))

    async def release(self, keys: RedisKeys, token: str) -> bool:
        """Gives up ``token``'s lease (False when it was no longer held) and wakes the waiters."""
        return bool(
            await self._backend.call(self._release(keys=[keys.lease, keys.grant], args=[token, keys.digest]))
        )

    async def delete(self, entry_key: str) -> bool:
        return bool(await self._backend.call(self._backend.redis.delete(entry_key)))
