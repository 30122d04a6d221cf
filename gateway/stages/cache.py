"""Sessions and the response cache through the cache service.

The cache is an optimisation, never a dependency: when the service is down or
not configured the request is served without it and reported as ``BYPASS``
(the session stage then serves the request without its history, as the
degradation rules say). Versions the cache reads or writes travel back to the
caller through the request context (the client interceptors merge them).

Every call has a bound of its own (``cache_timeout_s`` for reads,
``cache_write_timeout_s`` for writes), so a cache that stops answering (a frozen
process, a partition) costs a request a fraction of a second, not its deadline.
A call still running at its bound is not cut at once: the cache's health check
gets the same bound, and only a cache that does not answer that either is given
up on for this call (a live cache may legitimately hold a single-flight waiter
until the producer finishes; that wait stays bounded by the request deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2
from llmesh.v1 import cache_pb2, cache_pb2_grpc, common_pb2
from opentelemetry import trace
from prometheus_client import Counter

from gateway.direct_lookup import DirectLookups
from gateway.local_cache import Copy, LocalCopies, digest
from services.runtime import context as rc
from services.runtime import namespaces
from services.runtime.cache_status import CacheStatus, describe_match
from services.runtime.versions import version_key

log = logging.getLogger(__name__)

T = TypeVar("T")

LOOKUPS = Counter(
    "llmesh_gateway_cache_lookups_total",
    "Response-cache lookups by where they were answered (local: this gateway's copy; direct: a "
    "miss decided in Redis by this gateway; cache: the cache service) and cache status.",
    ["source", "status"],
)


class CacheStalled(Exception):
    """The cache did not answer a call, nor its health check, within the call's bound."""

    def __init__(self, stage: str, bound_s: float) -> None:
        super().__init__(f"cache {stage}: no answer within {bound_s:g} s, nor to a health check")
        self.stage = stage


def _degraded(stage: str, exc: grpc.aio.AioRpcError | CacheStalled) -> None:
    code = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else "STALLED"
    log.warning("cache %s failed (%s): serving without the cache", stage, code)
    rc.current().set_cache_status(CacheStatus.BYPASS)
    trace.get_current_span().set_attribute("cache.degraded", True)


@dataclass
class Lookup:
    status: CacheStatus
    entry: cache_pb2.CachedResponse | None = None
    age_ms: int = 0
    lease_token: str = ""
    key: cache_pb2.ResponseKey | None = None


