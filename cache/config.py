"""Settings of the cache service (env ``LLMESH_CACHE_*``)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from cache import defaults
from services.runtime.settings import ServiceSettings, redis_url


class CacheSettings(ServiceSettings):
    """Where the cache listens, its Redis, and the limits and lifetimes of what it keeps."""

    model_config = SettingsConfigDict(env_prefix="LLMESH_CACHE_", extra="ignore")
    service_name: ClassVar[str] = "cache"

    port: int = 50053
    redis_url: str = Field(default_factory=redis_url)
    # Use a Redis Cluster client (keys of one tenant and namespace share a hash tag).
    redis_cluster: bool = False
    # A dedicated Redis for response entries, single-flight leases/grants, the wake-up channel
    # and the semantic log (run it with deploy/redis/redis.conf: allkeys-lfu, no persistence).
    # Empty = the main redis_url holds everything. Versions and sessions always stay in the
    # main Redis, where policy and embeddings bump theirs.
    responses_redis_url: str = ""
    # The dedicated responses Redis is a Redis Cluster.
    responses_redis_cluster: bool = False
    # Bounded Redis timeouts: a dead Redis turns into UNAVAILABLE within about this long.
    redis_connect_timeout_s: float = 1.0
    redis_timeout_s: float = 1.0
    redis_max_connections: int = 64
    # Health probe period; health goes NOT_SERVING when a probe or a call finds Redis down.
    health_interval_s: float = 1.0
    # Tenants allowed to use the cache; empty = any tenant.
    tenants: list[str] = Field(default_factory=list)

    # Sessions and the response cache (what each one means: cache/defaults.py).
    session_ttl_s: int = defaults.SESSION_TTL_S
    max_session_turns: int = defaults.MAX_SESSION_TURNS
    max_session_bytes: int = defaults.MAX_SESSION_BYTES
    max_turns_per_append: int = defaults.MAX_TURNS_PER_APPEND
    max_turn_bytes: int = defaults.MAX_TURN_BYTES
    max_listed_sessions: int = Field(default=defaults.MAX_LISTED_SESSIONS, ge=1)
    response_ttl_s: int = defaults.RESPONSE_TTL_S
    ttl_jitter: float = defaults.TTL_JITTER
    max_key_bytes: int = defaults.MAX_KEY_BYTES
    max_entry_bytes: int = defaults.MAX_ENTRY_BYTES
    lease_ms: int = defaults.LEASE_MS
    lease_grace_ms: int = defaults.LEASE_GRACE_MS
    wait_ms: int = defaults.WAIT_MS
    version_ttl_s: int = defaults.VERSION_TTL_S
    version_read_ttl_s: int = defaults.VERSION_READ_TTL_S
    # Let gateways decide an exact miss and take its single-flight lease in Redis themselves
    # (gateway/direct_lookup.py), saving the lookup's call; offered (the terms under
    # llmesh:cache:direct, renewed every few seconds) only where entries and versions share one
    # plain Redis and no tenant list is set. Hits, stores and semantic lookups still come here.
    direct_lookups: bool = True

    # Semantic cache.
    semantic_enabled: bool = True
    # EmbeddingService address; empty = semantic lookups are skipped (reported).
    embeddings_address: str = ""
    embeddings_timeout_s: float = 1.0
    # Embed with sentence-transformers in this process instead (tests, one-box setups).
    embeddings_local: bool = False
    # Stage one: the cosine similarity at which the index proposes a candidate (recall-oriented).
    semantic_threshold: float = defaults.SEMANTIC_THRESHOLD
    # Candidates per lookup (all of them, after the guard, are verified as one batch).
    semantic_candidates: int = defaults.SEMANTIC_CANDIDATES
    # Stage two: the verifier (EmbeddingService.ScorePairs, or in process with embeddings_local)
    # and the score a candidate needs. "off" serves stage-one candidates unverified (raise
    # semantic_threshold then: 0.86 was the one-stage setting).
    semantic_verifier: str = defaults.SEMANTIC_VERIFIER
    semantic_verifier_threshold: float = defaults.SEMANTIC_VERIFIER_THRESHOLD
    # The verifier of prompts in languages other than English, and its threshold; empty = the
    # English verifier above scores them too (with its threshold).
    semantic_multilingual_verifier: str = defaults.SEMANTIC_MULTILINGUAL_VERIFIER
    semantic_multilingual_verifier_threshold: float = defaults.SEMANTIC_MULTILINGUAL_VERIFIER_THRESHOLD
    # Languages looked up semantically (ISO 639-1, e.g. ["en", "de"]); empty = all. The index
    # is partitioned by language either way: prompts in different languages never match.
    # Default English: the embedding model and the verifier are English models (BENCHMARKS.md
    # has the other languages' figures); other languages get exact hits only.
    semantic_languages: list[str] = Field(default_factory=lambda: ["en"])
    semantic_max_entries: int = defaults.SEMANTIC_MAX_ENTRIES
    semantic_hnsw_min: int = defaults.SEMANTIC_HNSW_MIN
    # FAISS threads per search: one query at a time gains nothing from more, and on a busy
    # host extra OpenMP threads only add tail latency.
    semantic_search_threads: int = 1

    # Token counting for session truncation: the local tokenizer of this model directory
    # (empty = services.inference.model.default_model_dir()), else InferenceService.Tokenize.
    tokenizer_dir: str = ""
    inference_address: str = ""

    @model_validator(mode="after")
    def _check_lifetimes(self) -> CacheSettings:
        # A version key must outlive what depends on it, or the dependants are only ever misses.
        entry_s = self.response_ttl_s * (1 + self.ttl_jitter)
        if self.version_ttl_s < entry_s:
            raise ValueError(
                f"version_ttl_s ({self.version_ttl_s}) must be at least the longest response entry "
                f"lifetime ({entry_s:.0f} s: response_ttl_s with its jitter)"
            )
        producer_s = (self.lease_ms + self.lease_grace_ms) / 1000
        if not producer_s <= self.version_read_ttl_s <= self.version_ttl_s:
            raise ValueError(
                f"version_read_ttl_s ({self.version_read_ttl_s}) must be between the longest a producer "
                f"may take to store ({producer_s:.0f} s: lease_ms + lease_grace_ms) and version_ttl_s"
            )
        if self.max_session_bytes < self.max_turn_bytes:
            raise ValueError("max_session_bytes must be at least max_turn_bytes (one turn must fit)")
        return self
