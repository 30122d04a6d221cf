"""Sessions: the turns of a conversation per (tenant, session id), versioned, in Redis.

A session is a Redis list of JSON turns under the same hash tag as its version key,
so an append writes the turns and bumps the version in one Lua call (atomic, and
one cluster slot). Appends may name the version they expect: a mismatch is
ABORTED, so two clients never interleave turns silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cache import defaults
from cache.backend import Backend
from cache.domain import SessionView, Turn
from services.runtime import namespaces
from services.runtime.errors import Aborted, InvalidArgument, Unavailable
from services.runtime.limits import IDENTIFIER_CHARS, MAX_SESSION_ID_CHARS
from services.runtime.versions import HLC_LUA, slot_tag, version_key

MAX_SESSION_ID_LENGTH = MAX_SESSION_ID_CHARS
_ID_CHARS = IDENTIFIER_CHARS
# The version key outlives the session by a day so a late reader still sees it; after
# that it may go (versions are clock-derived, so a re-created one is still higher).
_VERSION_GRACE_MS = 24 * 3600 * 1000

_APPEND = (
    HLC_LUA
    + """
local exp = ARGV[1]
if exp ~= '' then
  if exp == '0' then
    if redis.call('EXISTS', KEYS[1]) == 1 then return {'conflict', hlc_read(KEYS[2])} end
  elseif redis.call('GET', KEYS[2]) ~= exp then
    return {'conflict', hlc_read(KEYS[2])}
  end
end
local n = redis.call('LLEN', KEYS[1])
local added = #ARGV - 3
if n + added > tonumber(ARGV[3]) then return {'full', tostring(n)} end
redis.call('RPUSH', KEYS[1], unpack(ARGV, 4))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local v = hlc_bump(KEYS[2])
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[2]) + VERSION_GRACE_MS)
return {'ok', v, tostring(n + added)}
""".replace("VERSION_GRACE_MS", str(_VERSION_GRACE_MS))
)

_READ = (
    HLC_LUA
    + """
local v = hlc_read(KEYS[2])
return {v, redis.call('LRANGE', KEYS[1], 0, -1)}
"""
)

_DELETE = (
    HLC_LUA
    + """
local deleted = redis.call('DEL', KEYS[1])
local v = hlc_bump(KEYS[2])
return {tostring(deleted), v}
"""
)


def session_namespace(session_id: str) -> str:
    """The version namespace of a session (:func:`services.runtime.namespaces.session`)."""
    return namespaces.session(session_id)


def validate_session_id(session_id: str) -> None:
    if not session_id or len(session_id) > MAX_SESSION_ID_LENGTH or not _ID_CHARS.issuperset(session_id):
        raise InvalidArgument(
            f"session_id must be 1-{MAX_SESSION_ID_LENGTH} characters of [A-Za-z0-9-_.:], "
            f"got {session_id[:40]!r}"
        )


@dataclass(frozen=True, slots=True)
class SessionLimits:
    ttl_ms: int = defaults.SESSION_TTL_S * 1000
    max_turns: int = defaults.MAX_SESSION_TURNS
    max_turns_per_append: int = defaults.MAX_TURNS_PER_APPEND
    max_turn_bytes: int = defaults.MAX_TURN_BYTES


class SessionStore:
    """Reads, appends to and deletes sessions; every write returns the session's new version."""

    def __init__(self, backend: Backend, limits: SessionLimits | None = None) -> None:
        self._backend = backend
        self.limits = limits or SessionLimits()
        redis = backend.redis
        self._append = redis.register_script(_APPEND)
        self._read = redis.register_script(_READ)
        self._delete = redis.register_script(_DELETE)

    @staticmethod
    def _keys(tenant: str, session_id: str) -> list[str]:
        validate_session_id(session_id)
        namespace = session_namespace(session_id)
        return ["llmesh:sess:" + slot_tag(tenant, namespace), version_key(tenant, namespace)]

    async def read(self, tenant: str, session_id: str, floor: int = 0) -> tuple[list[Turn], int]:
        """All turns and the version they are at (one atomic read)."""
        keys = self._keys(tenant, session_id)
        raw_version, raw_turns = await self._backend.call(self._read(keys=keys))
        version = int(raw_version)
        if version < floor:
            # Only a lagging replica can be behind a version a client already holds.
            raise Unavailable(
                f"session {session_id!r} is at version {version}, behind the requested {floor}",
                retry_after_s=0.1,
            )
        return [Turn.from_json(t) for t in raw_turns], version

    async def view(self, tenant: str, session_id: str, floor: int = 0) -> SessionView:
        turns, version = await self.read(tenant, session_id, floor)
        return SessionView(session_id=session_id, turns=tuple(turns), version=version, total_turns=len(turns))

    async def append(
        self,
        tenant: str,
        session_id: str,
        turns: Sequence[Turn],
        expected_version: int | None = None,
        ttl_s: int = 0,
    ) -> tuple[int, int]:
        """Appends ``turns``; returns (new version, total turns). ABORTED if ``expected_version`` is stale."""
        keys = self._keys(tenant, session_id)
        limits = self.limits
        if not turns:
            raise InvalidArgument("turns must not be empty")
        if len(turns) > limits.max_turns_per_append:
            raise InvalidArgument(f"at most {limits.max_turns_per_append} turns per append, got {len(turns)}")
        encoded = [t.to_json() for t in turns]
        for i, text in enumerate(encoded):
            if len(text.encode()) > limits.max_turn_bytes:
                raise InvalidArgument(f"turn {i} is larger than {limits.max_turn_bytes} bytes")
        if expected_version is not None and expected_version < 0:
            raise InvalidArgument("expected_version must be >= 0")
        if ttl_s < 0:
            raise InvalidArgument("ttl_seconds must be >= 0")
        ttl_ms = ttl_s * 1000 if ttl_s else limits.ttl_ms
        expected = "" if expected_version is None else str(expected_version)
        result = await self._backend.call(
            self._append(keys=keys, args=[expected, ttl_ms, limits.max_turns, *encoded])
        )
        outcome = result[0].decode() if isinstance(result[0], bytes) else result[0]
        if outcome == "conflict":
            raise Aborted(
                f"session {session_id!r} is at version {int(result[1])}, not the expected {expected_version}"
            )
        if outcome == "full":
            raise InvalidArgument(
                f"session {session_id!r} has {int(result[1])} turns; appending {len(turns)} would exceed "
                f"the limit of {limits.max_turns}"
            )
        return int(result[1]), int(result[2])

    async def delete(self, tenant: str, session_id: str) -> tuple[bool, int]:
        """Deletes the session; returns (whether it existed, the new version)."""
        keys = self._keys(tenant, session_id)
        deleted, version = await self._backend.call(self._delete(keys=keys))
        return int(deleted) == 1, int(version)
