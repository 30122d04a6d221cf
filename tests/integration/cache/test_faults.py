"""Redis down: UNAVAILABLE quickly, health NOT_SERVING, and recovery without a restart."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from llmesh.v1 import cache_pb2, common_pb2

from tests.integration.cache.conftest import Client, Served, answer, key, serve_cache, user
from tests.integration.cache.redis_proc import RedisProcess


@pytest.fixture
async def own_redis() -> AsyncIterator[RedisProcess]:
    proc = RedisProcess()
    proc.start()
    yield proc
    proc.close()


async def _wait_health(served: Served, want: int) -> None:
    """Follows the health Watch stream until it reports ``want`` (event-driven, bounded)."""
    stub = health_pb2_grpc.HealthStub(served.channel)
    stream = stub.Watch(health_pb2.HealthCheckRequest(service="llmesh.v1.ContextCacheService"), timeout=15)
    async for reply in stream:
        if reply.status == want:
            stream.cancel()
            return
    raise AssertionError("health stream ended")


async def test_redis_down_is_unavailable_then_recovers(own_redis: RedisProcess) -> None:
    served = await serve_cache(own_redis.url, health_interval_s=0.2)
    try:
        c = Client(stub=served.stub, tenant="t-faults")
        k = key([user("survive a restart")])
        await c.call("StoreResponse", cache_pb2.StoreResponseRequest(key=k, entry=answer("a")))
        own_redis.stop()
        for method, request in [
            ("LookupResponse", cache_pb2.LookupResponseRequest(key=k)),
            ("AppendTurns", cache_pb2.AppendTurnsRequest(session_id="s", turns=[user("x")])),
            ("GetVersions", cache_pb2.GetVersionsRequest(namespaces=["policy"])),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                # A deadline far above the Redis timeouts: the error must come from the cache.
                await c.call(method, request, deadline_s=10)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE, method
        await _wait_health(served, health_pb2.HealthCheckResponse.NOT_SERVING)
        own_redis.start()
        await _wait_health(served, health_pb2.HealthCheckResponse.SERVING)
        # Same server, same client objects: Redis restarted empty, so a miss (never an error).
        reply = await c.call("LookupResponse", cache_pb2.LookupResponseRequest(key=k))
        assert reply.status == common_pb2.CACHE_STATUS_MISS
        appended = await c.call(
            "AppendTurns", cache_pb2.AppendTurnsRequest(session_id="s", turns=[user("x")])
        )
        assert appended.total_turns == 1
    finally:
        await served.close()


async def test_waiter_is_woken_when_the_wake_up_fell_in_a_subscription_gap(own_redis: RedisProcess) -> None:
    """RELIABILITY.md finding 6: a store whose wake-up is published while the notifier's
    subscription is down (Redis restarted, connection killed) must still wake the waiters,
    not leave them asleep until the lease (30 s) or their wait runs out."""
    import redis.asyncio as aioredis

    from cache.convert import key_from_pb
    from cache.keys import RedisKeys

    served = await serve_cache(own_redis.url, lease_ms=30_000, wait_ms=20_000)
    raw = aioredis.from_url(own_redis.url)
    try:
        c = Client(stub=served.stub, tenant="t-gap")
        k = key([user("a wake-up lost in a reconnect")])
        digest = RedisKeys.of(c.tenant, key_from_pb(k)).digest
        request = cache_pb2.LookupResponseRequest(key=k, single_flight=True)
        producer = await c.call("LookupResponse", request)
        assert producer.lease_token
        waiter = asyncio.ensure_future(
            c.stub.LookupResponse(request, metadata=[("x-llmesh-tenant", c.tenant)], timeout=30)
        )
        notifier = served.app.service.notifier
        for _ in range(1000):
            if notifier.waiting(digest):
                break
            await asyncio.sleep(0.005)
        assert notifier.waiting(digest) == 1
        # Drop the subscription and store at once: the wake-up is published before the
        # notifier (or redis-py under it) has subscribed again, so nobody receives it.
        await raw.client_kill_filter(_type="pubsub")
        stored = await c.call(
            "StoreResponse",
            cache_pb2.StoreResponseRequest(key=k, entry=answer("done"), lease_token=producer.lease_token),
        )
        assert stored.stored, stored.detail
        reply = await waiter
        assert reply.status == common_pb2.CACHE_STATUS_HIT, reply.detail
        assert reply.entry.choices[0].text == "done"
    finally:
        await raw.aclose()
        await served.close()
