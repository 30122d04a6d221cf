"""The embeddings service as vector stores use it: one collection per store.

A store's collection is named by the store's id (``vs_...``, a valid collection name), and
is the tenant's own: the embeddings service scopes collections by the request context's
tenant (``x-llmesh-tenant``), so the calls here need the tenant's context active. That is
also what makes a store usable from chat as ``rag.collections = ["vs_..."]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc
from llmesh.v1 import embeddings_pb2, embeddings_pb2_grpc

from gateway.vector_stores.documents import Part

# DeleteDocuments takes any number of ids; calls are kept to this many.
DELETE_BATCH = 1000


@dataclass(frozen=True, slots=True)
class Chunking:
    """Chunk size and overlap in the embedding model's tokens (OpenAI's static strategy)."""

    max_tokens: int
    overlap_tokens: int


@dataclass(frozen=True, slots=True)
class Hit:
    """One chunk a search found."""

    text: str
    score: float
    document_id: str
    metadata: dict[str, str]


class CollectionClient(Protocol):
    """What vector stores need of the embeddings service (a fake stands in for it in tests)."""

    async def upsert(self, collection: str, parts: Sequence[Part], chunking: Chunking | None) -> int:
        """Writes the documents (all or nothing); the number of chunks written."""
        ...

    async def delete(self, collection: str, document_ids: Sequence[str]) -> None:
        """Removes the documents; a collection that does not exist is not an error."""
        ...

    async def search(
        self, collection: str, query: str, top_k: int, min_score: float, filters: Mapping[str, str]
    ) -> list[Hit]:
        """Best first; an empty list for a collection that does not exist (yet)."""
        ...


class GrpcCollections:
    """:class:`CollectionClient` over the EmbeddingService stub."""

    def __init__(self, stub: embeddings_pb2_grpc.EmbeddingServiceAsyncStub) -> None:
        self._stub = stub

    async def upsert(self, collection: str, parts: Sequence[Part], chunking: Chunking | None) -> int:
        request = embeddings_pb2.UpsertDocumentsRequest(
            collection=collection,
            documents=[embeddings_pb2.Document(id=p.id, text=p.text, metadata=p.metadata) for p in parts],
        )
        if chunking is not None:
            request.chunking.max_tokens = chunking.max_tokens
            request.chunking.overlap_tokens = chunking.overlap_tokens
        reply = await self._stub.UpsertDocuments(request)
        return int(reply.chunk_count)

    async def delete(self, collection: str, document_ids: Sequence[str]) -> None:
        for start in range(0, len(document_ids), DELETE_BATCH):
            batch = document_ids[start : start + DELETE_BATCH]
            try:
                await self._stub.DeleteDocuments(
                    embeddings_pb2.DeleteDocumentsRequest(collection=collection, document_ids=batch)
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                return  # no collection: nothing was ever written to it

    async def search(
        self, collection: str, query: str, top_k: int, min_score: float, filters: Mapping[str, str]
    ) -> list[Hit]:
        try:
            reply = await self._stub.Search(
                embeddings_pb2.SearchRequest(
                    collection=collection,
                    query=query,
                    top_k=top_k,
                    min_score=min_score,
                    filter=dict(filters),
                )
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return []  # the store has no completed file yet: its collection is made by the first
            raise
        return [Hit(h.text, float(h.score), h.document_id, dict(h.metadata)) for h in reply.hits]
