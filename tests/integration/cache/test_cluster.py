"""The cache on a real Redis Cluster (three masters on loopback).

Keys of one (tenant, namespace) or one response share a hash tag; different tenants land
in different slots and nodes. Every multi-key Lua call and every multi-slot read must work
(a CROSSSLOT error, or a script touching an undeclared key, fails these tests), and the
single-flight wake-ups must cross nodes: a store published on one node wakes waiters of a
cache subscribed on another.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from llmesh.v1 import cache_pb2, common_pb2
from redis.asyncio.cluster import RedisCluster as ClusterClient

from cache.convert import key_from_pb
from cache.keys import RedisKeys
from cache.service import TENANT_NAMESPACE
from cache.sessions import SessionStore
from services.runtime.context import parse_versions
from services.runtime.versions import version_key
from tests.fixtures.processes import ServiceProcess, service_env
from tests.integration.cache.conftest import Client, Served, answer, key, serve_cache, user
from tests.integration.cache.redis_cluster import RedisCluster
from tests.integration.cache.test_leases import lease_expired

HIT, MISS, STALE = common_pb2.CACHE_STATUS_HIT, common_pb2.CACHE_STATUS_MISS, common_pb2.CACHE_STATUS_STALE
TENANTS = [f"t-cluster-{i}" for i in range(8)]
LEASE_MS = 200


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    c = RedisCluster(masters=3)
    c.start()
    yield c
    c.close()


@pytest.fixture(scope="module")
async def served(cluster: RedisCluster) -> AsyncIterator[Served]:
    # Long leases here: a waiter that is not woken by pub/sub would wait out wait_ms (MISS).
    s = await serve_cache(cluster.url, redis_cluster=True, lease_ms=30_000, wait_ms=15_000)
    yield s
    await s.close()


@pytest.fixture(scope="module")
async def short_leases(cluster: RedisCluster) -> AsyncIterator[Served]:
    s = await serve_cache(cluster.url, redis_cluster=True, lease_ms=LEASE_MS)
    yield s
    await s.close()


@pytest.fixture
async def raw(cluster: RedisCluster) -> AsyncIterator[ClusterClient]:
    r = ClusterClient.from_url(cluster.url)
    await r.initialize()
    yield r
    await r.aclose()


def _clients(served: Served) -> list[Client]:
    return [Client(stub=served.stub, tenant=t) for t in TENANTS]


async def test_keys_share_a_slot_per_tenant_and_namespace_and_spread_over_nodes(
    raw: ClusterClient, served: Served
) -> None:
    nodes: set[str] = set()
    slots: set[int] = set()
    for tenant in TENANTS:
        response = RedisKeys.of(tenant, key_from_pb(key([user("same question")])))
        slot = raw.keyslot(response.entry)
        assert raw.keyslot(response.lease) == raw.keyslot(response.grant) == slot
        session = SessionStore._keys(tenant, "s1")
        assert raw.keyslot(session[0]) == raw.keyslot(session[1])
        slots.add(slot)
        for k in (response.entry, session[0], version_key(tenant, TENANT_NAMESPACE)):
            node = raw.get_node_from_key(k)
            assert node is not None
            nodes.add(node.name)
    assert len(slots) == len(TENANTS)
    # Every master serves some of these keys, so the cross-node paths below are exercised.
    assert nodes == {n.name for n in raw.get_primaries()}
    assert served.app.service.notifier.subscribed
    # The semantic log (one stream key) was replayed from the cluster at start.
    semantic = served.app.service.semantic
    assert semantic is not None
    await asyncio.wait_for(semantic.caught_up.wait(), 10)


async def test_sessions_append_get_delete_with_versions(served: Served) -> None:
    for c in _clients(served):
        first = await c.call(
            "AppendTurns",
            cache_pb2.AppendTurnsRequest(session_id="s1", turns=[user("hi")], expected_version=0),
        )
        second = await c.call(
            "AppendTurns",
            cache_pb2.AppendTurnsRequest(
                session_id="s1", turns=[user("more"), user("again")], expected_version=first.version
            ),
        )
        assert second.version > first.version and second.total_turns == 3
        assert parse_versions(c.trailers["x-llmesh-cache-version"]) == {"session:s1": second.version}
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.call(
                "AppendTurns",
                cache_pb2.AppendTurnsRequest(
                    session_id="s1", turns=[user("x")], expected_version=first.version
                ),
            )
        assert err.value.code() == grpc.StatusCode.ABORTED
        got = await c.call("GetSession", cache_pb2.GetSessionRequest(session_id="s1"))
        assert [t.content for t in got.messages] == ["hi", "more", "again"]
        assert got.version == second.version
        # The tenant's index is another slot than the session: listed through both.
        listed = await c.call("ListSessions", cache_pb2.ListSessionsRequest())
        assert [(s.session_id, s.total_turns, s.version) for s in listed.sessions] == [
            ("s1", 3, second.version)
        ]
        deleted = await c.call("DeleteSession", cache_pb2.DeleteSessionRequest(session_id="s1"))
        assert deleted.deleted and deleted.version > second.version
        assert not (await c.call("ListSessions", cache_pb2.ListSessionsRequest())).sessions
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.call("GetSession", cache_pb2.GetSessionRequest(session_id="s1"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def _status(c: Client, k: cache_pb2.ResponseKey, **kw: Any) -> int:
    return int((await c.call("LookupResponse", cache_pb2.LookupResponseRequest(key=k), **kw)).status)


async def _store(c: Client, k: cache_pb2.ResponseKey, text: str, *stamps: tuple[str, int]) -> Any:
    return await c.call("StoreResponse", cache_pb2.StoreResponseRequest(key=k, entry=answer(text, *stamps)))


async def test_exact_store_lookup_stale_and_invalidate(served: Served) -> None:
    for c in _clients(served):
        appended = await c.call(
            "AppendTurns", cache_pb2.AppendTurnsRequest(session_id="c1", turns=[user("hi")])
        )
        k1, k2, k3 = (key([user(f"question {i}")], scope="docs") for i in range(3))
        # Stamps of several namespaces (several slots): the session's, a RAG collection's (0 =
        # current) and, added by the cache, the tenant's and the scope's.
        # The embeddings service makes a collection's version when it ingests (the cache only reads it).
        await served.app.service.versions.bump(c.tenant, "rag:kb")
        stored = await _store(c, k1, "a", ("session:c1", appended.version), ("rag:kb", 0))
        assert stored.stored, stored.detail
        assert set(parse_versions(c.trailers["x-llmesh-cache-version"])) == {
            "session:c1",
            "rag:kb",
            "tenant",
            "response:docs",
        }
        hit = await c.call("LookupResponse", cache_pb2.LookupResponseRequest(key=k1))
        assert hit.status == HIT and hit.entry.choices[0].text == "a"
        assert await _status(c, k1, floors=f"session:c1={appended.version + 1}") == STALE
        await c.call("Invalidate", cache_pb2.InvalidateRequest(namespace="rag:kb"))
        assert await _status(c, k1) == STALE
        for k in (k2, k3):
            assert (await _store(c, k, "b")).stored
        await c.call("Invalidate", cache_pb2.InvalidateRequest(namespace="response:docs"))
        assert await _status(c, k2) == STALE
        assert (await _store(c, k2, "c")).stored
        assert await _status(c, k2) == HIT
        await c.call("Invalidate", cache_pb2.InvalidateRequest(tenant=True))
        assert await _status(c, k2) == STALE
        assert (await _store(c, k3, "d")).stored
        await c.call("Invalidate", cache_pb2.InvalidateRequest(key=k3))
        assert await _status(c, k3) == MISS
        versions = await c.call(
            "GetVersions",
            cache_pb2.GetVersionsRequest(
                namespaces=["response:docs", "tenant", "rag:kb", "session:c1", "policy"]
            ),
        )
        assert len({v.namespace for v in versions.versions}) == 5
    # A tenant-wide invalidation is one tenant's only: the others' entries stay fresh.
    a, b = _clients(served)[:2]
    k = key([user("isolated")])
    assert (await _store(a, k, "A")).stored and (await _store(b, k, "B")).stored
    await a.call("Invalidate", cache_pb2.InvalidateRequest(tenant=True))
    assert await _status(a, k) == STALE
    assert await _status(b, k) == HIT


async def test_stampede_elects_one_producer_per_tenant_and_wakes_across_nodes(served: Served) -> None:
    waiting = served.app.service.notifier.waiting
    per_tenant = 15

    async def one(c: Client, k: cache_pb2.ResponseKey, digest: str) -> tuple[str, str]:
        request = cache_pb2.LookupResponseRequest(key=k, single_flight=True, wait_ms=15_000)
        reply = await c.stub.LookupResponse(request, metadata=[("x-llmesh-tenant", c.tenant)], timeout=30)
        if reply.lease_token:
            # Produce only once the others wait on this key (bounded; the counts decide).
            for _ in range(2000):
                if waiting(digest) >= per_tenant - 1:
                    break
                await asyncio.sleep(0.005)
            stored = await c.call(
                "StoreResponse",
                cache_pb2.StoreResponseRequest(key=k, entry=answer(c.tenant), lease_token=reply.lease_token),
            )
            assert stored.stored, stored.detail
            return "producer", c.tenant
        return "waiter", reply.entry.choices[0].text if reply.status == HIT else "miss"

    calls = []
    for c in _clients(served):
        k = key([user("expensive stampede question")])
        digest = RedisKeys.of(c.tenant, key_from_pb(k)).digest
        calls += [one(c, k, digest) for _ in range(per_tenant)]
    results = await asyncio.gather(*calls)
    producers = [tenant for role, tenant in results if role == "producer"]
    assert sorted(producers) == sorted(TENANTS)
    # Woken by the producer's store (not by a timeout: the lease is 30 s, the wait 15 s).
    waiters = [text for role, text in results if role == "waiter"]
    assert len(waiters) == len(TENANTS) * (per_tenant - 1)
    assert "miss" not in waiters
    assert sorted(set(waiters)) == sorted(TENANTS)


async def test_expired_lease_stores_when_nobody_took_over(short_leases: Served, raw: ClusterClient) -> None:
    for c in _clients(short_leases)[:3]:
        k = key([user("slow producer on a cluster")])
        keys = RedisKeys.of(c.tenant, key_from_pb(k))
        first = await c.call("LookupResponse", cache_pb2.LookupResponseRequest(key=k, single_flight=True))
        assert first.lease_token
        await lease_expired(raw, keys.lease)
        stored = await c.call(
            "StoreResponse",
            cache_pb2.StoreResponseRequest(key=k, entry=answer("late"), lease_token=first.lease_token),
        )
        assert stored.stored, stored.detail
        assert await _status(c, k) == HIT


async def test_service_process_on_the_cluster(cluster: RedisCluster) -> None:
    env = service_env(
        "LLMESH_CACHE_",
        REDIS_URL=cluster.url,
        LLMESH_CACHE_REDIS_URL=cluster.url,
        LLMESH_CACHE_REDIS_CLUSTER="true",
        LLMESH_CACHE_TOKENIZER_DIR="/nonexistent",
        LLMESH_CACHE_EMBEDDINGS_ADDRESS="",
    )
    proc = ServiceProcess("cache", env)
    try:
        async with grpc.aio.insecure_channel(proc.address) as channel:
            health = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="llmesh.v1.ContextCacheService"), timeout=10
            )
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            from llmesh.v1 import cache_pb2_grpc

            stub = cache_pb2_grpc.ContextCacheServiceStub(channel)
            for tenant in TENANTS[:4]:
                c = Client(stub=stub, tenant=tenant + "-proc")
                appended = await c.call(
                    "AppendTurns", cache_pb2.AppendTurnsRequest(session_id="p1", turns=[user("hello")])
                )
                k = key([user("hello")])
                lease = await c.call(
                    "LookupResponse", cache_pb2.LookupResponseRequest(key=k, single_flight=True)
                )
                assert lease.status == MISS and lease.lease_token
                stored = await c.call(
                    "StoreResponse",
                    cache_pb2.StoreResponseRequest(
                        key=k,
                        entry=answer("hi!", ("session:p1", appended.version)),
                        lease_token=lease.lease_token,
                    ),
                )
                assert stored.stored, stored.detail
                assert await _status(c, k) == HIT
                await c.call("Invalidate", cache_pb2.InvalidateRequest(tenant=True))
                assert await _status(c, k) == STALE
        assert proc.alive()
        assert proc.stop() == 0
    finally:
        proc.close()


async def test_split_with_the_responses_redis_on_the_cluster(cluster: RedisCluster, redis_url: str) -> None:
    """LLMESH_CACHE_RESPONSES_REDIS_CLUSTER (deploy/k8s/components/redis-cluster): entries,
    leases and wake-ups on the cluster, versions and sessions on a plain main Redis. A version
    bumped in the main Redis makes the entry stale; a stampede across two replicas elects one
    producer and its store wakes every waiter through the cluster."""
    import redis.asyncio as aioredis

    from services.runtime.versions import VersionStore

    served = [
        await serve_cache(
            redis_url, responses_redis_url=cluster.url, responses_redis_cluster=True, wait_ms=15_000
        )
        for _ in range(2)
    ]
    main = aioredis.from_url(redis_url)
    try:
        clients = [Client(stub=s.stub, tenant=t) for s in served for t in TENANTS[:4]]
        for c in clients:
            k = key([user(f"split on a cluster {c.tenant}")])
            request = cache_pb2.LookupResponseRequest(key=k, single_flight=True)
            producer = await c.call("LookupResponse", request)
            if not producer.lease_token:
                continue  # the other replica's client of this tenant produced it already
            waiters = [
                asyncio.ensure_future(
                    s.stub.LookupResponse(request, metadata=[("x-llmesh-tenant", c.tenant)], timeout=20)
                )
                for s in served
                for _ in range(3)
            ]
            digest = RedisKeys.of(c.tenant, key_from_pb(k)).digest
            for _ in range(2000):
                if sum(s.app.service.notifier.waiting(digest) for s in served) == len(waiters):
                    break
                await asyncio.sleep(0.005)
            await VersionStore(main).get(c.tenant, "policy")  # as the policy service does
            entry = answer("one", ("policy", 0))
            stored = await c.call(
                "StoreResponse",
                cache_pb2.StoreResponseRequest(key=k, entry=entry, lease_token=producer.lease_token),
            )
            assert stored.stored, stored.detail
            assert [r.status for r in await asyncio.gather(*waiters)] == [HIT] * len(waiters)
            await VersionStore(main).bump(c.tenant, "policy")
            reply = await c.call("LookupResponse", cache_pb2.LookupResponseRequest(key=k))
            assert reply.status == STALE, reply.detail
        # None of these tenants' entries went to the main Redis (other tests share it).
        for tenant in TENANTS[:4]:
            assert not await main.keys(f"llmesh:resp:{{{tenant}:*")
    finally:
        await main.aclose()
        for s in served:
            await s.close()
