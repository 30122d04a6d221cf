"""Protobuf <-> domain conversions of the embedding service."""

from __future__ import annotations

from llmesh.v1 import embeddings_pb2

from services.embeddings.collections import DocumentInput
from services.embeddings.collections import SearchResult as CollectionSearch
from services.embeddings.embedder import Embeddings
from services.embeddings.store import CollectionMeta


def documents_from_pb(documents: list[embeddings_pb2.Document]) -> list[DocumentInput]:
    return [DocumentInput(d.id, d.text, dict(d.metadata)) for d in documents]


def embed_response_to_pb(result: Embeddings) -> embeddings_pb2.EmbedResponse:
    response = embeddings_pb2.EmbedResponse(
        model=result.model.name,
        model_revision=result.model.revision,
        dimension=result.model.dimension,
        total_tokens=result.total_tokens,
    )
    for i, (vector, tokens, truncated) in enumerate(
        zip(result.vectors.tolist(), result.token_counts, result.truncated, strict=True)
    ):
        response.embeddings.append(
            embeddings_pb2.Embedding(index=i, values=vector, truncated=truncated, token_count=tokens)
        )
    return response


def search_response_to_pb(result: CollectionSearch) -> embeddings_pb2.SearchResponse:
    return embeddings_pb2.SearchResponse(
        version=result.version,
        hits=[
            embeddings_pb2.SearchHit(
                chunk_id=hit.record.chunk_id,
                document_id=hit.record.document_id,
                chunk_index=hit.record.index,
                text=hit.record.text,
                score=hit.score,
                metadata=dict(hit.record.metadata),
            )
            for hit in result.hits
        ],
    )


def collection_to_pb(meta: CollectionMeta) -> embeddings_pb2.CollectionInfo:
    return embeddings_pb2.CollectionInfo(
        name=meta.name,
        document_count=meta.document_count,
        chunk_count=meta.chunk_count,
        version=meta.version,
        model=meta.model,
        dimension=meta.dimension,
    )
