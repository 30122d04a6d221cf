"""No request makes a permanent Redis key out of a name it made up (issue 14, row "a tenant creates
unbounded permanent Redis keys").

The shared Redis runs ``volatile-ttl``: only keys with a TTL can be evicted. Before the fix, every
read of a version that did not exist created it for good (``SET NX``, no TTL), so a fresh
``rag.collections`` name per request, a made-up session id or namespace each left a key that
nothing could ever remove, and under memory pressure the rate-limit buckets and sessions went
first. Now a version nobody created reads as the clock without a write (``peek``) unless it is
one of the cache's own, which is created with a TTL (services/runtime/versions.py).

Two layers: the gateway checks ``rag.collections`` against the tenant's collections before it
asks the cache (gateway/stages/rag.py), and the services themselves make no permanent key for a
name nobody created (a direct gRPC caller skips the gateway). Real components: the gateway over
HTTP (fake inference) with the real cache, policy and embedding services on the test Redis; the
cache and embeddings over gRPC.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import pytest
import redis.asyncio as aioredis
from llmesh.v1 import cache_pb2, embeddings_pb2, embeddings_pb2_grpc

from tests.fixtures.fake_inference import MODEL
from tests.fixtures.gateway import serve_gateway
from tests.integration.cache.conftest import Client, key, serve_cache, user
from tests.integration.gateway.conftest import (  # noqa: F401  (fixtures)
    Tenant,
    Upstreams,
    make_settings,
    tenant,
    upstreams,
)

REQUESTS = 12


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Any]:
    client = aioredis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


async def permanent_keys(redis: Any, pattern: str = "llmesh:*") -> set[str]:
    """Keys without a TTL (what ``volatile-*`` eviction can never remove)."""
    out = set()
    async for k in redis.scan_iter(match=pattern, count=1000):
        if await redis.ttl(k) == -1:
            out.add(k)
    return out


async def test_fresh_rag_collections_through_the_gateway_leave_no_permanent_key(
    upstreams: Upstreams,  # noqa: F811
    tenant: Tenant,  # noqa: F811
    embeddings_address: str,
    redis: Any,
) -> None:
    settings = make_settings(upstreams, tenant)
    settings.embeddings_address = embeddings_address
    before = await permanent_keys(redis)
    async with serve_gateway(settings) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
        for _ in range(REQUESTS):
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "what is in my documents?"}],
                "temperature": 0,
                "rag": {"collections": [f"made-up-{uuid.uuid4().hex[:12]}"]},
            }
            reply = await http.post(
                "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {tenant.key}"}
            )
            assert reply.status_code == 404, reply.text  # the collection does not exist
    new = await permanent_keys(redis) - before
    assert not new, sorted(new)[:10]


async def test_unknown_collection_search_creates_nothing(embeddings_address: str, redis: Any) -> None:
    name = f"t-{uuid.uuid4().hex[:10]}"
    async with grpc.aio.insecure_channel(embeddings_address) as channel:
        stub = embeddings_pb2_grpc.EmbeddingServiceStub(channel)
        for i in range(REQUESTS):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Search(
                    embeddings_pb2.SearchRequest(collection=f"nope-{i}", query="anything", top_k=3),
                    metadata=[("x-llmesh-tenant", name)],
                )
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert [k async for k in redis.scan_iter(match=f"*{name}*")] == []


async def test_made_up_namespaces_and_sessions_at_the_cache_leave_no_permanent_key(
    redis_url: str, redis: Any
) -> None:
    served = await serve_cache(redis_url)
    try:
        client = Client(stub=served.stub, tenant=f"t-{uuid.uuid4().hex[:10]}")
        for i in range(REQUESTS):
            await client.call(
                "GetVersions",
                cache_pb2.GetVersionsRequest(namespaces=[f"rag:c{i}", f"response:s{i}", f"x{i}"]),
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await client.call("GetSession", cache_pb2.GetSessionRequest(session_id=f"s{i}"))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            await client.call("DeleteSession", cache_pb2.DeleteSessionRequest(session_id=f"d{i}"))
            await client.call(
                "LookupResponse",
                cache_pb2.LookupResponseRequest(
                    key=key([user("q")], scope=f"rag:c{i}:k4:s0"), single_flight=True
                ),
            )
            await client.call("Invalidate", cache_pb2.InvalidateRequest(namespace=f"model:m{i}"))
        made = [k async for k in redis.scan_iter(match=f"*{client.tenant}*")]
        assert made  # the cache's own versions and leases exist...
        assert await permanent_keys(redis, f"*{client.tenant}*") == set()  # ...and all expire
        # Versions of other services' namespaces, and of sessions that do not exist, make no key.
        assert not [k for k in made if ":rag:c" in k and "response:" not in k]
        assert not [k for k in made if ":session:" in k]
    finally:
        await served.close()
