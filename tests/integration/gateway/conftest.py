"""The gateway with the real cache and policy services (in-process, real Redis) in front of
fake inference replicas: the pipeline's stages without the cost of a model."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio

from cache.app import create as create_cache
from cache.config import CacheSettings
from gateway.auth import hash_key
from gateway.config import GatewaySettings, TenantSettings
from policy.app import create as create_policy
from policy.config import PolicySettings
from services.runtime.server import RunningServer, build_server
from tests.fixtures.fake_inference import FakeInference, start_fake
from tests.fixtures.gateway import RunningGateway, serve_gateway


@dataclass
class Upstreams:
    cache: str
    policy: str
    inference: str
    fake: FakeInference
    servers: list[RunningServer]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def upstreams(redis_url: str) -> AsyncIterator[Upstreams]:
    cache_settings = CacheSettings(port=0, redis_url=redis_url, semantic_enabled=False)
    cache = await create_cache(cache_settings)
    cache_server = await build_server(cache_settings, [cache.binding()])
    await cache.start(cache_server)
    policy_settings = PolicySettings(port=0, redis_url=redis_url)
    policy = await create_policy(policy_settings)
    policy_server = await build_server(policy_settings, [policy.binding()])
    await policy.start(policy_server)
    fake = FakeInference("r1")
    inference_server = await start_fake(fake)
    yield Upstreams(
        cache_server.address,
        policy_server.address,
        inference_server.address,
        fake,
        [cache_server, policy_server, inference_server],
    )
    for server in (cache_server, policy_server, inference_server):
        await server.stop(0)
    await cache.close()
    await policy.close()


@dataclass
class Tenant:
    name: str
    key: str


def make_settings(up: Upstreams, tenant: Tenant, **tenant_settings: object) -> GatewaySettings:
    return GatewaySettings(
        inference_addresses=[up.inference],
        cache_address=up.cache,
        policy_address=up.policy,
        api_keys={hash_key(tenant.key): tenant.name},
        tenants={tenant.name: TenantSettings(**tenant_settings)},  # type: ignore[arg-type]
    )


@pytest.fixture
def tenant() -> Tenant:
    # A fresh tenant per test: Redis state (sessions, cache entries, limits) never leaks across tests.
    suffix = uuid.uuid4().hex[:10]
    return Tenant(f"t-{suffix}", f"sk-{suffix}")


@pytest_asyncio.fixture(loop_scope="session")
async def gateway(upstreams: Upstreams, tenant: Tenant) -> AsyncIterator[RunningGateway]:
    async with serve_gateway(make_settings(upstreams, tenant)) as running:
        yield running
