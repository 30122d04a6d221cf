"""Single-flight leases that run out while the producer is still generating (200 ms leases).

A producer whose lease expired may still store when nobody took the lease over and no
entry was stored meanwhile; otherwise its store is refused ("lease lost") and writes nothing.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from llmesh.v1 import cache_pb2, common_pb2

from cache.convert import key_from_pb
from cache.keys import RedisKeys
from tests.integration.cache.conftest import Client, Served, answer, key, serve_cache, user

HIT, MISS = common_pb2.CACHE_STATUS_HIT, common_pb2.CACHE_STATUS_MISS
LEASE_MS = 200


@pytest.fixture(scope="module")
async def short_leases(redis_url: str) -> AsyncIterator[Served]:
    s = await serve_cache(redis_url, lease_ms=LEASE_MS)
    yield s
    await s.close()


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    r = aioredis.from_url(redis_url)
    yield r
    await r.aclose()


async def lease_expired(redis: Any, lease_key: str) -> None:
    """Returns once the lease key is gone (Redis expired it); bounded, well above 200 ms."""
    for _ in range(500):
        if not await redis.exists(lease_key):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{lease_key} still there after 5 s")


def _tenant(name: str) -> str:
    """A tenant of this run only (the Redis of the suite outlives a run)."""
    return f"t-{name}-{uuid.uuid4().hex[:8]}"


def _lease_request(k: cache_pb2.ResponseKey) -> cache_pb2.LookupResponseRequest:
    return cache_pb2.LookupResponseRequest(key=k, single_flight=True, wait_ms=50)


async def _store(c: Client, k: cache_pb2.ResponseKey, text: str, token: str = "") -> Any:
    """The StoreResponseResponse."""
    return await c.call(
        "StoreResponse", cache_pb2.StoreResponseRequest(key=k, entry=answer(text), lease_token=token)
    )


async def _text(c: Client, k: cache_pb2.ResponseKey) -> str:
    reply = await c.call("LookupResponse", cache_pb2.LookupResponseRequest(key=k))
    return reply.entry.choices[0].text if reply.status == HIT else "miss"


async def test_expired_lease_still_stores_when_nobody_took_over(
    short_leases: Served, raw: aioredis.Redis
) -> None:
    c = Client(stub=short_leases.stub, tenant=_tenant("slow-producer"))
    k = key([user("a long generation")])
    lease_key = RedisKeys.of(c.tenant, key_from_pb(k)).lease
    first = await c.call("LookupResponse", _lease_request(k))
    assert first.status == MISS and first.lease_token
    await lease_expired(raw, lease_key)
    stored = await _store(c, k, "slow but fine", first.lease_token)
    assert stored.stored, stored.detail
    assert await _text(c, k) == "slow but fine"
    # A token is good for one store: replaying it is refused and changes nothing.
    again = await _store(c, k, "replayed", first.lease_token)
    assert not again.stored and "lease lost" in again.detail
    assert await _text(c, k) == "slow but fine"


async def test_expired_lease_taken_over_stores_nothing(short_leases: Served, raw: aioredis.Redis) -> None:
    c = Client(stub=short_leases.stub, tenant=_tenant("taken-over"))
    k = key([user("two producers")])
    lease_key = RedisKeys.of(c.tenant, key_from_pb(k)).lease
    first = await c.call("LookupResponse", _lease_request(k))
    assert first.lease_token
    await lease_expired(raw, lease_key)
    second = await c.call("LookupResponse", _lease_request(k))
    assert second.lease_token and second.lease_token != first.lease_token
    late = await _store(c, k, "late", first.lease_token)
    assert not late.stored and "lease lost" in late.detail
    assert await _text(c, k) == "miss"
    assert (await _store(c, k, "current", second.lease_token)).stored
    assert await _text(c, k) == "current"


async def test_expired_lease_used_by_another_producer_stores_nothing(
    short_leases: Served, raw: aioredis.Redis
) -> None:
    c = Client(stub=short_leases.stub, tenant=_tenant("used"))
    k = key([user("taken and given back")])
    lease_key = RedisKeys.of(c.tenant, key_from_pb(k)).lease
    first = await c.call("LookupResponse", _lease_request(k))
    await lease_expired(raw, lease_key)
    second = await c.call("LookupResponse", _lease_request(k))
    assert second.lease_token
    released = await c.call(
        "ReleaseLease", cache_pb2.ReleaseLeaseRequest(key=k, lease_token=second.lease_token)
    )
    assert released.released
    # Nobody holds the lease now, but someone else had it after the first producer: refused.
    late = await _store(c, k, "late", first.lease_token)
    assert not late.stored and "lease lost" in late.detail
    assert await _text(c, k) == "miss"


async def test_expired_lease_after_an_entry_was_stored_stores_nothing(
    short_leases: Served, raw: aioredis.Redis
) -> None:
    c = Client(stub=short_leases.stub, tenant=_tenant("replaced"))
    k = key([user("stored without a lease meanwhile")])
    lease_key = RedisKeys.of(c.tenant, key_from_pb(k)).lease
    first = await c.call("LookupResponse", _lease_request(k))
    await lease_expired(raw, lease_key)
    assert (await _store(c, k, "written meanwhile")).stored
    late = await _store(c, k, "late", first.lease_token)
    assert not late.stored and "lease lost" in late.detail
    assert await _text(c, k) == "written meanwhile"


async def test_released_lease_cannot_store_later(short_leases: Served) -> None:
    c = Client(stub=short_leases.stub, tenant=_tenant("released"))
    k = key([user("given up")])
    first = await c.call("LookupResponse", _lease_request(k))
    released = await c.call(
        "ReleaseLease", cache_pb2.ReleaseLeaseRequest(key=k, lease_token=first.lease_token)
    )
    assert released.released
    late = await _store(c, k, "after release", first.lease_token)
    assert not late.stored and "lease lost" in late.detail


async def test_expired_lease_past_the_grace_stores_nothing(redis_url: str, raw: aioredis.Redis) -> None:
    s = await serve_cache(redis_url, lease_ms=LEASE_MS, lease_grace_ms=1)
    try:
        c = Client(stub=s.stub, tenant=_tenant("past-grace"))
        k = key([user("far too slow")])
        keys = RedisKeys.of(c.tenant, key_from_pb(k))
        first = await c.call("LookupResponse", _lease_request(k))
        await lease_expired(raw, keys.grant)
        late = await _store(c, k, "far too late", first.lease_token)
        assert not late.stored and "lease lost" in late.detail
    finally:
        await s.close()
