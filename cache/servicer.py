"""gRPC adapter of the cache: proto in -> :class:`cache.service.CacheService` -> proto out."""

from __future__ import annotations

import grpc
from llmesh.v1 import cache_pb2, cache_pb2_grpc

from cache import convert
from cache.service import CacheService
from services.runtime.errors import InvalidArgument


class ContextCacheServicer(cache_pb2_grpc.ContextCacheServiceServicer):
    """ContextCacheService over :class:`CacheService`."""

    def __init__(self, service: CacheService) -> None:
        self._service = service

    async def GetSession(
        self,
        request: cache_pb2.GetSessionRequest,
        context: grpc.aio.ServicerContext[cache_pb2.GetSessionRequest, cache_pb2.GetSessionResponse],
    ) -> cache_pb2.GetSessionResponse:
        """The session's turns, truncated to the token budget with the chosen strategy."""
        view = await self._service.get_session(
            request.session_id,
            request.token_budget,
            convert.strategy_from_pb(request.strategy),
            request.model,
        )
        return convert.session_to_pb(view)

    async def AppendTurns(
        self,
        request: cache_pb2.AppendTurnsRequest,
        context: grpc.aio.ServicerContext[cache_pb2.AppendTurnsRequest, cache_pb2.AppendTurnsResponse],
    ) -> cache_pb2.AppendTurnsResponse:
        """Appends turns (ABORTED if ``expected_version`` is not the session's version)."""
        expected = request.expected_version if request.HasField("expected_version") else None
        version, total = await self._service.append_turns(
            request.session_id, convert.turns_from_pb(request.turns), expected, request.ttl_seconds
        )
        return cache_pb2.AppendTurnsResponse(version=version, total_turns=total)

    async def DeleteSession(
        self,
        request: cache_pb2.DeleteSessionRequest,
        context: grpc.aio.ServicerContext[cache_pb2.DeleteSessionRequest, cache_pb2.DeleteSessionResponse],
    ) -> cache_pb2.DeleteSessionResponse:
        deleted, version = await self._service.delete_session(request.session_id)
        return cache_pb2.DeleteSessionResponse(deleted=deleted, version=version)

    async def LookupResponse(
        self,
        request: cache_pb2.LookupResponseRequest,
        context: grpc.aio.ServicerContext[cache_pb2.LookupResponseRequest, cache_pb2.LookupResponseResponse],
    ) -> cache_pb2.LookupResponseResponse:
        """Exact (then opt-in semantic) lookup; HIT, MISS, STALE or BYPASS, maybe a lease."""
        result = await self._service.lookup(
            convert.key_from_pb(request.key), request.single_flight, request.wait_ms
        )
        return convert.lookup_to_pb(result)

    async def StoreResponse(
        self,
        request: cache_pb2.StoreResponseRequest,
        context: grpc.aio.ServicerContext[cache_pb2.StoreResponseRequest, cache_pb2.StoreResponseResponse],
    ) -> cache_pb2.StoreResponseResponse:
        """Stores a produced response under its key and releases the lease."""
        result = await self._service.store(
            convert.key_from_pb(request.key),
            convert.payload_from_pb(request.entry),
            convert.stamps_from_pb(request.entry.derived_from),
            model=request.entry.model,
            lease_token=request.lease_token,
            ttl_s=request.ttl_seconds,
        )
        return cache_pb2.StoreResponseResponse(stored=result.stored, detail=result.detail)

    async def ReleaseLease(
        self,
        request: cache_pb2.ReleaseLeaseRequest,
        context: grpc.aio.ServicerContext[cache_pb2.ReleaseLeaseRequest, cache_pb2.ReleaseLeaseResponse],
    ) -> cache_pb2.ReleaseLeaseResponse:
        released = await self._service.release(convert.key_from_pb(request.key), request.lease_token)
        return cache_pb2.ReleaseLeaseResponse(released=released)

    async def Invalidate(
        self,
        request: cache_pb2.InvalidateRequest,
        context: grpc.aio.ServicerContext[cache_pb2.InvalidateRequest, cache_pb2.InvalidateResponse],
    ) -> cache_pb2.InvalidateResponse:
        """Bumps a namespace or the whole tenant, or drops one entry; never scans."""
        target = request.WhichOneof("target")
        only_existing = request.only_existing
        if target == "namespace":
            versions = await self._service.invalidate_namespace(
                request.namespace, only_existing=only_existing
            )
        elif target == "key":
            versions = await self._service.invalidate_key(convert.key_from_pb(request.key))
        elif target == "tenant" and request.tenant:
            versions = await self._service.invalidate_tenant(only_existing=only_existing)
        else:
            raise InvalidArgument("invalidate: set namespace, key or tenant=true")
        return cache_pb2.InvalidateResponse(versions=convert.stamps_to_pb(versions))

    async def GetVersions(
        self,
        request: cache_pb2.GetVersionsRequest,
        context: grpc.aio.ServicerContext[cache_pb2.GetVersionsRequest, cache_pb2.GetVersionsResponse],
    ) -> cache_pb2.GetVersionsResponse:
        versions = await self._service.get_versions(list(request.namespaces))
        return cache_pb2.GetVersionsResponse(versions=convert.stamps_to_pb(versions))

    async def ListSessions(
        self,
        request: cache_pb2.ListSessionsRequest,
        context: grpc.aio.ServicerContext[cache_pb2.ListSessionsRequest, cache_pb2.ListSessionsResponse],
    ) -> cache_pb2.ListSessionsResponse:
        """A page of the calling tenant's sessions, the latest to expire first."""
        sessions, token = await self._service.list_sessions(request.page_size, request.page_token)
        return cache_pb2.ListSessionsResponse(
            sessions=[convert.summary_to_pb(s) for s in sessions], next_page_token=token
        )
