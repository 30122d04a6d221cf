"""Settings of the cache service (env ``LLMESH_CACHE_*``)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

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

    # Sessions.
    session_ttl_s: int = 7 * 24 * 3600
    max_session_turns: int = 10_000
    max_turns_per_append: int = 1_000
    max_turn_bytes: int = 256 * 1024

    # Response cache.
    response_ttl_s: int = 3600
    # TTLs get +-jitter so that entries written together do not expire together.
    ttl_jitter: float = 0.1
    max_key_bytes: int = 1024 * 1024
    max_entry_bytes: int = 4 * 1024 * 1024
    # Single-flight: how long a producer holds its lease, how long waiters wait by default.
    lease_ms: int = 30_000
    # A producer whose lease ran out may still store for this long after it, as long as no
    # other producer was granted the lease and no entry was stored meanwhile.
    lease_grace_ms: int = 600_000
    wait_ms: int = 10_000

    # Semantic cache.
    semantic_enabled: bool = True
    # EmbeddingService address; empty = semantic lookups are skipped (reported).
    embeddings_address: str = ""
    embeddings_timeout_s: float = 1.0
    # Embed with sentence-transformers in this process instead (tests, one-box setups).
    embeddings_local: bool = False
    semantic_threshold: float = 0.86
    semantic_candidates: int = 4
    # Entries kept in the replicated semantic log (Redis stream) and in each in-process index.
    semantic_max_entries: int = 200_000
    # Partitions above this size switch from an exact flat index to HNSW.
    semantic_hnsw_min: int = 4096
    # FAISS threads per search: one query at a time gains nothing from more, and on a busy
    # host extra OpenMP threads only add tail latency.
    semantic_search_threads: int = 1

    # Token counting for session truncation: the local tokenizer of this model directory
    # (empty = services.inference.model.default_model_dir()), else InferenceService.Tokenize.
    tokenizer_dir: str = ""
    inference_address: str = ""
