"""gRPC ChatService: the same pipeline as the HTTP API, for stub users.

Authentication reads the ``authorization`` metadata (``Bearer <key>``); the
tenant it names replaces whatever ``x-llmesh-tenant`` the caller sent. The
consistency metadata was already read into the request context by the runtime's
server interceptor, which also returns versions, cache status and age in the
trailing metadata.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from llmesh.v1 import chat_pb2, chat_pb2_grpc, embeddings_pb2

from gateway.auth import Principal
from gateway.mesh import Gateway
from services.runtime import context as rc
from services.runtime import twins


class ChatServicer(chat_pb2_grpc.ChatServiceServicer):
    """ChatService over :class:`~gateway.pipeline.ChatPipeline`."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway

    async def _principal(self, context: grpc.aio.ServicerContext[Any, Any]) -> Principal:
        # Any: every RPC of the service authenticates the same way, whatever its messages.
        metadata = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        principal = await self._gateway.auth.authenticate(metadata.get("authorization"))
        ctx = rc.current()
        ctx.tenant = principal.tenant
        if ctx.deadline is None:
            ctx.deadline = time.monotonic() + self._gateway.settings.request_timeout_s
        return principal

    async def Complete(
        self,
        request: chat_pb2.CompleteRequest,
        context: grpc.aio.ServicerContext[chat_pb2.CompleteRequest, chat_pb2.CompleteResponse],
    ) -> chat_pb2.CompleteResponse:
        """The whole pipeline, one answer."""
        principal = await self._principal(context)
        pipeline = self._gateway.pipeline
        prepared = await pipeline.prepare(request, principal)
        return await pipeline.complete(prepared)

    async def CompleteStream(
        self,
        request: chat_pb2.CompleteStreamRequest,
        context: grpc.aio.ServicerContext[chat_pb2.CompleteStreamRequest, chat_pb2.CompleteStreamResponse],
    ) -> AsyncIterator[chat_pb2.CompleteStreamResponse]:
        """The whole pipeline, streamed; the last message carries usage and timings."""
        principal = await self._principal(context)
        pipeline = self._gateway.pipeline
        prepared = await pipeline.prepare(
            twins.convert(request, chat_pb2.CompleteRequest), principal, stream=True
        )
        # The stream holds the admission slot until it ends or this block closes it.
        async with pipeline.stream(prepared) as messages:
            async for message in messages:
                yield message

    async def CreateEmbeddings(
        self,
        request: chat_pb2.CreateEmbeddingsRequest,
        context: grpc.aio.ServicerContext[
            chat_pb2.CreateEmbeddingsRequest, chat_pb2.CreateEmbeddingsResponse
        ],
    ) -> chat_pb2.CreateEmbeddingsResponse:
        """Embeddings through the gateway (auth, limits)."""
        principal = await self._principal(context)
        inner = embeddings_pb2.EmbedRequest(
            texts=request.texts, model=request.model, reject_oversized=request.reject_oversized
        )
        reply = await self._gateway.pipeline.embed(inner, principal, self._gateway.embeddings)
        return chat_pb2.CreateEmbeddingsResponse(
            embeddings=reply.embeddings,
            model=reply.model,
            model_revision=reply.model_revision,
            dimension=reply.dimension,
            total_tokens=reply.total_tokens,
        )

    # -- what the mesh keeps for the tenant (gateway/tenant_cache.py) ------------------------------

    async def PurgeCache(
        self,
        request: chat_pb2.PurgeCacheRequest,
        context: grpc.aio.ServicerContext[chat_pb2.PurgeCacheRequest, chat_pb2.PurgeCacheResponse],
    ) -> chat_pb2.PurgeCacheResponse:
        """Stops serving the tenant's cached answers from before this call; the new version comes
        back in the response and in the x-llmesh-cache-version trailer."""
        principal = await self._principal(context)
        return await self._gateway.tenant_cache.purge(request, principal)

    async def ListSessions(
        self,
        request: chat_pb2.ChatServiceListSessionsRequest,
        context: grpc.aio.ServicerContext[
            chat_pb2.ChatServiceListSessionsRequest, chat_pb2.ChatServiceListSessionsResponse
        ],
    ) -> chat_pb2.ChatServiceListSessionsResponse:
        """A page of the tenant's sessions."""
        await self._principal(context)
        return await self._gateway.tenant_cache.list_sessions(request)

    async def GetSession(
        self,
        request: chat_pb2.ChatServiceGetSessionRequest,
        context: grpc.aio.ServicerContext[
            chat_pb2.ChatServiceGetSessionRequest, chat_pb2.ChatServiceGetSessionResponse
        ],
    ) -> chat_pb2.ChatServiceGetSessionResponse:
        """A session's turns (NOT_FOUND for another tenant's)."""
        await self._principal(context)
        return await self._gateway.tenant_cache.get_session(request)

    async def DeleteSession(
        self,
        request: chat_pb2.ChatServiceDeleteSessionRequest,
        context: grpc.aio.ServicerContext[
            chat_pb2.ChatServiceDeleteSessionRequest, chat_pb2.ChatServiceDeleteSessionResponse
        ],
    ) -> chat_pb2.ChatServiceDeleteSessionResponse:
        """Deletes a session (NOT_FOUND when there is none for this tenant)."""
        await self._principal(context)
        return await self._gateway.tenant_cache.delete_session(request)
