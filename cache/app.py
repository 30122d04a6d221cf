"""Assembles the cache from its settings: Redis, sessions, semantic cache, tokenizer, servicer.

:func:`create` is the factory :func:`services.runtime.entry.main` runs; :class:`CacheApp`
is the :class:`~services.runtime.service.Service` it returns.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpc_health.v1 import health_pb2
from llmesh.v1 import cache_pb2_grpc
from redis.exceptions import RedisError

from cache.backend import Backend, connect
from cache.config import CacheSettings
from cache.embedder import Embedder, LocalEmbedder
from cache.language import LanguageId
from cache.semantic import ENGLISH, SemanticCache
from cache.service import CacheService, ResponseLimits
from cache.servicer import ContextCacheServicer
from cache.sessions import SessionLimits, SessionStore
from cache.tokenizers import LocalTokenCounter, RemoteTokenCounter, default_tokenizer_dir
from cache.truncation import TokenCounter
from cache.vectors import VectorIndex, set_search_threads
from cache.verify import LocalVerifier, Verifier
from services.runtime.errors import FailedPrecondition, Unavailable
from services.runtime.server import RunningServer, ServiceBinding
from services.runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)

SERVICE_NAME = "llmesh.v1.ContextCacheService"
# Health name of the dedicated responses Redis (split only): NOT_SERVING while it is down,
# when lookups and stores answer UNAVAILABLE (the gateway's BYPASS) but sessions, versions and
# invalidations still work. "" and SERVICE_NAME follow the main Redis.
RESPONSES_HEALTH_NAME = SERVICE_NAME + "/responses"
# The direct-lookup terms (CacheSettings.direct_lookups): renewed this often, and gone this long
# after the last renewal (a cache stopped, moved to another Redis or reconfigured).
DIRECT_RENEW_S = 5.0
DIRECT_TTL_S = 15.0


@dataclass
class CacheApp:
    """The cache service and what it owns (closed by :meth:`close`)."""

    settings: CacheSettings
    service: CacheService
    closers: list[Any] = field(default_factory=list)
    _watches: list[asyncio.Task[None]] = field(default_factory=list)

    def binding(self) -> ServiceBinding:
        return ServiceBinding(
            name=SERVICE_NAME,
            add=cache_pb2_grpc.add_ContextCacheServiceServicer_to_server,
            servicer=ContextCacheServicer(self.service),
        )

    async def start(self, server: RunningServer | None = None) -> None:
        """Starts the background tasks; wires Redis health into the server's health service:
        the main Redis drives "" and the service (everything needs its versions); with the
        split, the responses Redis drives :data:`RESPONSES_HEALTH_NAME` only."""
        backend = self.service.backend
        responses = self.service.responses_backend
        if server is not None:

            async def on_change(healthy: bool) -> None:
                await server.set_serving(healthy)

            backend.on_health_change(on_change)
            if not await backend.probe():
                await server.set_serving(False)
            if self.service.split:

                async def on_responses(healthy: bool) -> None:
                    await server.health.set(RESPONSES_HEALTH_NAME, _status(healthy))

                responses.on_health_change(on_responses)
                await server.health.set(RESPONSES_HEALTH_NAME, _status(await responses.probe()))
        await self.service.start()
        interval = self.settings.health_interval_s
        self._watches.append(asyncio.create_task(backend.watch(interval), name="cache-health"))
        if self.settings.direct_lookups and self.service.direct_lookups:
            # Published once before start returns, so a caller of a started cache finds them.
            await self._publish_direct()
            self._watches.append(asyncio.create_task(self._offer_direct(), name="cache-direct-terms"))
        if self.service.split:
            watch = asyncio.create_task(responses.watch(interval), name="cache-health-responses")
            self._watches.append(watch)

    async def _offer_direct(self) -> None:
        """Keeps the direct-lookup terms published (module doc of cache.responses): renewed every
        DIRECT_RENEW_S, they expire DIRECT_TTL_S after this service stops renewing them."""
        while True:
            await asyncio.sleep(DIRECT_RENEW_S)
            await self._publish_direct()

    async def _publish_direct(self) -> None:
        try:
            await self.service.publish_direct_terms(int(DIRECT_TTL_S * 1000))
        except (Unavailable, RedisError) as exc:
            # Redis' health is reported (and logged) by the health watch; the terms expire.
            log.debug("direct-lookup terms not renewed: %s", exc)

    async def drain(self) -> None:
        """Nothing of its own to stop early: the server's drain covers every call."""

    async def close(self) -> None:
        for watch in self._watches:
            await cancel_and_wait(watch)
        self._watches.clear()
        await self.service.stop()
        for closer in self.closers:
            await closer.close()
        await self.service.backend.close()
        if self.service.split:
            await self.service.responses_backend.close()


def _status(healthy: bool) -> Any:
    return health_pb2.HealthCheckResponse.SERVING if healthy else health_pb2.HealthCheckResponse.NOT_SERVING


def _backend(settings: CacheSettings, url: str, cluster: bool) -> Backend:
    redis = connect(
        url,
        cluster=cluster,
        connect_timeout_s=settings.redis_connect_timeout_s,
        timeout_s=settings.redis_timeout_s,
        max_connections=settings.redis_max_connections,
    )
    return Backend(redis, timeout_s=settings.redis_timeout_s)


