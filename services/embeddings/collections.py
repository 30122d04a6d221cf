"""Collections: ingest (chunk, embed, store), delete, search and list, per tenant.

The request context supplies the tenant and the consistency bound: writes and
searches report the collection version they produced or saw through
``ctx.observe("rag:<collection>", version)``, and a search honours the caller's
floor for that namespace (see :mod:`services.embeddings.replica`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from services.embeddings.chunking import TokenCounter, chunk_text
from services.embeddings.embedder import Embedder
from services.embeddings.index import Hit
from services.embeddings.replica import Replicas
from services.embeddings.store import CollectionMeta, CollectionStore, PreparedDocument
from services.runtime import context, namespaces
from services.runtime.errors import InvalidArgument

_COLLECTION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_DOCUMENT_ID_LENGTH = 256
MAX_METADATA_CHARS = 1024


def namespace(collection: str) -> str:
    """The version namespace of a collection (:func:`services.runtime.namespaces.rag_collection`)."""
    return namespaces.rag_collection(collection)


@dataclass(frozen=True, slots=True)
class DocumentInput:
    document_id: str
    text: str
    metadata: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Limits:
    chunk_max_tokens: int = 200
    chunk_overlap_tokens: int = 32
    max_documents: int = 1000
    max_document_chars: int = 1_000_000
    max_metadata_entries: int = 32
    default_top_k: int = 10
    max_top_k: int = 1000


@dataclass(frozen=True, slots=True)
class UpsertResult:
    version: int
    document_count: int
    chunk_count: int


@dataclass(frozen=True, slots=True)
class DeleteResult:
    version: int
    deleted_count: int


@dataclass(frozen=True, slots=True)
class SearchResult:
    hits: list[Hit]
    version: int


class Collections:
    """The RAG side of the embedding service."""

    def __init__(
        self, embedder: Embedder, store: CollectionStore, replicas: Replicas, limits: Limits
    ) -> None:
        self._embedder = embedder
        self._store = store
        self._replicas = replicas
        self._limits = limits

    async def upsert(
        self,
        collection: str,
        documents: Sequence[DocumentInput],
        *,
        max_tokens: int = 0,
        overlap_tokens: int = 0,
        reject_oversized: bool = False,
    ) -> UpsertResult:
        """Chunks, embeds and stores documents; a document already there is replaced atomically."""
        ctx = context.current()
        validate_collection(collection)
        self._validate_documents(documents)
        budget, overlap = self._chunking(max_tokens, overlap_tokens)
        prepared: list[tuple[DocumentInput, list[str]]] = []
        for doc in documents:
            chunks = await self._embedder.batcher.run(
                _chunk, doc, self._embedder.encoder.count_tokens, budget, overlap, reject_oversized
            )
            prepared.append((doc, chunks))
        texts = [t for _, chunks in prepared for t in chunks]
        embedded = await self._embedder.embed_many(texts)
        stored: list[PreparedDocument] = []
        start = 0
        for doc, chunks in prepared:
            vectors = embedded.vectors[start : start + len(chunks)]
            start += len(chunks)
            stored.append(PreparedDocument(doc.document_id, doc.metadata, chunks, vectors))
        result = await self._store.upsert(ctx.tenant, collection, self._embedder.model, stored)
        ctx.observe(namespace(collection), result.version)
        return UpsertResult(result.version, len(documents), len(texts))

    async def delete(self, collection: str, document_ids: Sequence[str]) -> DeleteResult:
        """Removes documents and their chunks; unknown ids are not an error (counted out)."""
        ctx = context.current()
        validate_collection(collection)
        if not document_ids:
            raise InvalidArgument("document_ids must not be empty")
        _check_unique(document_ids, "document_ids")
        result = await self._store.delete(ctx.tenant, collection, document_ids)
        ctx.observe(namespace(collection), result.version)
        return DeleteResult(result.version, result.count)

    async def search(
        self,
        collection: str,
        query: str,
        *,
        top_k: int = 0,
        filters: Mapping[str, str],
        min_score: float = 0.0,
    ) -> SearchResult:
        """Top-k chunks for ``query`` at a collection version at least the caller's floor."""
        ctx = context.current()
        validate_collection(collection)
        if not query.strip():
            raise InvalidArgument("query must not be empty")
        k = top_k or self._limits.default_top_k
        if not 1 <= k <= self._limits.max_top_k:
            raise InvalidArgument(f"top_k must be between 1 and {self._limits.max_top_k}, got {top_k}")
        if not -1.0 <= min_score <= 1.0 or np.isnan(min_score):
            raise InvalidArgument(f"min_score must be a cosine similarity between -1 and 1, got {min_score}")
        embedded = await self._embedder.embed([query])
        ns = namespace(collection)
        found = await self._replicas.search(
            ctx.tenant,
            collection,
            embedded.vectors[0],
            k,
            filters=filters,
            min_score=min_score if min_score else -1.0,
            floor=ctx.floor_for(ns),
            time_remaining=ctx.time_remaining(),
        )
        ctx.observe(ns, found.version)
        return SearchResult(found.hits, found.version)

    async def list(self) -> list[CollectionMeta]:
        """The tenant's collections."""
        return await self._store.list(context.current().tenant)

    def _chunking(self, max_tokens: int, overlap_tokens: int) -> tuple[int, int]:
        model = self._embedder.model
        limit = model.max_tokens - model.special_tokens
        budget = max_tokens or min(self._limits.chunk_max_tokens, limit)
        if not 1 <= budget <= limit:
            raise InvalidArgument(
                f"chunking.max_tokens must be between 1 and {limit} (the model's limit), got {max_tokens}"
            )
        overlap = overlap_tokens or min(self._limits.chunk_overlap_tokens, budget // 4)
        if overlap >= budget or overlap < 0:
            raise InvalidArgument(
                f"chunking.overlap_tokens must be below max_tokens ({budget}), got {overlap_tokens}"
            )
        return budget, overlap

    def _validate_documents(self, documents: Sequence[DocumentInput]) -> None:
        limits = self._limits
        if not documents:
            raise InvalidArgument("documents must not be empty")
        if len(documents) > limits.max_documents:
            raise InvalidArgument(
                f"at most {limits.max_documents} documents per request, got {len(documents)}"
            )
        _check_unique([d.document_id for d in documents], "document ids")
        for i, doc in enumerate(documents):
            where = f"documents[{i}] ({doc.document_id!r})"
            if not doc.document_id or len(doc.document_id) > MAX_DOCUMENT_ID_LENGTH:
                raise InvalidArgument(f"documents[{i}]: id must be 1-{MAX_DOCUMENT_ID_LENGTH} characters")
            if not doc.document_id.isprintable():
                raise InvalidArgument(f"documents[{i}]: id must not contain control characters")
            if not doc.text.strip():
                raise InvalidArgument(f"{where}: text is empty")
            if len(doc.text) > limits.max_document_chars:
                raise InvalidArgument(
                    f"{where}: text has {len(doc.text)} characters, "
                    f"over the limit of {limits.max_document_chars}"
                )
            if len(doc.metadata) > limits.max_metadata_entries:
                raise InvalidArgument(
                    f"{where}: {len(doc.metadata)} metadata entries, "
                    f"over the limit of {limits.max_metadata_entries}"
                )
            for key, value in doc.metadata.items():
                if not key or len(key) + len(value) > MAX_METADATA_CHARS:
                    raise InvalidArgument(
                        f"{where}: metadata keys must be non-empty and key + value "
                        f"at most {MAX_METADATA_CHARS} characters"
                    )


def validate_collection(name: str) -> None:
    if not _COLLECTION_NAME.fullmatch(name):
        raise InvalidArgument(
            f"collection name must be 1-128 characters of [A-Za-z0-9._-] starting with a letter or digit, "
            f"got {name[:40]!r}"
        )


def _check_unique(ids: Sequence[str], what: str) -> None:
    seen: set[str] = set()
    duplicates: set[str] = set()
    for item in ids:
        if item in seen:
            duplicates.add(item)
        seen.add(item)
    if duplicates:
        shown = ", ".join(repr(d) for d in sorted(duplicates)[:5])
        raise InvalidArgument(f"duplicate {what} in one request: {shown}")


def _chunk(
    doc: DocumentInput, count_tokens: TokenCounter, budget: int, overlap: int, reject_oversized: bool
) -> list[str]:
    chunks = chunk_text(
        doc.text,
        count_tokens,
        max_tokens=budget,
        overlap_tokens=overlap,
        reject_oversized=reject_oversized,
        label=f"document {doc.document_id!r}",
    )
    return [c.text for c in chunks]
