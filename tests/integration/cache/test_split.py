"""The split (LLMESH_CACHE_RESPONSES_REDIS_URL): versions and sessions in the main Redis,
response entries, leases, wake-ups and the semantic log in a dedicated responses Redis.

A version bumped in the main Redis by another service (policy, embeddings) makes entries
stale at once; nothing of the response tier lands in the main Redis and nothing durable in
the responses Redis; a stampede elects one producer through the responses Redis; each
Redis's health is reported, and losing the responses Redis only costs response calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
import redis.asyncio as aioredis
from grpc_health.v1 import health_pb2, health_pb2_grpc
from llmesh.v1 import cache_pb2, common_pb2

from cache.app import RESPONSES_HEALTH_NAME, SERVICE_NAME
from cache.convert import key_from_pb
from cache.keys import RedisKeys
from services.runtime.versions import VersionStore
from tests.integration.cache.conftest import Client, Served, answer, key, serve_cache, user
from tests.integration.cache.redis_proc import RedisProcess

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
async def pair() -> AsyncIterator[tuple[RedisProcess, RedisProcess]]:
    main, responses = RedisProcess(), RedisProcess()
    main.start()
    responses.start()
    yield main, responses
    main.close()
    responses.close()


async def _keys(url: str) -> list[str]:
    client = aioredis.from_url(url)
    try:
        return sorted(k.decode() if isinstance(k, bytes) else k for k in await client.keys("*"))
    finally:
        await client.aclose()


async def test_versions_bumped_in_the_main_redis_invalidate_split_entries(
    pair: tuple[RedisProcess, RedisProcess],
) -> None:
    main, responses = pair
    served = await serve_cache(main.url, responses_redis_url=responses.url)
    policy = aioredis.from_url(main.url)
    try:
        c = Client(stub=served.stub, tenant="t-split")
        k = key([user("what does the policy allow?")])
        # The owners make their versions (policy on its first check, embeddings on ingest); the
        # cache only reads them, and an entry derived from a missing one is never served.
        await VersionStore(policy).get("t-split", "policy")
        await VersionStore(policy).bump("t-split", "rag:kb")
        stored = await c.call(
            "StoreResponse",
            cache_pb2.StoreResponseRequest(key=k, entry=answer("a", ("policy", 0), ("rag:kb", 0))),
        )
        assert stored.stored, stored.detail
        await c.call("AppendTurns", cache_pb2.AppendTurnsRequest(session_id="s1", turns=[user("hi")]))
        hit = await c.call("LookupResponse", cache_pb2.LookupResponseRequest(key=k))
        assert hit.status == common_pb2.CACHE_STATUS_HIT

        # Where things live: the response tier in the responses Redis only, the rest in main.
        in_main, in_responses = await _keys(main.url), await _keys(responses.url)
        assert any(x.startswith("llmesh:resp:") for x in in_responses)
        assert not any(x.startswith(("llmesh:ver:", "llmesh:sess:")) for x in in_responses), in_responses
        assert any(x.startswith("llmesh:sess:") for x in in_main)
        prefix = "llmesh:ver:{t-split:"
        versions = {x[len(prefix) : -1] for x in in_main if x.startswith(prefix)}
        assert {"policy", "rag:kb", "tenant", "session:s1", "response:default"} <= versions, in_main
        assert not any(x.startswith(("llmesh:resp:", "llmesh:lease:", "llmesh:grant:")) for x in in_main)

        # The policy service bumps its ruleset version in the main Redis (its REDIS_URL).
        await VersionStore(policy).bump("t-split", "policy")
        stale = await c.call("LookupResponse", cache_pb2.LookupResponseRequest(key=k))
        assert stale.status == common_pb2.CACHE_STATUS_STALE, stale.detail
        assert "policy moved on" in stale.detail
    finally:
        await policy.aclose()
        await served.close()


async def test_stampede_elects_one_producer_through_the_responses_redis(
    pair: tuple[RedisProcess, RedisProcess],
) -> None:
    main, responses = pair
    served = [await serve_cache(main.url, responses_redis_url=responses.url) for _ in range(2)]
    try:
        k = key([user("one producer for everyone")])
        request = cache_pb2.LookupResponseRequest(key=k, single_flight=True, wait_ms=10_000)
        md = [("x-llmesh-tenant", "t-stampede")]
        producer = await served[0].stub.LookupResponse(request, metadata=md, timeout=15)
        assert producer.lease_token
        waiters = [
            asyncio.ensure_future(served[i % 2].stub.LookupResponse(request, metadata=md, timeout=15))
            for i in range(10)
        ]
        digest = RedisKeys.of("t-stampede", key_from_pb(k)).digest
        for _ in range(2000):
            if sum(s.app.service.notifier.waiting(digest) for s in served) == len(waiters):
                break
            await asyncio.sleep(0.005)
        stored = await served[1].stub.StoreResponse(
            cache_pb2.StoreResponseRequest(key=k, entry=answer("done"), lease_token=producer.lease_token),
            metadata=md,
            timeout=15,
        )
        assert stored.stored, stored.detail
        replies = await asyncio.gather(*waiters)
        assert [r.status for r in replies] == [common_pb2.CACHE_STATUS_HIT] * 10
        assert not any(r.lease_token for r in replies)
    finally:
        for s in served:
            await s.close()


async def _wait_health(served: Served, name: str, want: int) -> None:
    stub = health_pb2_grpc.HealthStub(served.channel)
    stream = stub.Watch(health_pb2.HealthCheckRequest(service=name), timeout=15)
    async for reply in stream:
        if reply.status == want:
            stream.cancel()
            return
    raise AssertionError("health stream ended")


async def _code(c: Client, method: str, request: object) -> grpc.StatusCode:
    try:
        await c.call(method, request, deadline_s=10)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def test_each_redis_down_costs_what_it_holds(pair: tuple[RedisProcess, RedisProcess]) -> None:
    main, responses = pair
    served = await serve_cache(main.url, responses_redis_url=responses.url, health_interval_s=0.2)
    try:
        c = Client(stub=served.stub, tenant="t-split-faults")
        k = key([user("survive either restart")])
        lookup = cache_pb2.LookupResponseRequest(key=k)
        store = cache_pb2.StoreResponseRequest(key=k, entry=answer("a"))
        append = cache_pb2.AppendTurnsRequest(session_id="s", turns=[user("x")])
        await _wait_health(served, RESPONSES_HEALTH_NAME, SERVING)

        # Responses Redis down: lookups and stores UNAVAILABLE (the gateway's BYPASS); sessions,
        # versions and the service's own health go on.
        responses.stop()
        assert await _code(c, "LookupResponse", lookup) == grpc.StatusCode.UNAVAILABLE
        assert await _code(c, "StoreResponse", store) == grpc.StatusCode.UNAVAILABLE
        assert await _code(c, "AppendTurns", append) == grpc.StatusCode.OK
        await _wait_health(served, RESPONSES_HEALTH_NAME, NOT_SERVING)
        await _wait_health(served, SERVICE_NAME, SERVING)
        responses.start()
        await _wait_health(served, RESPONSES_HEALTH_NAME, SERVING)
        assert await _code(c, "StoreResponse", store) == grpc.StatusCode.OK
        assert await _code(c, "LookupResponse", lookup) == grpc.StatusCode.OK

        # Main Redis down: everything UNAVAILABLE (no version to judge an entry by), NOT_SERVING.
        main.stop()
        for method, request in [
            ("LookupResponse", lookup),
            ("StoreResponse", store),
            ("AppendTurns", append),
        ]:
            assert await _code(c, method, request) == grpc.StatusCode.UNAVAILABLE, method
        await _wait_health(served, SERVICE_NAME, NOT_SERVING)
        main.start()
        await _wait_health(served, SERVICE_NAME, SERVING)
        # Main restarted empty: versions re-initialised from the clock, above every stamp.
        reply = await c.call("LookupResponse", lookup)
        assert reply.status == common_pb2.CACHE_STATUS_STALE, reply.detail
    finally:
        await served.close()
