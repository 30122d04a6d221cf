"""Two tenants over every shared store: zero cross-tenant reads.

Over the gateway (HTTP, API keys → tenants) and directly against the services
(gRPC, tenant metadata): response cache (exact and semantic), sessions, RAG
collections, rate limits and the audit log; plus a client trying to pick another
tenant with a header or metadata of its own.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import pytest
import redis.asyncio as aioredis
from llmesh.v1 import (
    cache_pb2,
    cache_pb2_grpc,
    chat_pb2,
    chat_pb2_grpc,
    common_pb2,
    embeddings_pb2,
    embeddings_pb2_grpc,
)

from policy.audit import DEFAULT_KEY, stream_key
from tests.reliability.conftest import GAMMA_RPM, KEYS, Gateway


@pytest.fixture
async def http(gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=120) as client:
        yield client


def _tenant_md(tenant: str) -> tuple[tuple[str, str], ...]:
    return (("x-llmesh-tenant", tenant),)


async def _chat(http: httpx.AsyncClient, tenant: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    payload = {"model": "", "max_tokens": 6, "temperature": 0, **body}
    return await http.post(
        "/v1/chat/completions",
        json=payload,
        headers={"Authorization": f"Bearer {KEYS[tenant]}", **headers},
    )


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def test_response_cache_is_per_tenant(http: httpx.AsyncClient) -> None:
    body = {"messages": _user(f"Name a colour. {uuid.uuid4().hex[:8]}")}
    assert (await _chat(http, "alpha", body)).headers["x-cache-status"] == "MISS"
    assert (await _chat(http, "alpha", body)).headers["x-cache-status"] == "HIT"
    beta = await _chat(http, "beta", body, **{"X-Semantic-Cache": "on"})
    assert beta.status_code == 200, beta.text
    assert beta.headers["x-cache-status"] == "MISS"  # neither exact nor semantic crosses tenants


async def test_tenant_cannot_be_chosen_by_the_client(http: httpx.AsyncClient, gateway: Gateway) -> None:
    body = {"messages": _user(f"Name an animal. {uuid.uuid4().hex[:8]}")}
    assert (await _chat(http, "beta", body)).status_code == 200  # beta's entry now exists
    spoofed = await _chat(http, "alpha", body, **{"X-Llmesh-Tenant": "beta"})
    assert spoofed.headers["x-cache-status"] == "MISS"  # served as alpha, not beta
    async with grpc.aio.insecure_channel(gateway.grpc_address) as channel:
        stub = chat_pb2_grpc.ChatServiceStub(channel)
        call = stub.Complete(
            chat_pb2.CompleteRequest(
                messages=[
                    common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=body["messages"][0]["content"])
                ],
                sampling=common_pb2.SamplingParams(max_tokens=6, temperature=0),
            ),
            metadata=(("authorization", f"Bearer {KEYS['alpha']}"), ("x-llmesh-tenant", "beta")),
            timeout=120,
        )
        reply = await call
    assert reply.cache_status != common_pb2.CACHE_STATUS_HIT


async def test_sessions_are_per_tenant(http: httpx.AsyncClient, service_processes: dict[str, Any]) -> None:
    session = f"shared-{uuid.uuid4().hex[:8]}"
    alpha = await _chat(
        http, "alpha", {"messages": _user("Remember the codeword PELICAN-42 for me."), "session_id": session}
    )
    assert alpha.status_code == 200, alpha.text
    question = _user("What is the codeword?")
    beta_with = await _chat(http, "beta", {"messages": question, "session_id": session})
    beta_fresh = await _chat(http, "beta", {"messages": question})
    # Beta's request under alpha's session id carries none of alpha's turns to the model.
    assert beta_with.json()["usage"]["prompt_tokens"] == beta_fresh.json()["usage"]["prompt_tokens"]
    async with grpc.aio.insecure_channel(service_processes["cache"].address) as channel:
        stub = cache_pb2_grpc.ContextCacheServiceStub(channel)
        request = cache_pb2.GetSessionRequest(session_id=session)
        mine = await stub.GetSession(request, metadata=_tenant_md("alpha"))
        theirs = await stub.GetSession(request, metadata=_tenant_md("beta"))
        assert any("PELICAN" in m.content for m in mine.messages)
        assert not any("PELICAN" in m.content for m in theirs.messages)
        with pytest.raises(grpc.aio.AioRpcError) as guessed:
            await stub.GetSession(request, metadata=_tenant_md("gamma"))
        assert guessed.value.code() == grpc.StatusCode.NOT_FOUND


async def test_rag_collections_are_per_tenant(
    http: httpx.AsyncClient, service_processes: dict[str, Any]
) -> None:
    collection = f"private-{uuid.uuid4().hex[:8]}"
    secret = "The vault combination of Acme is 9-1-7-3."
    async with grpc.aio.insecure_channel(service_processes["embeddings"].address) as channel:
        stub = embeddings_pb2_grpc.EmbeddingServiceStub(channel)
        await stub.UpsertDocuments(
            embeddings_pb2.UpsertDocumentsRequest(
                collection=collection, documents=[embeddings_pb2.Document(id="vault", text=secret)]
            ),
            metadata=_tenant_md("alpha"),
        )
        with pytest.raises(grpc.aio.AioRpcError) as foreign:
            await stub.Search(
                embeddings_pb2.SearchRequest(collection=collection, query="vault combination", top_k=3),
                metadata=_tenant_md("beta"),
            )
        assert foreign.value.code() == grpc.StatusCode.NOT_FOUND
        listed = await stub.ListCollections(
            embeddings_pb2.ListCollectionsRequest(), metadata=_tenant_md("beta")
        )
        assert collection not in {c.name for c in listed.collections}
    question = {"messages": _user("What is the vault combination?"), "rag": {"collections": [collection]}}
    beta = await _chat(http, "beta", question)
    if beta.status_code == 200:
        plain = await _chat(http, "beta", {"messages": question["messages"]})
        assert beta.json()["usage"]["prompt_tokens"] == plain.json()["usage"]["prompt_tokens"]
    else:
        assert beta.status_code == 404, beta.text


async def test_rate_limits_are_per_tenant(http: httpx.AsyncClient) -> None:
    codes = [
        (await _chat(http, "gamma", {"messages": _user(f"Count to {i}.")})).status_code
        for i in range(GAMMA_RPM + 1)
    ]
    assert codes[:GAMMA_RPM] == [200] * GAMMA_RPM
    limited = await _chat(http, "gamma", {"messages": _user("One more.")})
    assert limited.status_code == 429 and "retry-after" in limited.headers
    assert (await _chat(http, "alpha", {"messages": _user("Still fine?")})).status_code == 200


async def test_audit_records_carry_their_own_tenant_and_no_text(
    http: httpx.AsyncClient, redis_url: str
) -> None:
    client: Any = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        key = stream_key(DEFAULT_KEY)
        last = await client.xrevrange(key, count=1)
        start = last[0][0] if last else "0-0"
        request_id = f"audit-{uuid.uuid4().hex[:12]}"
        marker = f"my private note {uuid.uuid4().hex[:6]}"
        reply = await _chat(http, "beta", {"messages": _user(marker)}, **{"X-Request-Id": request_id})
        assert reply.status_code == 200, reply.text
        found: list[dict[str, Any]] = []
        while not found:
            # Block on the stream (the audit log is written behind the response), no polling.
            batch = await client.xread({key: start}, block=30_000, count=100)
            assert batch, "no audit record within 30 s"
            for entry_id, fields in batch[0][1]:
                start = entry_id
                blob = json.dumps(fields)
                assert marker not in blob  # never the checked text
                records = [json.loads(v) for v in fields.values() if v.startswith("{")]
                found.extend(r for r in records if r.get("request_id") == request_id)
        assert {r["tenant"] for r in found} == {"beta"}
    finally:
        await client.aclose()