class CacheStage:
    """Session read/append and response lookup/store (None stub = no cache configured)."""

    def __init__(
        self,
        stub: cache_pb2_grpc.ContextCacheServiceAsyncStub | None,
        session_ttl_s: int = 0,
        *,
        health: Any | None = None,
        read_timeout_s: float = 0.3,
        write_timeout_s: float = 1.5,
        local: LocalCopies[cache_pb2.CachedResponse] | None = None,
        direct: DirectLookups | None = None,
    ) -> None:
        self._stub = stub
        # Misses decided in Redis without the service's call (gateway/direct_lookup.py).
        self.direct = direct
        # Exact hits kept in this process (gateway/local_cache.py); None = every lookup is a call.
        self.local = local
        self._session_ttl_s = session_ttl_s
        self._health = health
        self._read_s = read_timeout_s
        self._write_s = write_timeout_s
        # One health probe at a time, shared by every call waiting on it.
        self._probe: asyncio.Future[bool] | None = None

    async def _bounded(self, stage: str, call: Callable[[], Awaitable[T]], bound_s: float) -> T:
        """``call()``, given up (:class:`CacheStalled`) when neither it nor a health check
        answers within ``bound_s``; a live cache is waited for (the request deadline bounds it)."""
        task = asyncio.ensure_future(call())
        try:
            done, _ = await asyncio.wait({task}, timeout=bound_s)
            if not done and not await self._alive(bound_s):
                raise CacheStalled(stage, bound_s)
            return await task
        finally:
            if not task.done():
                task.cancel()  # cancelling the awaiting task cancels the RPC
                with contextlib.suppress(BaseException):
                    await task

    async def _alive(self, bound_s: float) -> bool:
        if self._health is None:
            return False
        if self._probe is None or self._probe.done():
            self._probe = asyncio.ensure_future(self._check(bound_s))
        return await asyncio.shield(self._probe)

    async def _check(self, bound_s: float) -> bool:
        health: Any = self._health
        try:
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=bound_s)
        except grpc.aio.AioRpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    @property
    def enabled(self) -> bool:
        return self._stub is not None

    async def session(
        self, session_id: str, token_budget: int, model: str
    ) -> list[common_pb2.ChatMessage] | None:
        """The session's turns (truncated to the budget); None when the cache could not answer."""
        if self._stub is None:
            rc.current().set_cache_status(CacheStatus.BYPASS)
            return None
        request = cache_pb2.GetSessionRequest(session_id=session_id, token_budget=token_budget, model=model)
        stub = self._stub
        try:
            reply = await self._bounded("GetSession", lambda: stub.GetSession(request), self._read_s)
        except CacheStalled as exc:
            _degraded("GetSession", exc)
            return None
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
        """Appends the turns; a cache that fails or stalls is reported as BYPASS (a turn given up
        on after the bound may or may not have been stored when the cache resumes)."""
        if self._stub is None or not turns:
            return
        stub = self._stub
        request = cache_pb2.AppendTurnsRequest(
            session_id=session_id, turns=turns, ttl_seconds=self._session_ttl_s
        )
        try:
            await self._bounded("AppendTurns", lambda: stub.AppendTurns(request), self._write_s)
        except CacheStalled as exc:
            _degraded("AppendTurns", exc)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise
            _degraded("AppendTurns", exc)

    async def lookup(
        self, key: cache_pb2.ResponseKey, before_remote: Callable[[], None] | None = None
    ) -> Lookup:
        """Exact (and opt-in semantic) lookup as single-flight producer or waiter.

        ``before_remote`` is called once this gateway's own copies cannot answer, just before
        the cache service is asked (not for a local hit, nor without a cache).
        """
        ctx = rc.current()
        if self._stub is None:
            ctx.set_cache_status(CacheStatus.BYPASS)
            return Lookup(CacheStatus.BYPASS)
        stub = self._stub
        local = self.local
        local_key, mark, t0 = b"", None, 0.0
        if local is not None:
            local_key = digest(key.SerializeToString(deterministic=True))
            found = await local.get(ctx.tenant, local_key, ctx.floor_for, ctx.max_age_ms)
            if found is not None:
                LOOKUPS.labels("local", CacheStatus.HIT.value).inc()
                return self._local_hit(ctx, key, *found)
            mark, t0 = local.watch.mark(), time.monotonic()
        if before_remote is not None:
            before_remote()
            # One loop turn first: a generation started there sends its request before this
            # lookup's own work (the first token waits for the engine, not for the lookup).
            await asyncio.sleep(0)
        if self.direct is not None and not ctx.semantic:
            token = await self.direct.acquire(ctx.tenant, key)
            if token:
                LOOKUPS.labels("direct", CacheStatus.MISS.value).inc()
                ctx.set_cache_status(CacheStatus.MISS)
                span = trace.get_current_span()
                span.set_attribute("cache.hit", False)
                span.set_attribute("cache.direct", True)
                return Lookup(CacheStatus.MISS, lease_token=token, key=key)
        request = cache_pb2.LookupResponseRequest(key=key, single_flight=True)
        try:
            reply = await self._bounded("LookupResponse", lambda: stub.LookupResponse(request), self._read_s)
        except (CacheStalled, grpc.aio.AioRpcError) as exc:
            LOOKUPS.labels("cache", CacheStatus.BYPASS.value).inc()
            if isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                # An uncacheable key (too large, odd scope): serve without the cache.
                log.info("response cache refused the key: %s", exc.details())
                ctx.set_cache_status(CacheStatus.BYPASS)
                return Lookup(CacheStatus.BYPASS)
            _degraded("LookupResponse", exc)
            return Lookup(CacheStatus.BYPASS)
        # A status this build does not know (a newer cache) is served as a miss.
        status = CacheStatus.from_pb(reply.status) or CacheStatus.MISS
        LOOKUPS.labels("cache", status.value).inc()
        ctx.set_cache_status(status, int(reply.age_ms) if status is CacheStatus.HIT else None)
        span = trace.get_current_span()
        span.set_attribute("cache.hit", status is CacheStatus.HIT)
        if status is CacheStatus.HIT:
            span.set_attribute("cache.age_ms", int(reply.age_ms))
            span.set_attribute("cache.semantic", reply.semantic)
            ctx.cache_match = describe_match(
                reply.semantic, reply.similarity, reply.verifier, reply.verifier_score
            )
            if local is not None and not reply.semantic and reply.entry_id:
                local.put(
                    ctx.tenant,
                    local_key,
                    reply.entry,
                    stamps={s.namespace: s.version for s in reply.entry.derived_from},
                    extra_keys=[version_key(ctx.tenant, namespaces.entry(reply.entry_id))],
                    mark=mark,
                    t0=t0,
                    age_ms=int(reply.age_ms),
                    ttl_ms=int(reply.ttl_ms),
                    size=reply.entry.ByteSize(),
                )
            return Lookup(status, entry=reply.entry, age_ms=int(reply.age_ms), key=key)
        return Lookup(status, lease_token=reply.lease_token, key=key)

    @staticmethod
    def _local_hit(
        ctx: rc.RequestContext, key: cache_pb2.ResponseKey, copy: Copy[cache_pb2.CachedResponse], age_ms: int
    ) -> Lookup:
        """A hit served from this gateway's copy, reported exactly as the cache reports one."""
        for namespace, version in copy.stamps.items():
            ctx.observe(namespace, version)
        ctx.set_cache_status(CacheStatus.HIT, age_ms)
        ctx.cache_match = describe_match(False)
        span = trace.get_current_span()
        span.set_attribute("cache.hit", True)
        span.set_attribute("cache.local", True)
        span.set_attribute("cache.age_ms", age_ms)
        return Lookup(CacheStatus.HIT, entry=copy.value, age_ms=age_ms, key=key)

    async def store(self, lookup: Lookup, entry: cache_pb2.CachedResponse) -> None:
        if self._stub is None or lookup.key is None or lookup.status in (CacheStatus.HIT, CacheStatus.BYPASS):
            return
        if rc.current().no_store and not lookup.lease_token:
            return
        stub = self._stub
        request = cache_pb2.StoreResponseRequest(key=lookup.key, entry=entry, lease_token=lookup.lease_token)
        try:
            reply = await self._bounded("StoreResponse", lambda: stub.StoreResponse(request), self._write_s)
        except CacheStalled as exc:
            log.warning("%s: response not cached", exc)
            return
        except grpc.aio.AioRpcError as exc:
            log.warning("cache StoreResponse failed (%s): %s", exc.code().name, exc.details())
            return
        if not reply.stored:
            log.info("response not cached: %s", reply.detail)

    async def release(self, lookup: Lookup) -> None:
        """Gives up the single-flight lease after a failed or cancelled computation."""
        if self._stub is None or lookup.key is None or not lookup.lease_token:
            return
        stub = self._stub
        request = cache_pb2.ReleaseLeaseRequest(key=lookup.key, lease_token=lookup.lease_token)
        try:
            await self._bounded("ReleaseLease", lambda: stub.ReleaseLease(request), self._write_s)
        except CacheStalled as exc:
            # The lease expires on its own (the cache's lease_ms).
            log.warning("%s: lease left to expire", exc)
            return
        except grpc.aio.AioRpcError as exc:
            log.warning("cache ReleaseLease failed (%s)", exc.code().name)
