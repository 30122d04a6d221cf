"""Wiring: settings -> model, Redis, batcher, collections, servicer.

:func:`create` is the factory :func:`services.runtime.entry.main` runs; :class:`EmbeddingApp`
is the :class:`~services.runtime.service.Service` it returns.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from llmesh.v1 import embeddings_pb2_grpc

from services.embeddings.collections import Collections, Limits
from services.embeddings.config import EmbeddingsSettings
from services.embeddings.embedder import Embedder
from services.embeddings.encoder import Encoder, SentenceTransformerEncoder
from services.embeddings.index import IndexParams
from services.embeddings.replica import Replicas
from services.embeddings.servicer import EmbeddingServicer
from services.embeddings.store import CollectionStore
from services.embeddings.verifier import PairScorer, Verification
from services.runtime import redis_client
from services.runtime.server import RunningServer, ServiceBinding

SERVICE_NAME = "llmesh.v1.EmbeddingService"


def load_encoder(settings: EmbeddingsSettings) -> Encoder:
    """Loads the configured model (blocking: seconds)."""
    return SentenceTransformerEncoder(
        settings.model_path, name=settings.model_name, device=settings.device, threads=settings.torch_threads
    )


@dataclass
class EmbeddingApp:
    """Everything one embedding service process runs."""

    settings: EmbeddingsSettings
    embedder: Embedder
    collections: Collections
    servicer: EmbeddingServicer
    replicas: Replicas
    redis: Any

    def binding(self) -> ServiceBinding:
        return ServiceBinding(
            name=SERVICE_NAME,
            add=embeddings_pb2_grpc.add_EmbeddingServiceServicer_to_server,
            servicer=self.servicer,
        )

    async def start(self, server: RunningServer) -> None:
        """Nothing to start: each search brings its collection's view up to date itself."""

    async def drain(self) -> None:
        """Nothing of its own to stop early: the server's drain covers every call."""

    async def close(self) -> None:
        await self.replicas.close()
        await self.embedder.close()
        await self.redis.aclose()


async def create(settings: EmbeddingsSettings, encoder: Encoder | None = None) -> EmbeddingApp:
    """Builds the service around ``encoder`` (loaded from the settings when not given)."""
    if encoder is None:
        # In a thread: the load takes seconds and must not stall the event loop.
        encoder = await asyncio.to_thread(load_encoder, settings)
    embedder = Embedder(
        encoder,
        max_batch=settings.max_batch_size,
        max_wait_s=settings.max_batch_wait_ms / 1000,
        max_queued=settings.max_queued_texts,
        max_texts=settings.max_texts_per_request,
    )
    redis = redis_client.connect(settings.redis_url)
    store = CollectionStore(redis, log_max_entries=settings.log_max_entries)
    params = IndexParams(
        hnsw_threshold=settings.hnsw_threshold,
        hnsw_m=settings.hnsw_m,
        ef_construction=settings.hnsw_ef_construction,
        ef_search=settings.hnsw_ef_search,
        exact_filter_limit=settings.exact_filter_limit,
    )
    replicas = Replicas(
        store,
        encoder.info,
        params,
        sync_interval_s=settings.sync_interval_ms / 1000,
        catchup_timeout_s=settings.catchup_timeout_s,
        max_resident_chunks=settings.max_resident_chunks,
    )
    limits = Limits(
        chunk_max_tokens=settings.chunk_max_tokens,
        chunk_overlap_tokens=settings.chunk_overlap_tokens,
        max_documents=settings.max_documents_per_request,
        max_document_chars=settings.max_document_chars,
        max_metadata_entries=settings.max_metadata_entries,
        default_top_k=settings.default_top_k,
        max_top_k=settings.max_top_k,
    )
    collections = Collections(embedder, store, replicas, limits)
    scorers = [PairScorer(name, threads=settings.torch_threads) for name in settings.verifier_models]
    warm = settings.warm_up_verifiers()
    for scorer in scorers:
        if scorer.name in warm:
            await asyncio.to_thread(scorer.warm_up)
    verification = Verification(*scorers)
    return EmbeddingApp(
        settings,
        embedder,
        collections,
        EmbeddingServicer(embedder, collections, verification),
        replicas,
        redis,
    )
