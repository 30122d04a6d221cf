"""Sessions: the turns of a conversation per (tenant, session id), versioned, in Redis.

A session is a Redis list of JSON turns under the same hash tag as its version key,
so an append writes the turns and bumps the version in one Lua call (atomic, and
one cluster slot). Appends may name the version they expect: a mismatch is
ABORTED, so two clients never interleave turns silently.

A session is bounded in turns and bytes (``max_turns``, ``max_bytes``; a counter key
beside the list keeps its size). An append that would cross a bound first drops the
oldest turns, keeping a leading system/developer turn and pinned turns, so a long
conversation stays usable instead of failing every later append; only an append
that cannot fit even then (the kept turns alone are too large) is refused.
Reads under a token budget take the newest turns only (:meth:`SessionStore.tail`).
Every append and delete also updates the tenant's session index, which lists the tenant's
sessions (:mod:`cache.session_index`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from cache import defaults
from cache.backend import Backend
from cache.domain import SessionSummary, SessionView, Turn
from cache.session_index import SessionIndex
from services.runtime import namespaces
from services.runtime.errors import Aborted, InvalidArgument, Unavailable
from services.runtime.limits import KEY_IDENTIFIER_CHARS, MAX_SESSION_ID_CHARS
from services.runtime.versions import HLC_LUA, slot_tag, version_key

log = logging.getLogger(__name__)
MAX_SESSION_ID_LENGTH = MAX_SESSION_ID_CHARS
_ID_CHARS = KEY_IDENTIFIER_CHARS
# The version key outlives the session by a day so a late reader still sees it; after
# that it may go (versions are clock-derived, so a re-created one is still higher).
_VERSION_GRACE_MS = 24 * 3600 * 1000
# Turns read per LRANGE while looking for the oldest turns an append may drop.
_TRIM_PAGE = 64

# KEYS list, version, bytes. ARGV expected version, ttl_ms, max_turns, max_bytes, then the
# turns. Versions are peeked, never created, by reads (a session that does not exist leaves
# no key behind; services.runtime.versions). Returns {'ok', version, total, dropped},
# {'conflict', version} or {'full', kept bytes}.
_APPEND = (
    HLC_LUA
    + """
local exp = ARGV[1]
if exp ~= '' then
  if exp == '0' then
    if redis.call('EXISTS', KEYS[1]) == 1 then return {'conflict', hlc_peek(KEYS[2])} end
  elseif redis.call('GET', KEYS[2]) ~= exp then
    return {'conflict', hlc_peek(KEYS[2])}
  end
end
local n = redis.call('LLEN', KEYS[1])
local size = tonumber(redis.call('GET', KEYS[3]) or '-1')
if size < 0 or n == 0 then
  -- No counter (a session written before it existed, or none): count the list once.
  size = 0
  for _, t in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do size = size + #t end
end
local added, add_bytes = #ARGV - 4, 0
for i = 5, #ARGV do add_bytes = add_bytes + #ARGV[i] end
local need_turns = n + added - tonumber(ARGV[3])
local need_bytes = size + add_bytes - tonumber(ARGV[4])
local dropped = 0
if need_turns > 0 or need_bytes > 0 then
  -- Oldest first; a leading system/developer turn and pinned turns stay. Nothing changes
  -- unless enough can go.
  local freed, scanned, kept, kept_bytes, pos = 0, 0, {}, 0, 0
  while (dropped < need_turns or freed < need_bytes) and pos < n do
    local page = redis.call('LRANGE', KEYS[1], pos, pos + PAGE - 1)
    for i, t in ipairs(page) do
      local ok, d = pcall(cjson.decode, t)
      local keep = ok and type(d) == 'table'
        and ((pos + i == 1 and (d['r'] == 'system' or d['r'] == 'developer')) or d['p'] == 1)
      if keep then
        kept[#kept + 1] = t
        kept_bytes = kept_bytes + #t
      else
        dropped = dropped + 1
        freed = freed + #t
        scanned = pos + i
        if dropped >= need_turns and freed >= need_bytes then break end
      end
    end
    pos = pos + #page
    if #page == 0 then break end
  end
  if dropped < need_turns or freed < need_bytes then return {'full', tostring(kept_bytes)} end
  redis.call('LPOP', KEYS[1], scanned)
  -- Every kept turn came before the last dropped one, so all were popped: put them back.
  for i = #kept, 1, -1 do redis.call('LPUSH', KEYS[1], kept[i]) end
  n = n - dropped
  size = size - freed
end
redis.call('RPUSH', KEYS[1], unpack(ARGV, 5))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('SET', KEYS[3], string.format('%d', size + add_bytes), 'PX', ARGV[2])
local v = hlc_bump(KEYS[2], 1)
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[2]) + VERSION_GRACE_MS)
return {'ok', v, tostring(n + added), tostring(dropped)}
""".replace("VERSION_GRACE_MS", str(_VERSION_GRACE_MS)).replace("PAGE", str(_TRIM_PAGE))
)

# KEYS list, version.
_READ = (
    HLC_LUA
    + """
