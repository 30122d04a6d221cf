"""gRPC EmbeddingService: proto in -> domain call -> proto out."""

from __future__ import annotations

import grpc
from llmesh.v1 import embeddings_pb2, embeddings_pb2_grpc

from services.embeddings import convert
from services.embeddings.collections import Collections
from services.embeddings.embedder import Embedder
from services.embeddings.verifier import Verification


class EmbeddingServicer(embeddings_pb2_grpc.EmbeddingServiceServicer):
    """Embeddings, ingestion and search; domain errors map to status codes in the interceptor."""

    def __init__(self, embedder: Embedder, collections: Collections, verification: Verification) -> None:
        self._embedder = embedder
        self._collections = collections
        self.verification = verification

    async def Embed(
        self,
        request: embeddings_pb2.EmbedRequest,
        context: grpc.aio.ServicerContext[embeddings_pb2.EmbedRequest, embeddings_pb2.EmbedResponse],
    ) -> embeddings_pb2.EmbedResponse:
        """Embeds texts (batched with concurrent callers)."""
        result = await self._embedder.embed(
            list(request.texts), model=request.model, reject_oversized=request.reject_oversized
        )
        return convert.embed_response_to_pb(result)

    async def UpsertDocuments(
        self,
        request: embeddings_pb2.UpsertDocumentsRequest,
        context: grpc.aio.ServicerContext[
            embeddings_pb2.UpsertDocumentsRequest, embeddings_pb2.UpsertDocumentsResponse
        ],
    ) -> embeddings_pb2.UpsertDocumentsResponse:
        """Chunks, embeds and stores documents, replacing earlier versions of them."""
        result = await self._collections.upsert(
            request.collection,
            convert.documents_from_pb(list(request.documents)),
            max_tokens=request.chunking.max_tokens,
            overlap_tokens=request.chunking.overlap_tokens,
            reject_oversized=request.reject_oversized,
        )
        return embeddings_pb2.UpsertDocumentsResponse(
            version=result.version, document_count=result.document_count, chunk_count=result.chunk_count
        )

    async def Search(
        self,
        request: embeddings_pb2.SearchRequest,
        context: grpc.aio.ServicerContext[embeddings_pb2.SearchRequest, embeddings_pb2.SearchResponse],
    ) -> embeddings_pb2.SearchResponse:
        """Top-k chunks of a collection for a query."""
        result = await self._collections.search(
            request.collection,
            request.query,
            top_k=request.top_k,
            filters=dict(request.filter),
            min_score=request.min_score,
        )
        return convert.search_response_to_pb(result)

    async def DeleteDocuments(
        self,
        request: embeddings_pb2.DeleteDocumentsRequest,
        context: grpc.aio.ServicerContext[
            embeddings_pb2.DeleteDocumentsRequest, embeddings_pb2.DeleteDocumentsResponse
        ],
    ) -> embeddings_pb2.DeleteDocumentsResponse:
        """Removes documents and their chunks."""
        result = await self._collections.delete(request.collection, list(request.document_ids))
        return embeddings_pb2.DeleteDocumentsResponse(
            version=result.version, deleted_count=result.deleted_count
        )

    async def ListCollections(
        self,
        request: embeddings_pb2.ListCollectionsRequest,
        context: grpc.aio.ServicerContext[
            embeddings_pb2.ListCollectionsRequest, embeddings_pb2.ListCollectionsResponse
        ],
    ) -> embeddings_pb2.ListCollectionsResponse:
        """The calling tenant's collections."""
        collections = await self._collections.list()
        return embeddings_pb2.ListCollectionsResponse(
            collections=[convert.collection_to_pb(c) for c in collections]
        )

    async def ScorePairs(
        self,
        request: embeddings_pb2.ScorePairsRequest,
        context: grpc.aio.ServicerContext[
            embeddings_pb2.ScorePairsRequest, embeddings_pb2.ScorePairsResponse
        ],
    ) -> embeddings_pb2.ScorePairsResponse:
        """Same-question scores of candidates for a query (the semantic cache's verification)."""
        scores, model = await self.verification.score(request.query, list(request.candidates), request.model)
        return embeddings_pb2.ScorePairsResponse(scores=scores, model=model)
