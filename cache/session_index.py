"""The per-tenant index of sessions, for listing them (``ListSessions``).

A session's turns live under a hash tag of their own (one cluster slot per session,
:mod:`cache.sessions`), so finding a tenant's sessions without an index would mean scanning
the whole keyspace of every node. Each tenant instead has one sorted set,
``llmesh:sess:idx:{<tenant>}``: member = session id, score = when the session expires as of
its last append (ms, Redis' clock). Listing it newest-expiry first lists the sessions
appended to most recently first (when sessions share a lifetime).

The index is another slot than the session, so it is written right after the session is
(an append, a delete), not in the same call. It may therefore name a session that is gone
(expired, or deleted when the index update failed) and miss one whose update failed (listed
again after its next append). A listing reads every session it names (turns, lifetime,
version) and leaves out, and drops from the index, the ones that are gone: it never shows a
session that does not exist.

Bounded: entries go when their sessions expire (pruned on every write and listing), a tenant
keeps at most ``max_sessions`` (those expiring soonest go first), and the set itself expires
with the latest session in it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Callable, Sequence
from typing import Any

from redis.asyncio.cluster import RedisCluster

from cache import defaults
from cache.backend import Backend
from cache.domain import SessionSummary
from services.runtime.errors import InvalidArgument
from services.runtime.versions import HLC_LUA

MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 100

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('(%d', now))
"""

# KEYS index. ARGV session id, ttl_ms, max members. Returns the session's expiry (ms).
_TOUCH = (
    _NOW
    + """
local ttl = tonumber(ARGV[2])
local expires = string.format('%d', now + ttl)
redis.call('ZADD', KEYS[1], expires, ARGV[1])
local n = redis.call('ZCARD', KEYS[1])
local cap = tonumber(ARGV[3])
if n > cap then redis.call('ZREMRANGEBYRANK', KEYS[1], 0, n - cap - 1) end
local left = redis.call('PTTL', KEYS[1])
if left < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
return expires
"""
)

# KEYS index. ARGV how many entries, cursor score ('' = from the top), cursor id.
# Returns {now ms, id, score, id, score, ...}: the entries after the cursor, latest expiry
# first (equal scores: members in reverse byte order, as ZRANGE REV gives them).
_PAGE = (
    _NOW
    + """
local want = tonumber(ARGV[1])
local cs, cid = ARGV[2], ARGV[3]
local max = '+inf'
if cs ~= '' then max = cs end
local out = {string.format('%d', now)}
local offset = 0
while #out - 1 < 2 * want do
  local page = redis.call(
    'ZRANGE', KEYS[1], max, '-inf', 'BYSCORE', 'REV', 'LIMIT', offset, want, 'WITHSCORES')
  if #page == 0 then break end
  for i = 1, #page, 2 do
    local m, s = page[i], page[i + 1]
    if cs == '' or tonumber(s) < tonumber(cs) or m < cid then
      out[#out + 1] = m
      out[#out + 1] = s
      if #out - 1 >= 2 * want then break end
    end
  end
  offset = offset + #page / 2
end
return out
"""
)

# KEYS session list, version. Returns {turns, ms left (-2 gone, -1 none), version}.
_STAT = (
    HLC_LUA
    + """
return {redis.call('LLEN', KEYS[1]), redis.call('PTTL', KEYS[1]), hlc_peek(KEYS[2])}
"""
)


def index_key(tenant: str) -> str:
    """The tenant's session index (``llmesh:sess:idx:{<tenant>}``; beside the sessions' own
    ``llmesh:sess:{...}`` keys, so the cache's Redis user already reaches it)."""
    return "llmesh:sess:idx:{" + tenant + "}"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def encode_token(score: int, session_id: str) -> str:
    return base64.urlsafe_b64encode(f"{score}:{session_id}".encode()).decode().rstrip("=")


def decode_token(token: str) -> tuple[int, str]:
    """(score, session id) of a page token; InvalidArgument for one this module did not make."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raw = ""
    score, sep, session_id = raw.partition(":")
    if not sep or not score.isdigit() or not session_id or len(token) > 512:
        raise InvalidArgument("page_token is malformed: pass the next_page_token of the previous page")
    return int(score), session_id


class SessionIndex:
    """Records, forgets and pages through the sessions of each tenant (see the module doc)."""

    def __init__(self, backend: Backend, max_sessions: int = defaults.MAX_LISTED_SESSIONS) -> None:
        if max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        self._backend = backend
        self.max_sessions = max_sessions
        redis = backend.redis
        self._cluster = isinstance(redis, RedisCluster)
        self._touch = redis.register_script(_TOUCH)
        self._page = redis.register_script(_PAGE)
        self._stat = redis.register_script(_STAT)

    async def touch(self, tenant: str, session_id: str, ttl_ms: int) -> None:
        """Records that the session was written and lives ``ttl_ms`` from now."""
        await self._backend.call(
            self._touch(keys=[index_key(tenant)], args=[session_id, ttl_ms, self.max_sessions])
        )

    async def forget(self, tenant: str, session_ids: Sequence[str]) -> None:
        if session_ids:
            await self._backend.call(self._backend.redis.zrem(index_key(tenant), *session_ids))

    async def page(
        self, tenant: str, page_size: int, page_token: str, keys: Callable[[str, str], list[str]]
    ) -> tuple[list[SessionSummary], str]:
        """One page of the tenant's sessions and the token of the next ('' on the last).

        ``keys(tenant, session_id)`` gives a session's [list, version] keys."""
        if not 0 <= page_size <= MAX_PAGE_SIZE:
            raise InvalidArgument(f"page_size must be between 0 and {MAX_PAGE_SIZE}, got {page_size}")
        size = page_size or DEFAULT_PAGE_SIZE
        score, after = decode_token(page_token) if page_token else (None, "")
        reply = await self._backend.call(
            self._page(keys=[index_key(tenant)], args=[size + 1, "" if score is None else score, after])
        )
        now = int(reply[0])
        entries = [(_text(reply[i]), int(float(reply[i + 1]))) for i in range(1, len(reply), 2)]
        more = len(entries) > size
        entries = entries[:size]
        stats = await self._stats([keys(tenant, session_id) for session_id, _ in entries])
        sessions: list[SessionSummary] = []
        gone: list[str] = []
        for (session_id, _), (turns, raw_left, version) in zip(entries, stats, strict=True):
            if int(turns) == 0:
                gone.append(session_id)
                continue
            left = int(raw_left)
            sessions.append(
                SessionSummary(
                    session_id=session_id,
                    total_turns=int(turns),
                    version=int(version),
                    expires_at_ms=now + left if left >= 0 else 0,
                )
            )
        if gone:
            await self.forget(tenant, gone)
        token = encode_token(entries[-1][1], entries[-1][0]) if more else ""
        return sessions, token

    async def _stats(self, keys: list[list[str]]) -> list[list[Any]]:
        """Turns, ms left and version of each session: one round trip (pipelined, or concurrent
        on a cluster, where every session is its own slot)."""
        if not keys:
            return []
        if self._cluster:
            return list(await self._backend.call(asyncio.gather(*(self._stat(keys=k[:2]) for k in keys))))
        async with self._backend.redis.pipeline(transaction=False) as pipe:
            for k in keys:
                await self._stat(keys=k[:2], client=pipe)
            results: list[list[Any]] = await self._backend.call(pipe.execute())
        return results
