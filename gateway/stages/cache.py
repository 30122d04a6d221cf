"""Sessions and the response cache through the cache service.

The cache is an optimisation, never a dependency: when the service is down or
not configured the request is served without it and reported as ``BYPASS``
(the session stage then serves the request without its history, as the
degradation rules say). Versions the cache reads or writes travel back to the
caller through the request context (the client interceptors merge them).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from llmesh.v1 import cache_pb2, common_pb2
from opentelemetry import trace

from services.runtime import context as rc

log = logging.getLogger(__name__)

_STATUS_NAMES = {
    common_pb2.CACHE_STATUS_HIT: "HIT",
    common_pb2.CACHE_STATUS_MISS: "MISS",
    common_pb2.CACHE_STATUS_STALE: "STALE",
    common_pb2.CACHE_STATUS_BYPASS: "BYPASS",
}
STATUS_BY_NAME = {v: k for k, v in _STATUS_NAMES.items()}


def _degraded(stage: str, exc: grpc.aio.AioRpcError) -> None:
    log.warning("cache %s failed (%s): serving without the cache", stage, exc.code().name)
    rc.current().set_cache_status("BYPASS")
    trace.get_current_span().set_attribute("cache.degraded", True)


@dataclass
class Lookup:
    status: str
    entry: cache_pb2.CachedResponse | None = None
    age_ms: int = 0
    lease_token: str = ""
    key: cache_pb2.ResponseKey | None = None


class CacheStage:
    """Session read/append and response lookup/store (None stub = no cache configured)."""

    def __init__(self, stub: Any | None, session_ttl_s: int = 0) -> None:
        self._stub = stub
        self._session_ttl_s = session_ttl_s

    @property
    def enabled(self) -> bool:
        return self._stub is not None

    async def session(
        self, session_id: str, token_budget: int, model: str
    ) -> list[common_pb2.ChatMessage] | None:
        """The session's turns (truncated to the budget); None when the cache could not answer."""
        if self._stub is None:
            rc.current().set_cache_status("BYPASS")
            return None
        request = cache_pb2.GetSessionRequest(session_id=session_id, token_budget=token_budget, model=model)
        try:
            reply = await self._stub.GetSession(request)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return []  # a new session (or one that expired): it starts empty
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT and "tokenizer" in (exc.details() or ""):
                # A cache without a tokenizer cannot truncate: take the whole session.
                return await self.session(session_id, 0, model)
            if exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED):
                raise
            _degraded("GetSession", exc)
            return None
        span = trace.get_current_span()
        span.set_attribute("session.turns", len(reply.messages))
        span.set_attribute("session.truncated", reply.truncated)
        return list(reply.messages)

    async def append(self, session_id: str, turns: Sequence[common_pb2.ChatMessage]) -> None:
        if self._stub is None or not turns:
            return
        try:
            await self._stub.AppendTurns(
                cache_pb2.AppendTurnsRequest(
                    session_id=session_id, turns=turns, ttl_seconds=self._session_ttl_s
                )
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise
            _degraded("AppendTurns", exc)

    async def lookup(self, key: cache_pb2.ResponseKey) -> Lookup:
        """Exact (and opt-in semantic) lookup as single-flight producer or waiter."""
        ctx = rc.current()
        if self._stub is None:
            ctx.set_cache_status("BYPASS")
            return Lookup("BYPASS")
        try:
            reply = await self._stub.LookupResponse(
                cache_pb2.LookupResponseRequest(key=key, single_flight=True)
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                # An uncacheable key (too large, odd scope): serve without the cache.
                log.info("response cache refused the key: %s", exc.details())
                ctx.set_cache_status("BYPASS")
                return Lookup("BYPASS")
            _degraded("LookupResponse", exc)
            return Lookup("BYPASS")
        status = _STATUS_NAMES.get(reply.status, "MISS")
        ctx.set_cache_status(status, int(reply.age_ms) if status == "HIT" else None)
        span = trace.get_current_span()
        span.set_attribute("cache.hit", status == "HIT")
        if status == "HIT":
            span.set_attribute("cache.age_ms", int(reply.age_ms))
            span.set_attribute("cache.semantic", reply.semantic)
            return Lookup(status, entry=reply.entry, age_ms=int(reply.age_ms), key=key)
        return Lookup(status, lease_token=reply.lease_token, key=key)

    async def store(self, lookup: Lookup, entry: cache_pb2.CachedResponse) -> None:
        if self._stub is None or lookup.key is None or lookup.status in ("HIT", "BYPASS"):
            return
        if rc.current().no_store and not lookup.lease_token:
            return
        try:
            reply = await self._stub.StoreResponse(
                cache_pb2.StoreResponseRequest(key=lookup.key, entry=entry, lease_token=lookup.lease_token)
            )
        except grpc.aio.AioRpcError as exc:
            log.warning("cache StoreResponse failed (%s): %s", exc.code().name, exc.details())
            return
        if not reply.stored:
            log.info("response not cached: %s", reply.detail)

    async def release(self, lookup: Lookup) -> None:
        """Gives up the single-flight lease after a failed or cancelled computation."""
        if self._stub is None or lookup.key is None or not lookup.lease_token:
            return
        try:
            await self._stub.ReleaseLease(
                cache_pb2.ReleaseLeaseRequest(key=lookup.key, lease_token=lookup.lease_token)
            )
        except grpc.aio.AioRpcError as exc:
            log.warning("cache ReleaseLease failed (%s)", exc.code().name)
