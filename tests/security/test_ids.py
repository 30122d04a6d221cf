"""``:`` cannot make two keys equal (issue 14, row "':' inside tenant or session ids can make two
keys equal").

Keys join the tenant and a namespace with ':' (``llmesh:sess:{<tenant>:session:<id>}``), so
before the fix tenant ``acme:session`` asking for session ``x`` named the key of tenant ``acme``'s
session ``session:x``: another tenant's conversation. Tenant names and session ids now refuse
':' (INVALID_ARGUMENT naming the field; services/runtime/limits.py ``KEY_IDENTIFIER_CHARS``);
collection names never allowed it, and document ids are hash fields, not key names.

Real components: the cache and the embedding service over gRPC, the gateway over HTTP (fake
inference, real cache and policy), all on the test Redis.
"""

from __future__ import annotations

import uuid

import grpc
import httpx
import pytest
from llmesh.v1 import cache_pb2, embeddings_pb2, embeddings_pb2_grpc

from tests.fixtures.fake_inference import MODEL
from tests.fixtures.gateway import serve_gateway
from tests.integration.cache.conftest import Client, served, user  # noqa: F401  (fixture)
from tests.integration.cache.conftest import Served as CacheServed
from tests.integration.gateway.conftest import (  # noqa: F401  (fixtures)
    Tenant,
    Upstreams,
    make_settings,
    tenant,
    upstreams,
)


async def test_a_tenant_with_a_colon_cannot_reach_another_tenants_session(served: CacheServed) -> None:  # noqa: F811
    victim = Client(stub=served.stub, tenant=f"acme{uuid.uuid4().hex[:8]}")
    try:
        await victim.call(
            "AppendTurns",
            cache_pb2.AppendTurnsRequest(session_id="session:x", turns=[user("my secret plan")]),
        )
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "session_id" in (exc.details() or "")
    attacker = Client(stub=served.stub, tenant=victim.tenant + ":session")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await attacker.call("GetSession", cache_pb2.GetSessionRequest(session_id="x"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "x-llmesh-tenant" in (err.value.details() or "")


async def test_session_ids_with_a_colon_are_invalid_argument(served: CacheServed) -> None:  # noqa: F811
    client = Client(stub=served.stub, tenant=f"t{uuid.uuid4().hex[:8]}")
    for call, request in (
        ("AppendTurns", cache_pb2.AppendTurnsRequest(session_id="a:b", turns=[user("hi")])),
        ("GetSession", cache_pb2.GetSessionRequest(session_id="a:b")),
        ("DeleteSession", cache_pb2.DeleteSessionRequest(session_id="a:b")),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.call(call, request)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, call
        assert "session_id" in (err.value.details() or ""), call


async def test_the_gateway_answers_400_naming_session_id(
    upstreams: Upstreams,  # noqa: F811
    tenant: Tenant,  # noqa: F811
) -> None:
    async with (
        serve_gateway(make_settings(upstreams, tenant)) as gw,
        httpx.AsyncClient(base_url=gw.url) as http,
    ):
        reply = await http.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "session_id": "a:b"},
            headers={"authorization": f"Bearer {tenant.key}"},
            timeout=30,
        )
    assert reply.status_code == 400, reply.text
    assert "session_id" in reply.json()["error"]["message"]


async def test_collection_names_with_a_colon_are_invalid_argument(embeddings_address: str) -> None:
    async with grpc.aio.insecure_channel(embeddings_address) as channel:
        stub = embeddings_pb2_grpc.EmbeddingServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Search(
                embeddings_pb2.SearchRequest(collection="a:b", query="q", top_k=1),
                metadata=[("x-llmesh-tenant", "t-ids")],
            )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "collection name" in (err.value.details() or "")
