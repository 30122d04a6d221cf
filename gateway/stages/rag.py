"""Retrieval-augmented context from the embeddings service.

The chunks found in the named collections go into one system message placed
before the conversation's last user message. Embeddings down means the request
is served without retrieval (marked ``BYPASS``), as the degradation rules say.

Collections a request names are checked against the tenant's own
(:meth:`RagStage.check_named`) before the pipeline asks the response cache, whose
scope names them: an unknown name is a 404 before any key (the scope's version key
in Redis) exists, so a tenant cannot make keys by inventing names.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import grpc
from llmesh.v1 import common_pb2, embeddings_pb2, embeddings_pb2_grpc
from opentelemetry import trace

from services.runtime import context as rc
from services.runtime.cache_status import CacheStatus
from services.runtime.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable

log = logging.getLogger(__name__)

MAX_COLLECTIONS = 8
MAX_TOP_K = 32
CONTEXT_HEADER = "Use the following retrieved context to answer. Cite nothing that is not in it.\n\n"
# How long a tenant's listed collections answer a check without asking the embeddings service
# again (a name missing from the list always asks again: a collection just made is found).
KNOWN_FOR_S = 30.0


class RagStage:
    """Searches collections and injects the hits (None stub = no embeddings service)."""

    def __init__(self, stub: embeddings_pb2_grpc.EmbeddingServiceAsyncStub | None) -> None:
        self._stub = stub
        # tenant -> (when listed, the names of its collections then). Only tenants that named
        # collections are here, and only names that exist: bounded by what tenants stored.
        self._known: dict[str, tuple[float, frozenset[str]]] = {}

    async def check_named(self, names: Sequence[str]) -> None:
        """NotFound unless every collection in ``names`` (the request's ``rag.collections``) is
        one of the calling tenant's; Unavailable when that cannot be known now (the embeddings
        service is down and the names were not seen lately), FailedPrecondition without one."""
        if not names:
            return
        if len(names) > MAX_COLLECTIONS:
            raise InvalidArgument(f"rag.collections: at most {MAX_COLLECTIONS} collections")
        if self._stub is None:
            raise FailedPrecondition(
                "rag.collections: retrieval is off on this gateway (no embeddings service)"
            )
        tenant = rc.current().tenant
        listed_at, known = self._known.get(tenant, (0.0, frozenset()))
        wanted = set(names)
        if wanted <= known and time.monotonic() - listed_at < KNOWN_FOR_S:
            return
        try:
            reply = await self._stub.ListCollections(embeddings_pb2.ListCollectionsRequest())
        except grpc.aio.AioRpcError as exc:
            if wanted <= known:
                return  # seen lately: served as if the search failed (BYPASS), as before
            raise Unavailable(
                f"rag.collections cannot be checked now: the embeddings service answered {exc.code().name}",
                retry_after_s=1.0,
            ) from exc
        known = frozenset(c.name for c in reply.collections)
        self._known[tenant] = (time.monotonic(), known)
        missing = sorted(wanted - known)
        if missing:
            raise NotFound(f"rag.collections: collection {missing[0]!r} does not exist")

    async def search(
        self, collections: Sequence[str], query: str, top_k: int, min_score: float = 0.0
    ) -> list[embeddings_pb2.SearchHit]:
        if not collections or not query:
            return []
        if len(collections) > MAX_COLLECTIONS:
            raise InvalidArgument(f"rag.collections: at most {MAX_COLLECTIONS} collections")
        if not 0 < top_k <= MAX_TOP_K:
            raise InvalidArgument(f"rag.top_k must be between 1 and {MAX_TOP_K}")
        if self._stub is None:
            rc.current().set_cache_status(CacheStatus.BYPASS)
            return []
        calls = [
            self._stub.Search(
                embeddings_pb2.SearchRequest(collection=c, query=query, top_k=top_k, min_score=min_score)
            )
            for c in collections
        ]
        replies = await asyncio.gather(*calls, return_exceptions=True)
        hits: list[embeddings_pb2.SearchHit] = []
        for collection, reply in zip(collections, replies, strict=True):
            if isinstance(reply, grpc.aio.AioRpcError):
                if reply.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                    raise reply
                log.warning("RAG search of %r failed (%s): serving without it", collection, reply.code().name)
                rc.current().set_cache_status(CacheStatus.BYPASS)
                continue
            if isinstance(reply, BaseException):
                raise reply
            hits.extend(reply.hits)
        hits.sort(key=lambda h: h.score, reverse=True)
        hits = hits[:top_k]
        trace.get_current_span().set_attribute("rag.chunks", len(hits))
        return hits


def last_user_text(messages: Sequence[common_pb2.ChatMessage]) -> str:
    for message in reversed(messages):
        if message.role == common_pb2.ROLE_USER:
            return message.content
    return ""


def inject(
    messages: Sequence[common_pb2.ChatMessage], hits: Sequence[embeddings_pb2.SearchHit]
) -> list[common_pb2.ChatMessage]:
    """The conversation with one context message before its last user message."""
    out = list(messages)
    if not hits:
        return out
    body = "\n\n".join(f"[{i + 1}] {hit.text}" for i, hit in enumerate(hits))
    context = common_pb2.ChatMessage(role=common_pb2.ROLE_SYSTEM, content=CONTEXT_HEADER + body)
    at = max((i for i, m in enumerate(out) if m.role == common_pb2.ROLE_USER), default=len(out))
    out.insert(at, context)
    return out