async def _token_counter(settings: CacheSettings, closers: list[Any]) -> TokenCounter | None:
    path = Path(settings.tokenizer_dir) if settings.tokenizer_dir else default_tokenizer_dir()
    try:
        return await asyncio.to_thread(LocalTokenCounter.load, path)
    except (FailedPrecondition, OSError, ValueError) as exc:
        log.info("no local tokenizer (%s)", exc)
    if settings.inference_address:
        from cache.clients import GrpcTokenizer

        tokenizer = await GrpcTokenizer.connect(settings.inference_address)
        closers.append(tokenizer)
        return RemoteTokenCounter(tokenizer)
    log.warning("no tokenizer: GetSession with a token budget will be refused")
    return None


async def _embedder(settings: CacheSettings, closers: list[Any]) -> Embedder | None:
    if settings.embeddings_local:
        return LocalEmbedder()
    if settings.embeddings_address:
        from cache.clients import GrpcEmbedder

        embedder = await GrpcEmbedder.connect(
            settings.embeddings_address, timeout_s=settings.embeddings_timeout_s
        )
        closers.append(embedder)
        return embedder
    return None


def _verifier(
    settings: CacheSettings, embedder: Embedder | None, model: str, threshold: float
) -> Verifier | None:
    """The second stage: in process beside a local embedder, else beside the remote one."""
    if embedder is None:  # no embeddings: semantic lookups are skipped anyway
        return None
    if settings.embeddings_local or isinstance(embedder, LocalEmbedder):
        return LocalVerifier(threshold, model)
    from cache.clients import GrpcEmbedder, GrpcVerifier

    if isinstance(embedder, GrpcEmbedder):
        return GrpcVerifier(embedder.channel, threshold, model, timeout_s=settings.embeddings_timeout_s)
    # An embedder of another kind (a test's): verification runs in process.
    return LocalVerifier(threshold, model)


def _verifiers(settings: CacheSettings, embedder: Embedder | None) -> tuple[Verifier | None, Verifier | None]:
    """The English verifier and the other languages' (None: the English one scores them, or
    only English is looked up)."""
    if settings.semantic_verifier == "off":
        log.warning(
            "semantic verification is off: stage-one candidates at cosine >= %s are served unverified",
            settings.semantic_threshold,
        )
        return None, None
    english = _verifier(settings, embedder, settings.semantic_verifier, settings.semantic_verifier_threshold)
    other = None
    # Only where a language other than English is looked up (an in-process one is 0.6 GB).
    languages = settings.semantic_languages
    if settings.semantic_multilingual_verifier and (not languages or set(languages) - {ENGLISH}):
        other = _verifier(
            settings,
            embedder,
            settings.semantic_multilingual_verifier,
            settings.semantic_multilingual_verifier_threshold,
        )
    return english, other


async def create(
    settings: CacheSettings,
    *,
    embedder: Embedder | None = None,
    counter: TokenCounter | None = None,
    verifier: Verifier | None = None,
    other_verifier: Verifier | None = None,
) -> CacheApp:
    """Builds the cache (not started); ``embedder``/``counter``/``verifier``/``other_verifier``
    override what settings would pick."""
    backend = _backend(settings, settings.redis_url, settings.redis_cluster)
    # The split: entries, leases, wake-ups and the semantic log in a dedicated (evicting) Redis.
    responses = (
        _backend(settings, settings.responses_redis_url, settings.responses_redis_cluster)
        if settings.responses_redis_url
        else backend
    )
    closers: list[Any] = []
    sessions = SessionStore(
        backend,
        SessionLimits(
            ttl_ms=settings.session_ttl_s * 1000,
            max_turns=settings.max_session_turns,
            max_bytes=settings.max_session_bytes,
            version_ttl_s=settings.version_ttl_s,
            max_turns_per_append=settings.max_turns_per_append,
            max_turn_bytes=settings.max_turn_bytes,
            max_listed_sessions=settings.max_listed_sessions,
        ),
    )
    semantic = None
    if settings.semantic_enabled:
        set_search_threads(settings.semantic_search_threads)
        embedder = embedder if embedder is not None else await _embedder(settings, closers)
        english, other = _verifiers(settings, embedder)
        semantic = SemanticCache(
            responses,
            embedder,
            VectorIndex(max_entries=settings.semantic_max_entries, hnsw_min=settings.semantic_hnsw_min),
            threshold=settings.semantic_threshold,
            candidates=settings.semantic_candidates,
            embed_timeout_s=settings.embeddings_timeout_s,
            max_log_entries=settings.semantic_max_entries,
            verifier=verifier if verifier is not None else english,
            language=LanguageId(),
            languages=frozenset(settings.semantic_languages),
            other_verifier=other_verifier if other_verifier is not None else other,
        )
    service = CacheService(
        backend,
        sessions=sessions,
        semantic=semantic,
        counter=counter if counter is not None else await _token_counter(settings, closers),
        limits=ResponseLimits(
            ttl_s=settings.response_ttl_s,
            ttl_jitter=settings.ttl_jitter,
            max_key_bytes=settings.max_key_bytes,
            max_entry_bytes=settings.max_entry_bytes,
            lease_ms=settings.lease_ms,
            lease_grace_ms=settings.lease_grace_ms,
            wait_ms=settings.wait_ms,
            version_ttl_s=settings.version_ttl_s,
            version_read_ttl_s=settings.version_read_ttl_s,
        ),
        tenants=settings.tenants,
        cluster=settings.redis_cluster,
        responses_backend=responses,
        responses_cluster=settings.responses_redis_cluster,
    )
    return CacheApp(settings=settings, service=service, closers=closers)
