"""The gateway's connections to the mesh, made once at start and closed at stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from llmesh.v1 import (
    cache_pb2,
    cache_pb2_grpc,
    embeddings_pb2,
    embeddings_pb2_grpc,
    policy_pb2,
    policy_pb2_grpc,
)

from gateway.admin.budgets import BudgetedLimiter
from gateway.auth import Authenticator
from gateway.config import GatewaySettings
from gateway.direct_lookup import DirectLookups
from gateway.local_cache import LocalCopies
from gateway.pipeline import ChatPipeline
from gateway.ratelimit import Limiter, RedisLimiter
from gateway.stages.cache import CacheStage
from gateway.stages.policy import PolicyGate
from gateway.stages.rag import RagStage
from gateway.tenant_cache import TenantCache
from gateway.upstream_inference import InferencePool
from gateway.usage import RedisUsage
from gateway.vector_stores.library import Library
from services.runtime import redis_client
from services.runtime.channels import connect
from services.runtime.invalidations import VersionWatch

log = logging.getLogger(__name__)

# How long start waits for the invalidation connection before serving (it keeps trying after;
# meanwhile every lookup is a call).
WATCH_START_S = 2.0


async def _open_watch(settings: GatewaySettings) -> VersionWatch | None:
    """The invalidation connection of the local hits, or None when they are off."""
    url = settings.local_hits_redis_url or settings.redis_url
    if not settings.local_hits or not url or settings.local_hits_bytes == 0:
        return None
    watch = VersionWatch(url)
    await watch.start()
    if not await watch.wait_connected(WATCH_START_S):
        log.warning("local hits: no invalidation connection yet; lookups go to the cache until there is")
    return watch


async def _open_direct(settings: GatewaySettings) -> DirectLookups | None:
    """Misses decided in the cache's Redis (the local hits' Redis), or None when they are off."""
    url = settings.local_hits_redis_url or settings.redis_url
    if not settings.direct_lookups or not url:
        return None
    direct = DirectLookups(
        redis_client.connect(
            url,
            pool_timeout_s=settings.cache_timeout_s,
            socket_connect_timeout=settings.cache_timeout_s,
            socket_timeout=settings.cache_timeout_s,
            retry_on_timeout=False,
            health_check_interval=0,
        ),
        timeout_s=settings.cache_timeout_s,
    )
    await direct.start()
    if direct.terms is None:
        log.info("direct lookups: the cache offers none (yet); lookups go to the cache service")
    return direct


def _copies(watch: VersionWatch, settings: GatewaySettings) -> LocalCopies[Any]:
    return LocalCopies(
        watch, max_bytes=settings.local_hits_bytes, tenant_bytes=settings.local_hits_tenant_bytes
    )


# The service each upstream channel health-checks on every instance of a list.
HEALTH_SERVICES = {
    "policy": policy_pb2.DESCRIPTOR.services_by_name["PolicyService"].full_name,
    "cache": cache_pb2.DESCRIPTOR.services_by_name["ContextCacheService"].full_name,
    "embeddings": embeddings_pb2.DESCRIPTOR.services_by_name["EmbeddingService"].full_name,
}


@dataclass
class Gateway:
    """What every request handler shares: settings, auth, the channels and stubs to the mesh's
    services, the chat pipeline; one per gateway process (:mod:`gateway.app` serves it)."""

    settings: GatewaySettings
    auth: Authenticator
    inference: InferencePool
    pipeline: ChatPipeline
    embeddings: embeddings_pb2_grpc.EmbeddingServiceAsyncStub | None
    limiter: Limiter
    channels: dict[str, grpc.aio.Channel] = field(default_factory=dict)
    # Set at SIGTERM: /readyz answers 503 so balancers send new requests elsewhere.
    draining: bool = False
    # The tenant's own cache management (purge, sessions) and its usage counters.
    tenant_cache: TenantCache = field(default_factory=lambda: TenantCache(None))
    usage: RedisUsage | None = None
    # Files and vector stores (/v1/files, /v1/vector_stores) and their ingestion jobs.
    library: Library | None = None
    # The invalidation connection behind the local hits (None: local hits off).
    watch: VersionWatch | None = None
    # Exact misses decided in that Redis (None: direct lookups off or no cache).
    direct: DirectLookups | None = None

    @classmethod
    async def open(cls, settings: GatewaySettings, *, limiter: Limiter | None = None) -> Gateway:
        addresses = settings.upstream_inference()
        if not addresses:
            raise ValueError("no inference replica configured (LLMESH_GATEWAY_INFERENCE_ADDRESSES)")
        auth = await Authenticator.start(settings)
        if auth.open:
            log.warning("no API keys configured: every request is served as the default tenant")
        inference = InferencePool(
            addresses,
            policy=settings.route_policy,
            index_size=settings.route_index_size,
            virtual_nodes=settings.route_virtual_nodes,
            load_factor=settings.route_load_factor,
            # One prompt's worth of prefix keys (balancer.py, prompts no replica holds).
            room_margin=settings.route_max_blocks,
            breaker_failures=settings.breaker_failures,
            breaker_open_s=settings.breaker_open_s,
            breaker_ttft_factor=settings.breaker_ttft_factor,
            first_token_floor_s=settings.first_token_floor_s,
            first_token_cold_s=settings.first_token_cold_s,
            probe_interval_s=settings.inference_probe_interval_s,
            probe_timeout_s=settings.inference_probe_timeout_s,
            kv_events=settings.route_kv_events,
            mux=settings.inference_mux,
            mux_lane_s=settings.inference_mux_lane_s,
        )
        await inference.open()
        channels: dict[str, grpc.aio.Channel] = {}
        for name, address, health_service in (
            ("policy", settings.policy_address, HEALTH_SERVICES["policy"]),
            ("cache", settings.cache_address, HEALTH_SERVICES["cache"]),
            ("embeddings", settings.embeddings_address, HEALTH_SERVICES["embeddings"]),
        ):
            if address:
                channels[name] = await connect(address, health_service=health_service)
        # The generated XStub(channel) on a grpc.aio channel is typed XAsyncStub (its overloaded
        # __new__), so mypy checks every call the stages make through these stubs.
        policy_channel, cache_channel, embeddings_channel = (
            channels.get(name) for name in ("policy", "cache", "embeddings")
        )
        upstreams = cache_channel is not None or policy_channel is not None
        watch = await _open_watch(settings) if upstreams else None
        direct = await _open_direct(settings) if cache_channel is not None else None
        policy = PolicyGate(
            None if policy_channel is None else policy_pb2_grpc.PolicyServiceStub(policy_channel),
            local=_copies(watch, settings)
            if watch is not None and settings.local_verdict_ttl_s > 0
            else None,
            verdict_ttl_s=settings.local_verdict_ttl_s,
            mux=settings.policy_mux,
            mux_lane_s=settings.policy_mux_lane_s,
            mux_window_s=settings.policy_mux_window_ms / 1000,
            batch_inputs=settings.policy_batch_inputs,
            input_calls=settings.policy_input_calls,
            max_checks_per_call=settings.policy_max_checks_per_call,
            ahead=settings.moderation_ahead,
        )
        cache = CacheStage(
            None if cache_channel is None else cache_pb2_grpc.ContextCacheServiceStub(cache_channel),
            settings.session_ttl_s,
            health=None if cache_channel is None else health_pb2_grpc.HealthStub(cache_channel),
            read_timeout_s=settings.cache_timeout_s,
            write_timeout_s=settings.cache_write_timeout_s,
            local=_copies(watch, settings) if watch is not None and cache_channel is not None else None,
            direct=direct,
        )
        embeddings = (
            None
            if embeddings_channel is None
            else embeddings_pb2_grpc.EmbeddingServiceStub(embeddings_channel)
        )
        rag = RagStage(embeddings)
        if limiter is None:
            # Tenants (and their limits) may be created at any time through the admin API; a
            # tenant without limits costs the limiter no Redis call.
            limiter = RedisLimiter.from_url(settings.redis_url)
        usage = RedisUsage.from_url(settings.redis_url, by_tenant=settings.usage_metrics_by_tenant)
        # Token budgets are checked at admission against the usage counters (gateway/admin/budgets.py).
        limiter = BudgetedLimiter(limiter, usage)
        pipeline = ChatPipeline(
            settings, inference=inference, policy=policy, cache=cache, rag=rag, limiter=limiter, usage=usage
        )
        tenant_cache = TenantCache(
            None if cache_channel is None else cache_pb2_grpc.ContextCacheServiceStub(cache_channel)
        )
        gateway = cls(
            settings,
            auth,
            inference,
            pipeline,
            embeddings,
            limiter,
            channels,
            tenant_cache=tenant_cache,
            usage=usage,
            library=Library.open(
                settings,
                settings.redis_url,
                embeddings,
                None if policy_channel is None else policy_pb2_grpc.PolicyServiceStub(policy_channel),
            ),
        )
        gateway.watch = watch
        gateway.direct = direct
        return gateway

    async def close(self) -> None:
        if self.watch is not None:
            await self.watch.close()
        if self.direct is not None:
            await self.direct.close()
        if self.library is not None:
            # Before the channels close: a stopped ingestion job deletes what it wrote.
            await self.library.close()
        await self.pipeline.drain()
        await self.pipeline.policy.close()
        await self.inference.close()
        for channel in self.channels.values():
            await channel.close()
        await self.limiter.close()
        await self.auth.close()
        if self.usage is not None:
            await self.usage.close()

    async def readiness(self) -> dict[str, str]:
        """Health of every configured upstream: "ok" or why not."""
        out: dict[str, str] = {}
        healthy = sum(1 for r in self.inference.replicas if r.healthy)
        out["inference"] = "ok" if healthy else "no healthy replica"
        out["inference_replicas"] = f"{healthy}/{len(self.inference.replicas)}"

        async def check(name: str, channel: grpc.aio.Channel) -> None:
            try:
                reply = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=1.0
                )
                ok = reply.status == health_pb2.HealthCheckResponse.SERVING
                out[name] = "ok" if ok else "not serving"
            except grpc.aio.AioRpcError as exc:
                out[name] = exc.code().name.lower()

        with contextlib.suppress(Exception):
            await asyncio.gather(*(check(n, c) for n, c in self.channels.items()))
        return out
