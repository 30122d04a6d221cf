"""The response cache over gRPC on a real Redis: freshness rule, invalidation, single-flight."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from llmesh.v1 import cache_pb2, common_pb2

from cache.convert import key_from_pb
from cache.keys import RedisKeys
from services.runtime.context import parse_versions
from tests.integration.cache.conftest import Client, Served, answer, key, user

HIT, MISS, STALE, BYPASS = (
    common_pb2.CACHE_STATUS_HIT,
    common_pb2.CACHE_STATUS_MISS,
    common_pb2.CACHE_STATUS_STALE,
    common_pb2.CACHE_STATUS_BYPASS,
)


async def _store(client: Client, k: cache_pb2.ResponseKey, text: str, *stamps: tuple[str, int]) -> bool:
    reply = await client.call(
        "StoreResponse", cache_pb2.StoreResponseRequest(key=k, entry=answer(text, *stamps))
    )
    return bool(reply.stored)


async def test_exact_hit_reports_status_age_and_versions(client: Client) -> None:
    k = key([user("What is 2+2?")])
    miss = await client.call("LookupResponse", cache_pb2.LookupResponseRequest(key=k))
    assert miss.status == MISS
    assert client.trailers["x-llmesh-cache-status"] == "MISS"
    assert await _store(client, k, "4")
    stored_versions = parse_versions(client.trailers["x-llmesh-cache-version"])
    assert {"tenant", "response:default"} <= set(stored_versions)
    hit = await client.call("LookupResponse", cache_pb2.LookupResponseRequest(key=k))
    assert hit.status == HIT
    assert hit.entry.choices[0].text == "4"
    assert client.trailers["x-llmesh-cache-status"] == "HIT"
    assert int(client.trailers["x-llmesh-age"]) == hit.age_ms
    assert {s.namespace: s.version for s in hit.entry.derived_from} == stored_versions
    # Whitespace and line-end differences normalize to the same key.
    same = await client.call(
        "LookupResponse", cache_pb2.LookupResponseRequest(key=key([user("  What is 2+2?\r\n")]))
    )
    assert same.status == HIT
    # Anything that changes the output is a different key.
    for other in (key([user("What is 2+3?")]), key([user("What is 2+2?")], model="other")):
        assert (
            await client.call("LookupResponse", cache_pb2.LookupResponseRequest(key=other))
        ).status == MISS


async def test_floor_max_age_and_invalidation_make_entries_stale(client: Client) -> None:
    k = key([user("capital of France?")])
    appended = await client.call(
        "AppendTurns", cache_pb2.AppendTurnsRequest(session_id="c1", turns=[user("hi")])
    )
    assert await _store(client, k, "Paris", ("session:c1", appended.version))
    hit = await client.call(
        "LookupResponse", cache_pb2.LookupResponseRequest(key=k), floors=f"session:c1={appended.version}"
    )
    assert hit.status == HIT
    above = await client.call(
        "LookupResponse", cache_pb2.LookupResponseRequest(key=k), floors=f"session:c1={appended.version + 1}"
    )
    assert above.status == STALE
    assert "below the floor" in above.detail
    assert client.trailers["x-llmesh-cache-status"] == "STALE"
    zero = await client.call("LookupResponse", cache_pb2.LookupResponseRequest(key=k), max_age_ms=0)
    assert zero.status == STALE
    # A new turn moves the session on: the entry derived from the old one is stale for everyone.
    await client.call("AppendTurns", cache_pb2.AppendTurnsRequest(session_id="c1", turns=[user("more")]))
    moved = await client.call("LookupResponse", cache_pb2.LookupResponseRequest(key=k))
    assert moved.status == STALE
    assert "moved on" in moved.detail


async def test_invalidate_namespace_tenant_and_key(client: Client) -> None:
    k1, k2, k3 = (key([user(f"q{i}")], scope="docs") for i in range(3))
    for k in (k1, k2, k3):
        assert await _store(client, k, "a")
    bumped = await client.call("Invalidate", cache_pb2.InvalidateRequest(namespace="response:docs"))
    assert bumped.versions[0].namespace == "response:docs"
    for k in (k1, k2, k3):
        assert (await client.call("LookupResponse", cache_pb2.LookupResponseRequest(key=k))).status == STALE
    assert await _store(client, k1, "b")
    assert (await client.call("LookupResponse", cache_pb2.LookupResponseRequest(key=k1))).status == HIT
    await client.call("Invalidate", cache_pb2.InvalidateRequest(tenant=True))
    assert (await client.call("LookupResponse", cache_pb2.LookupResponseRequest(key=k1))).status == STALE
    assert await _store(client, k2, "c")
    await client.call("Invalidate", cache_pb2.InvalidateRequest(key=k2))
    assert (await client.call("LookupResponse", cache_pb2.LookupResponseRequest(key=k2))).status == MISS
    versions = await client.call(
        "GetVersions", cache_pb2.GetVersionsRequest(namespaces=["response:docs", "tenant"])
    )
    assert {v.namespace for v in versions.versions} == {"response:docs", "tenant"}


async def test_no_store_outdated_stamp_and_uncacheable(client: Client) -> None:
    k = key([user("no store please")])
    reply = await client.call(
        "StoreResponse", cache_pb2.StoreResponseRequest(key=k, entry=answer("x")), no_store=True
    )
    assert not reply.stored
    assert "no-store" in reply.detail
    assert (await client.call("LookupResponse", cache_pb2.LookupResponseRequest(key=k))).status == MISS
    v1 = (
        (await client.call("Invalidate", cache_pb2.InvalidateRequest(namespace="rag:kb"))).versions[0].version
    )
    await client.call("Invalidate", cache_pb2.InvalidateRequest(namespace="rag:kb"))
    late = await client.call(
        "StoreResponse", cache_pb2.StoreResponseRequest(key=k, entry=answer("x", ("rag:kb", v1)))
    )
    assert not late.stored
    assert "outdated" in late.detail
    sampled = key([user("random poem")], temperature=0.8)
    bypass = await client.call(
        "LookupResponse", cache_pb2.LookupResponseRequest(key=sampled, single_flight=True)
    )
    assert bypass.status == BYPASS
    assert not bypass.lease_token
    assert not (
        await client.call("StoreResponse", cache_pb2.StoreResponseRequest(key=sampled, entry=answer("x")))
    ).stored


async def test_bad_keys_are_invalid_argument(client: Client) -> None:
    bad = [
        key([user("x" * 1_100_000)]),
        cache_pb2.ResponseKey(messages=[user("no model")], sampling=common_pb2.SamplingParams(temperature=0)),
        key([user("x")], scope="{brace}"),
    ]
    for k in bad:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.call("LookupResponse", cache_pb2.LookupResponseRequest(key=k))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.call("Invalidate", cache_pb2.InvalidateRequest(namespace="x" * 300))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.call(
            "LookupResponse", cache_pb2.LookupResponseRequest(key=key([user("x")])), floors="abc"
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_stampede_elects_one_producer(client: Client, served: Served) -> None:
    k = key([user("expensive question")])
    request = cache_pb2.LookupResponseRequest(key=k, single_flight=True, wait_ms=20_000)
    digest = RedisKeys.of(client.tenant, key_from_pb(k)).digest
    waiting = served.app.service.notifier.waiting

    async def one() -> tuple[str, str]:
        reply = await client.stub.LookupResponse(
            request, metadata=[("x-llmesh-tenant", client.tenant)], timeout=30
        )
        if reply.lease_token:
            # Produce only once the other 99 lookups wait on this key, so the stampede is real.
            # (Bounded: if they never all arrive the counts below still decide the test.)
            for _ in range(2000):
                if waiting(digest) >= 99:
                    break
                await asyncio.sleep(0.005)
            stored = await client.call(
                "StoreResponse",
                cache_pb2.StoreResponseRequest(key=k, entry=answer("42"), lease_token=reply.lease_token),
            )
            assert stored.stored
            return "producer", ""
        return "waiter", reply.entry.choices[0].text if reply.status == HIT else "miss"

    results = await asyncio.gather(*(one() for _ in range(100)))
    assert sum(1 for role, _ in results if role == "producer") == 1
    assert all(text == "42" for role, text in results if role == "waiter")


async def test_released_lease_hands_over_and_lost_lease_stores_nothing(
    served: object, redis_url: str
) -> None:
    from tests.integration.cache.conftest import serve_cache

    s = await serve_cache(redis_url, lease_ms=300)
    try:
        c = Client(stub=s.stub, tenant="t-release")
        k = key([user("flaky producer")])
        req = cache_pb2.LookupResponseRequest(key=k, single_flight=True, wait_ms=10_000)
        first = await c.call("LookupResponse", req)
        assert first.lease_token
        waiter = asyncio.ensure_future(c.stub.LookupResponse(req, metadata=[("x-llmesh-tenant", c.tenant)]))
        released = await c.call(
            "ReleaseLease", cache_pb2.ReleaseLeaseRequest(key=k, lease_token=first.lease_token)
        )
        assert released.released
        second = await waiter
        # The waiter is woken and becomes the producer; the first producer's token is dead.
        assert second.status == MISS
        assert second.lease_token and second.lease_token != first.lease_token
        late = await c.call(
            "StoreResponse",
            cache_pb2.StoreResponseRequest(key=k, entry=answer("old"), lease_token=first.lease_token),
        )
        assert not late.stored
        assert "lease lost" in late.detail
        # The second producer dies silently: its lease expires and the next caller takes over.
        third = await c.call("LookupResponse", req)
        assert third.lease_token and third.lease_token != second.lease_token
        assert (await c.call("LookupResponse", cache_pb2.LookupResponseRequest(key=k))).status == MISS
    finally:
        await s.close()


async def test_a_miss_is_decided_and_leased_in_one_redis_call(client: Client, served: Served) -> None:
    """On one plain Redis a single-flight miss reads the entry, the versions its lease carries
    and takes the lease in one call; the token carries the versions a store is checked against."""
    service = served.app.service
    assert service.responses.one_call_lookup
    backend = service.responses._backend
    calls: list[object] = []
    call = backend.call

    async def counted(awaitable: object) -> object:
        calls.append(awaitable)
        return await call(awaitable)  # type: ignore[arg-type]

    k = key([user("one call, please")])
    request = cache_pb2.LookupResponseRequest(key=k, single_flight=True)
    backend.call = counted  # type: ignore[method-assign, assignment]
    try:
        miss = await client.call("LookupResponse", request)
    finally:
        backend.call = call  # type: ignore[method-assign]
    assert miss.status == MISS and miss.lease_token
    assert len(calls) == 1
    versions = await client.call(
        "GetVersions", cache_pb2.GetVersionsRequest(namespaces=["tenant", "response:default"])
    )
    current = {v.namespace: v.version for v in versions.versions}
    _, tenant_version, scope_version = miss.lease_token.split(".")
    assert (int(tenant_version), int(scope_version)) == (current["tenant"], current["response:default"])
    # Someone else asking now finds the lease taken: no token of its own (it waits 1 ms at most).
    other = await client.call(
        "LookupResponse", cache_pb2.LookupResponseRequest(key=k, single_flight=True, wait_ms=1)
    )
    assert other.status == MISS and not other.lease_token
    # An invalidation after the lease was granted: the producer's store is refused as outdated.
    await client.call("Invalidate", cache_pb2.InvalidateRequest(namespace="response:default"))
    late = await client.call(
        "StoreResponse",
        cache_pb2.StoreResponseRequest(key=k, entry=answer("old"), lease_token=miss.lease_token),
    )
    assert not late.stored and "outdated" in late.detail