local v = hlc_peek(KEYS[2])
return {v, redis.call('LRANGE', KEYS[1], 0, -1)}
"""
)

# KEYS list, version. ARGV how many of the newest turns.
# Returns {version, total turns, the newest turns, the first turn or ''}.
_TAIL = (
    HLC_LUA
    + """
local v = hlc_peek(KEYS[2])
local n = redis.call('LLEN', KEYS[1])
local want = tonumber(ARGV[1])
local tail = redis.call('LRANGE', KEYS[1], -want, -1)
local first = ''
if n > want then first = redis.call('LINDEX', KEYS[1], 0) end
return {v, tostring(n), tail, first}
"""
)

# KEYS list, version, bytes. ARGV version TTL (s).
_DELETE = (
    HLC_LUA
    + """
local deleted = redis.call('DEL', KEYS[1])
redis.call('DEL', KEYS[3])
-- Nothing deleted and no version: nothing to invalidate, and no key made for a made-up id.
if deleted == 0 and redis.call('EXISTS', KEYS[2]) == 0 then return {'0', hlc_peek(KEYS[2])} end
local v = hlc_bump(KEYS[2], tonumber(ARGV[1]))
return {tostring(deleted), v}
"""
)


def session_namespace(session_id: str) -> str:
    """The version namespace of a session (:func:`services.runtime.namespaces.session`)."""
    return namespaces.session(session_id)


def validate_session_id(session_id: str) -> None:
    if not session_id or len(session_id) > MAX_SESSION_ID_LENGTH or not _ID_CHARS.issuperset(session_id):
        raise InvalidArgument(
            f"session_id must be 1-{MAX_SESSION_ID_LENGTH} characters of [A-Za-z0-9-_.] (no ':'), "
            f"got {session_id[:40]!r}"
        )


@dataclass(frozen=True, slots=True)
class SessionLimits:
    ttl_ms: int = defaults.SESSION_TTL_S * 1000
    max_turns: int = defaults.MAX_SESSION_TURNS
    max_bytes: int = defaults.MAX_SESSION_BYTES
    max_turns_per_append: int = defaults.MAX_TURNS_PER_APPEND
    max_turn_bytes: int = defaults.MAX_TURN_BYTES
    # How long a deleted session's bumped version stays (services.runtime.versions).
    version_ttl_s: int = defaults.VERSION_TTL_S
    # Sessions of one tenant that ListSessions can list (cache/session_index.py).
    max_listed_sessions: int = defaults.MAX_LISTED_SESSIONS


@dataclass(frozen=True, slots=True)
class Tail:
    """The newest turns of a session (one atomic read), and its first turn when that is older."""

    version: int
    total_turns: int
    turns: list[Turn]
    first: Turn | None

    @property
    def start(self) -> int:
        """The index of ``turns[0]`` in the whole session."""
        return self.total_turns - len(self.turns)


@dataclass(frozen=True, slots=True)
class Appended:
    version: int
    total_turns: int
    # The oldest turns this append dropped to stay within the session's bounds.
    dropped_turns: int


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class SessionStore:
    """Reads, appends to and deletes sessions; every write returns the session's new version."""

    def __init__(self, backend: Backend, limits: SessionLimits | None = None) -> None:
        self._backend = backend
        self.limits = limits or SessionLimits()
        redis = backend.redis
        self._append = redis.register_script(_APPEND)
        self._read = redis.register_script(_READ)
        self._tail = redis.register_script(_TAIL)
        self._delete = redis.register_script(_DELETE)
        self.index = SessionIndex(backend, self.limits.max_listed_sessions)

    @staticmethod
    def _keys(tenant: str, session_id: str) -> list[str]:
        validate_session_id(session_id)
        namespace = session_namespace(session_id)
        data = "llmesh:sess:" + slot_tag(tenant, namespace)
        return [data, version_key(tenant, namespace), data + ":bytes"]

    @staticmethod
    def _check_floor(session_id: str, version: int, floor: int) -> None:
        if version < floor:
            # Only a lagging replica can be behind a version a client already holds.
            raise Unavailable(
                f"session {session_id!r} is at version {version}, behind the requested {floor}",
                retry_after_s=0.1,
            )

    async def read(self, tenant: str, session_id: str, floor: int = 0) -> tuple[list[Turn], int]:
        """All turns and the version they are at (one atomic read)."""
        keys = self._keys(tenant, session_id)[:2]
        raw_version, raw_turns = await self._backend.call(self._read(keys=keys))
        version = int(raw_version)
        self._check_floor(session_id, version, floor)
        return [Turn.from_json(t) for t in raw_turns], version

    async def tail(self, tenant: str, session_id: str, count: int, floor: int = 0) -> Tail:
        """The newest ``count`` turns, the session's size and version (one atomic read)."""
        keys = self._keys(tenant, session_id)[:2]
        raw_version, raw_total, raw_turns, raw_first = await self._backend.call(
            self._tail(keys=keys, args=[count])
        )
        version = int(raw_version)
        self._check_floor(session_id, version, floor)
        first = _text(raw_first)
        return Tail(
            version=version,
            total_turns=int(raw_total),
            turns=[Turn.from_json(t) for t in raw_turns],
            first=Turn.from_json(first) if first else None,
        )

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
    ) -> Appended:
        """Appends ``turns``, dropping the oldest turns when the session would outgrow its bounds.
        ABORTED if ``expected_version`` is stale; INVALID_ARGUMENT if the turns cannot fit."""
        keys = self._keys(tenant, session_id)
        limits = self.limits
        if not turns:
            raise InvalidArgument("turns must not be empty")
        if len(turns) > limits.max_turns_per_append:
            raise InvalidArgument(f"at most {limits.max_turns_per_append} turns per append, got {len(turns)}")
        encoded = [t.to_json() for t in turns]
        size = 0
        for i, text in enumerate(encoded):
            turn_bytes = len(text.encode())
            if turn_bytes > limits.max_turn_bytes:
                raise InvalidArgument(f"turn {i} is larger than {limits.max_turn_bytes} bytes")
            size += turn_bytes
        if size > limits.max_bytes or len(turns) > limits.max_turns:
            raise InvalidArgument(
                f"the {len(turns)} turns ({size} bytes) exceed the session limits of {limits.max_turns} "
                f"turns and {limits.max_bytes} bytes"
            )
        if expected_version is not None and expected_version < 0:
            raise InvalidArgument("expected_version must be >= 0")
        if ttl_s < 0:
            raise InvalidArgument("ttl_seconds must be >= 0")
        ttl_ms = ttl_s * 1000 if ttl_s else limits.ttl_ms
        expected = "" if expected_version is None else str(expected_version)
        args = [expected, ttl_ms, limits.max_turns, limits.max_bytes, *encoded]
        result = await self._backend.call(self._append(keys=keys, args=args))
        outcome = _text(result[0])
        if outcome == "conflict":
            raise Aborted(
                f"session {session_id!r} is at version {int(result[1])}, not the expected {expected_version}"
            )
        if outcome == "full":
            raise InvalidArgument(
                f"session {session_id!r} cannot take {size} more bytes: its system and pinned turns "
                f"({int(result[1])} bytes), which are never dropped, leave too little of the "
                f"{limits.max_bytes}-byte limit"
            )
        try:
            await self.index.touch(tenant, session_id, ttl_ms)
        except Unavailable as exc:
            # The turns are stored: failing the append now would make a retry append them twice.
            log.warning(
                "session %s/%s appended but not indexed (listed after its next append): %s",
                tenant,
                session_id,
                exc,
            )
        return Appended(version=int(result[1]), total_turns=int(result[2]), dropped_turns=int(result[3]))

    async def delete(self, tenant: str, session_id: str) -> tuple[bool, int]:
        """Deletes the session; returns (whether it existed, the new version)."""
        keys = self._keys(tenant, session_id)
        deleted, version = await self._backend.call(self._delete(keys=keys, args=[self.limits.version_ttl_s]))
        try:
            await self.index.forget(tenant, [session_id])
        except Unavailable as exc:
            # A listing reads each session it names and leaves out (and forgets) the ones gone.
            log.warning("session %s/%s deleted but still indexed: %s", tenant, session_id, exc)
        return int(deleted) == 1, int(version)

    async def listing(self, tenant: str, page_size: int, page_token: str) -> tuple[list[SessionSummary], str]:
        """A page of the tenant's sessions (latest to expire first) and the next page's token."""
        return await self.index.page(tenant, page_size, page_token, self._keys)
