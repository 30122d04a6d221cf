"""What the cache service keeps for a tenant, managed by the tenant: purge its cached answers;
list, read and delete its sessions.

Both front ends call this with ChatService messages: the HTTP API (``gateway/api/cache/``,
``gateway/api/sessions/``) and the gRPC ChatService (``gateway/servicer.py``). The tenant is
the caller's, from its API key: every call carries it to the cache in the request context, and
the cache keys everything by it, so another tenant's session is NOT_FOUND exactly like one that
never existed.

A purge bumps a version the cache owns and never scans (``services/runtime/versions.py``): all
the tenant's answers (the ``tenant`` namespace every answer is stamped with), one
``response:<scope>`` (one RAG scope, or the answers made without RAG) or one ``session:<id>``.
Versions other services own (``policy``, ``rag:<collection>``: the embeddings replicas follow a
collection's version as the id of its change log) are refused. A purge only bumps a version
that exists (``InvalidateRequest.only_existing``), so no name a tenant makes up leaves a key
behind. The version it returns, sent as the next requests' floor, keeps every answer from
before the purge out, even on a lagging replica.
"""

from __future__ import annotations

from llmesh.v1 import cache_pb2, cache_pb2_grpc, chat_pb2, common_pb2

from gateway.auth import Principal
from gateway.pipeline import rag_response_scope
from services.runtime import context as rc
from services.runtime import namespaces
from services.runtime.errors import FailedPrecondition, InvalidArgument, NotFound

# A management call is not on the chat path: a cache that does not answer in this long is a 504.
CALL_TIMEOUT_S = 5.0


def purge_target(request: chat_pb2.PurgeCacheRequest, principal: Principal) -> str:
    """The namespace a purge bumps (InvalidArgument for one the cache does not own)."""
    target = request.WhichOneof("target")
    if target is None:
        return namespaces.TENANT
    if target == "rag":
        scope = rag_response_scope(request.rag, principal.settings)
        if not scope:
            raise InvalidArgument(
                "rag: name the collections whose answers to purge "
                "(this tenant has no default rag_collections)"
            )
        return namespaces.response_scope(scope)
    namespace = request.namespace
    if not namespaces.created_by_cache(namespace):
        raise InvalidArgument(
            f"namespace {namespace[:80]!r} cannot be purged: name one the cache owns ('tenant', "
            "'response:<scope>', 'session:<id>'); purge a RAG collection's answers with rag"
        )
    return namespace


def cache_version(ctx: rc.RequestContext) -> str:
    """What the caller sends as its next floor: its floors merged with what this call saw."""
    return rc.format_versions(rc.merged_versions(ctx.floors, ctx.observed))


class TenantCache:
    """Purge and sessions of the calling tenant over the cache service (None stub = no cache)."""

    def __init__(
        self, stub: cache_pb2_grpc.ContextCacheServiceAsyncStub | None, *, timeout_s: float = CALL_TIMEOUT_S
    ) -> None:
        self._stub_or_none = stub
        self._timeout_s = timeout_s

    @property
    def _stub(self) -> cache_pb2_grpc.ContextCacheServiceAsyncStub:
        if self._stub_or_none is None:
            raise FailedPrecondition(
                "sessions and the response cache are off on this gateway (no cache service: "
                "LLMESH_GATEWAY_CACHE_ADDRESS)"
            )
        return self._stub_or_none

    async def purge(
        self, request: chat_pb2.PurgeCacheRequest, principal: Principal
    ) -> chat_pb2.PurgeCacheResponse:
        """Bumps the target's version (see the module doc) and returns it."""
        namespace = purge_target(request, principal)
        invalidate = (
            cache_pb2.InvalidateRequest(tenant=True, only_existing=True)
            if namespace == namespaces.TENANT
            else cache_pb2.InvalidateRequest(namespace=namespace, only_existing=True)
        )
        reply = await self._stub.Invalidate(invalidate, timeout=self._timeout_s)
        stamp = next((v for v in reply.versions if v.namespace == namespace), None)
        if stamp is None:
            raise RuntimeError(f"the cache's Invalidate answered no version of {namespace!r}")
        ctx = rc.current()
        ctx.observe(stamp.namespace, stamp.version)
        return chat_pb2.PurgeCacheResponse(
            version=common_pb2.VersionStamp(namespace=stamp.namespace, version=stamp.version),
            cache_version=cache_version(ctx),
        )

    async def list_sessions(
        self, request: chat_pb2.ChatServiceListSessionsRequest
    ) -> chat_pb2.ChatServiceListSessionsResponse:
        reply = await self._stub.ListSessions(
            cache_pb2.ListSessionsRequest(page_size=request.page_size, page_token=request.page_token),
            timeout=self._timeout_s,
        )
        return chat_pb2.ChatServiceListSessionsResponse(
            sessions=reply.sessions, next_page_token=reply.next_page_token
        )

    async def get_session(
        self, request: chat_pb2.ChatServiceGetSessionRequest
    ) -> chat_pb2.ChatServiceGetSessionResponse:
        """Every turn (no token budget: the cache bounds a session's size)."""
        reply = await self._stub.GetSession(
            cache_pb2.GetSessionRequest(session_id=request.session_id), timeout=self._timeout_s
        )
        return chat_pb2.ChatServiceGetSessionResponse(
            session_id=reply.session_id, messages=reply.messages, version=reply.version
        )

    async def delete_session(
        self, request: chat_pb2.ChatServiceDeleteSessionRequest
    ) -> chat_pb2.ChatServiceDeleteSessionResponse:
        """Deletes it; NotFound when there was none (as reading it would say)."""
        reply = await self._stub.DeleteSession(
            cache_pb2.DeleteSessionRequest(session_id=request.session_id), timeout=self._timeout_s
        )
        if not reply.deleted:
            raise NotFound(f"session {request.session_id!r} not found")
        return chat_pb2.ChatServiceDeleteSessionResponse(session_id=request.session_id, version=reply.version)
