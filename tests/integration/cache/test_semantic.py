"""Semantic cache on the real embedding model: guarded hits, replicas, embeddings down, pair-set goal."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from llmesh.v1 import cache_pb2, common_pb2

from benchmarks.semantic_pairs import load_pairs, rates, similarities
from cache.clients import GrpcEmbedder
from cache.config import CacheSettings
from cache.embedder import LocalEmbedder
from services.runtime.channels import connect
from tests.fixtures.ports import free_port
from tests.integration.cache.conftest import Client, Served, answer, key, serve_cache, system, user

HIT, MISS = common_pb2.CACHE_STATUS_HIT, common_pb2.CACHE_STATUS_MISS


@pytest.fixture(scope="module")
def embedder() -> LocalEmbedder:
    return LocalEmbedder()


@pytest.fixture(scope="module")
async def replicas(redis_url: str, embedder: LocalEmbedder) -> AsyncIterator[tuple[Served, Served]]:
    # A generous embedding timeout: the model shares two cores with the rest of the suite.
    a = await serve_cache(redis_url, embedder=embedder, embeddings_timeout_s=10.0)
    b = await serve_cache(redis_url, embedder=embedder, embeddings_timeout_s=10.0)
    yield a, b
    await a.close()
    await b.close()


def _lookup(text: str, context: str = "You are terse.") -> cache_pb2.LookupResponseRequest:
    return cache_pb2.LookupResponseRequest(key=key([system(context), user(text)]))


async def test_paraphrase_hits_near_miss_is_rejected_on_every_replica(
    replicas: tuple[Served, Served], client: Client
) -> None:
    a, b = replicas
    ca = Client(stub=a.stub, tenant=client.tenant)
    cb = Client(stub=b.stub, tenant=client.tenant)
    stored = await ca.call(
        "StoreResponse",
        cache_pb2.StoreResponseRequest(
            key=key([system("You are terse."), user("What is the capital of France?")]), entry=answer("Paris")
        ),
        semantic=True,
    )
    assert stored.stored and not stored.detail, stored.detail
    hit = await ca.call("LookupResponse", _lookup("Which city is the capital of France?"), semantic=True)
    assert hit.status == HIT
    assert hit.semantic
    assert hit.similarity >= a.app.settings.semantic_threshold
    assert hit.entry.choices[0].text == "Paris"
    assert ca.trailers["x-llmesh-cache-status"] == "HIT"
    # Without the opt-in, only exact hits.
    assert (await ca.call("LookupResponse", _lookup("Which city is the capital of France?"))).status == MISS
    near = await ca.call("LookupResponse", _lookup("What is the capital of Germany?"), semantic=True)
    assert near.status == MISS
    # Another conversation context is another partition.
    other = await ca.call(
        "LookupResponse", _lookup("Which city is the capital of France?", "Answer in French."), semantic=True
    )
    assert other.status == MISS
    # Another tenant never sees it.
    stranger = Client(stub=a.stub, tenant=client.tenant + "-x")
    assert (
        await stranger.call("LookupResponse", _lookup("Which city is the capital of France?"), semantic=True)
    ).status == MISS
    # Replica B learns the entry from the shared semantic log.
    index_b = b.app.service.semantic.index  # type: ignore[union-attr]
    for _ in range(500):
        if len(index_b) >= len(a.app.service.semantic.index):  # type: ignore[union-attr]
            break
        await asyncio.sleep(0.01)
    hit_b = await cb.call("LookupResponse", _lookup("Which city is the capital of France?"), semantic=True)
    assert hit_b.status == HIT
    assert hit_b.semantic


async def test_semantic_candidate_obeys_invalidation(replicas: tuple[Served, Served], client: Client) -> None:
    a, _ = replicas
    c = Client(stub=a.stub, tenant=client.tenant)
    k = key([system("You are terse."), user("How do I reverse a list in Python?")], scope="kb")
    await c.call(
        "StoreResponse", cache_pb2.StoreResponseRequest(key=k, entry=answer("reversed()")), semantic=True
    )
    paraphrase = cache_pb2.LookupResponseRequest(
        key=key([system("You are terse."), user("What's the way to reverse a Python list?")], scope="kb")
    )
    assert (await c.call("LookupResponse", paraphrase, semantic=True)).status == HIT
    await c.call("Invalidate", cache_pb2.InvalidateRequest(namespace="response:kb"))
    after = await c.call("LookupResponse", paraphrase, semantic=True)
    assert after.status == MISS
    assert "moved on" in after.detail


async def test_embeddings_down_skips_semantic_and_reports_it(redis_url: str) -> None:
    dead = GrpcEmbedder(await connect(f"127.0.0.1:{free_port()}"), timeout_s=0.3)
    served = await serve_cache(redis_url, embedder=dead)
    try:
        c = Client(stub=served.stub, tenant="t-embed-down")
        k = key([user("exact still works")])
        await c.call(
            "StoreResponse", cache_pb2.StoreResponseRequest(key=k, entry=answer("yes")), semantic=True
        )
        hit = await c.call("LookupResponse", cache_pb2.LookupResponseRequest(key=k), semantic=True)
        assert hit.status == HIT
        miss = await c.call(
            "LookupResponse",
            cache_pb2.LookupResponseRequest(key=key([user("something else")])),
            semantic=True,
        )
        assert miss.status == MISS
        assert "semantic lookup skipped" in miss.detail
    finally:
        await served.close()
        await dead.close()


def test_pair_set_meets_the_goal_at_the_configured_threshold(embedder: LocalEmbedder) -> None:
    pairs = load_pairs()
    assert len(pairs) >= 200
    sims = similarities(
        pairs, embedder.embed_sync([p.a for p in pairs]), embedder.embed_sync([p.b for p in pairs])
    )
    result = rates(pairs, sims, CacheSettings.model_fields["semantic_threshold"].default)
    assert result.false_hit_rate <= 0.01, result.false_hits
    assert result.true_hit_rate >= 0.60


async def test_semantic_hit_through_the_real_embedding_service(
    redis_url: str, embeddings_address: str
) -> None:
    """The deployed path: vectors from EmbeddingService.Embed over gRPC."""
    embedder = await GrpcEmbedder.connect(embeddings_address, timeout_s=10.0)
    served = await serve_cache(redis_url, embedder=embedder, embeddings_timeout_s=10.0)
    try:
        c = Client(stub=served.stub, tenant="t-grpc-embed")
        k = key([system("You are terse."), user("How do I delete a branch in Git?")])
        stored = await c.call(
            "StoreResponse",
            cache_pb2.StoreResponseRequest(key=k, entry=answer("git branch -d")),
            semantic=True,
        )
        assert stored.stored and not stored.detail, stored.detail
        hit = await c.call("LookupResponse", _lookup("How can I remove a Git branch?"), semantic=True)
        assert hit.status == HIT, hit.detail
        assert hit.semantic
        near = await c.call("LookupResponse", _lookup("How do I create a branch in Git?"), semantic=True)
        assert near.status == MISS
    finally:
        await served.close()
        await embedder.close()
