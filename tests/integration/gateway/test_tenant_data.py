"""What the mesh keeps for a tenant, through the gateway's own API: cache purge, sessions and usage
over HTTP and the ChatService RPCs, with the real cache and policy services on the test Redis in
front of a fake inference replica."""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from llmesh.v1 import chat_pb2, chat_pb2_grpc
from prometheus_client import REGISTRY
from pydantic import SecretStr

from gateway.auth import hash_key
from gateway.config import GatewaySettings, TenantSettings
from gateway.servicer import ChatServicer
from services.runtime import context as rc
from services.runtime.server import ServiceBinding, build_server
from services.runtime.versions import version_key
from tests.fixtures.fake_inference import MODEL
from tests.fixtures.gateway import RunningGateway, serve_gateway
from tests.fixtures.ports import free_port
from tests.integration.gateway.conftest import Tenant, Upstreams

ADMIN_TOKEN = "admin-token-of-the-tenant-data-tests"


@dataclass
class Mesh:
    gateway: RunningGateway
    chat_address: str
    tenants: tuple[Tenant, Tenant]


def _tenant() -> Tenant:
    suffix = uuid.uuid4().hex[:10]
    return Tenant(f"t-{suffix}", f"sk-{suffix}")


def _settings(up: Upstreams, tenants: tuple[Tenant, ...], **extra: Any) -> GatewaySettings:
    return GatewaySettings(
        inference_addresses=[up.inference],
        cache_address=up.cache,
        policy_address=up.policy,
        api_keys={hash_key(t.key): t.name for t in tenants},
        tenants={t.name: TenantSettings() for t in tenants},
        **extra,
    )


@pytest_asyncio.fixture(loop_scope="session")
async def mesh(upstreams: Upstreams) -> AsyncIterator[Mesh]:
    tenants = (_tenant(), _tenant())
    settings = _settings(upstreams, tenants, admin_token=SecretStr(ADMIN_TOKEN))
    async with serve_gateway(settings) as running:
        binding = ServiceBinding(
            name="llmesh.v1.ChatService",
            add=chat_pb2_grpc.add_ChatServiceServicer_to_server,
            servicer=ChatServicer(running.gateway),
        )
        server = await build_server(settings.model_copy(update={"port": 0}), [binding])
        try:
            yield Mesh(running, server.address, tenants)
        finally:
            await server.stop(0)


def _chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "temperature": 0, **extra}


async def _call(
    mesh: Mesh, method: str, path: str, key: str, json: Any = None, **headers: str
) -> httpx.Response:
    async with httpx.AsyncClient(base_url=mesh.gateway.url, timeout=30) as http:
        return await http.request(
            method,
            path,
            json=json,
            headers={
                "authorization": f"Bearer {key}",
                **{k.replace("_", "-"): v for k, v in headers.items()},
            },
        )


# -- purge ---------------------------------------------------------------------------------------


async def test_purge_then_the_returned_version_is_never_an_answer_from_before(mesh: Mesh) -> None:
    owner, other = mesh.tenants
    body = _chat(f"purge me {uuid.uuid4().hex}")
    assert (await _call(mesh, "POST", "/v1/chat/completions", owner.key, body)).headers[
        "x-cache-status"
    ] == "MISS"
    assert (await _call(mesh, "POST", "/v1/chat/completions", owner.key, body)).headers[
        "x-cache-status"
    ] == "HIT"
    # Another tenant's purge is its own: the owner's answer is still served.
    await _call(mesh, "POST", "/v1/cache/purge", other.key, {})
    assert (await _call(mesh, "POST", "/v1/chat/completions", owner.key, body)).headers[
        "x-cache-status"
    ] == "HIT"

    purged = await _call(mesh, "POST", "/v1/cache/purge", owner.key, {})
    assert purged.status_code == 200, purged.text
    payload = purged.json()
    assert payload["object"] == "cache.purge" and payload["namespace"] == "tenant"
    assert purged.headers["x-cache-version"] == payload["cache_version"]
    assert rc.parse_versions(payload["cache_version"])["tenant"] == payload["version"]

    after = await _call(
        mesh, "POST", "/v1/chat/completions", owner.key, body, x_cache_version=payload["cache_version"]
    )
    assert after.status_code == 200, after.text
    assert after.headers["x-cache-status"] in ("MISS", "STALE")
    # The answer generated after the purge is cached again, under the new version.
    again = await _call(
        mesh, "POST", "/v1/chat/completions", owner.key, body, x_cache_version=payload["cache_version"]
    )
    assert again.headers["x-cache-status"] == "HIT"


async def test_purge_without_a_body_and_of_one_scope(mesh: Mesh) -> None:
    owner = mesh.tenants[0]
    async with httpx.AsyncClient(base_url=mesh.gateway.url, timeout=30) as http:
        bare = await http.post("/v1/cache/purge", headers={"authorization": f"Bearer {owner.key}"})
    assert bare.status_code == 200 and bare.json()["namespace"] == "tenant"
    body = _chat(f"scoped {uuid.uuid4().hex}")
    await _call(mesh, "POST", "/v1/chat/completions", owner.key, body)
    # Answers made without RAG are the "response:default" scope; a RAG scope is another one.
    rag = await _call(
        mesh, "POST", "/v1/cache/purge", owner.key, {"rag": {"collections": ["b", "a"], "top_k": 3}}
    )
    assert rag.json()["namespace"] == "response:rag:a+b:k3:s0"
    assert (await _call(mesh, "POST", "/v1/chat/completions", owner.key, body)).headers[
        "x-cache-status"
    ] == "HIT"
    short = await _call(mesh, "POST", "/v1/cache/purge", owner.key, {"rag_collection": "docs"})
    assert short.json()["namespace"] == "response:rag:docs:k4:s0"
    default = await _call(mesh, "POST", "/v1/cache/purge", owner.key, {"namespace": "response:default"})
    assert default.status_code == 200
    assert (await _call(mesh, "POST", "/v1/chat/completions", owner.key, body)).headers[
        "x-cache-status"
    ] != "HIT"


@pytest.mark.parametrize(
    "body",
    [
        {"namespace": "policy"},
        {"namespace": "rag:docs"},
        {"namespace": "tenant", "rag_collection": "docs"},
        {"rag": {"collections": []}},
        {"namespace": "response:{x}"},
    ],
)
async def test_purge_refuses_what_the_cache_does_not_own(mesh: Mesh, body: dict[str, Any]) -> None:
    reply = await _call(mesh, "POST", "/v1/cache/purge", mesh.tenants[0].key, body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["type"] == "invalid_request_error"


async def test_purging_made_up_names_leaves_no_key(mesh: Mesh, redis_url: str) -> None:
    owner = mesh.tenants[0]
    names = [f"response:made-up-{uuid.uuid4().hex}", f"session:made-up-{uuid.uuid4().hex}"]
    for namespace in names:
        reply = await _call(mesh, "POST", "/v1/cache/purge", owner.key, {"namespace": namespace})
        assert reply.status_code == 200 and reply.json()["version"] > 0
    redis = aioredis.Redis.from_url(redis_url)
    try:
        assert not await redis.exists(*(version_key(owner.name, ns) for ns in names))
    finally:
        await redis.aclose()


# -- sessions ------------------------------------------------------------------------------------


async def test_sessions_list_get_delete_and_another_tenant_gets_404(mesh: Mesh) -> None:
    owner, other = mesh.tenants
    session = f"s-{uuid.uuid4().hex[:12]}"
    for text in ("hello one", "hello two"):
        reply = await _call(mesh, "POST", "/v1/chat/completions", owner.key, _chat(text, session_id=session))
        assert reply.status_code == 200, reply.text

    listed = (await _call(mesh, "GET", "/v1/sessions", owner.key)).json()
    assert listed["object"] == "list" and listed["has_more"] is False
    card = next(c for c in listed["data"] if c["id"] == session)
    assert card["object"] == "session" and card["total_turns"] == 4 and card["expires_at"] > 0

    got = await _call(mesh, "GET", f"/v1/sessions/{session}", owner.key)
    assert got.status_code == 200, got.text
    detail = got.json()
    assert [m["role"] for m in detail["messages"]] == ["user", "assistant", "user", "assistant"]
    assert detail["messages"][0]["content"] == "hello one"
    assert detail["messages"][1]["content"].startswith("echo: hello one")
    assert rc.parse_versions(got.headers["x-cache-version"])[f"session:{session}"] == detail["version"]

    for method in ("GET", "DELETE"):
        foreign = await _call(mesh, method, f"/v1/sessions/{session}", other.key)
        assert foreign.status_code == 404, (method, foreign.text)
        assert foreign.json()["error"]["type"] == "not_found_error"
    assert all(
        c["id"] != session for c in (await _call(mesh, "GET", "/v1/sessions", other.key)).json()["data"]
    )

    deleted = await _call(mesh, "DELETE", f"/v1/sessions/{session}", owner.key)
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {
        "id": session,
        "object": "session.deleted",
        "deleted": True,
        "version": deleted.json()["version"],
    }
    assert deleted.json()["version"] > detail["version"]
    assert (await _call(mesh, "GET", f"/v1/sessions/{session}", owner.key)).status_code == 404
    assert (await _call(mesh, "DELETE", f"/v1/sessions/{session}", owner.key)).status_code == 404
    assert all(
        c["id"] != session for c in (await _call(mesh, "GET", "/v1/sessions", owner.key)).json()["data"]
    )


async def test_sessions_page_through_http(upstreams: Upstreams) -> None:
    tenant = _tenant()
    async with serve_gateway(_settings(upstreams, (tenant,))) as running:
        mesh = Mesh(running, "", (tenant, tenant))
        for i in range(3):
            await _call(mesh, "POST", "/v1/chat/completions", tenant.key, _chat("hi", session_id=f"p{i}"))
        seen: list[str] = []
        token = ""
        while True:
            page = (await _call(mesh, "GET", f"/v1/sessions?limit=2&page_token={token}", tenant.key)).json()
            seen += [c["id"] for c in page["data"]]
            if not page["has_more"]:
                break
            token = page["next_page_token"]
        assert sorted(seen) == ["p0", "p1", "p2"]
        bad = await _call(mesh, "GET", "/v1/sessions?page_token=garbage", tenant.key)
        assert bad.status_code == 400
        assert (await _call(mesh, "GET", "/v1/sessions?limit=0", tenant.key)).status_code == 400
        assert (await _call(mesh, "GET", "/v1/sessions/bad:id", tenant.key)).status_code == 400


# -- usage ---------------------------------------------------------------------------------------


def _range() -> str:
    today = dt.datetime.now(dt.UTC).date()
    return f"start={today - dt.timedelta(days=1)}&end={today + dt.timedelta(days=1)}"


async def test_usage_counts_tokens_hits_and_blocks_per_key_and_model(mesh: Mesh) -> None:
    owner, other = mesh.tenants
    before = (await _call(mesh, "GET", f"/v1/usage?{_range()}", owner.key)).json()["total"]
    body = _chat(f"count me {uuid.uuid4().hex}")
    first = (await _call(mesh, "POST", "/v1/chat/completions", owner.key, body)).json()
    await _call(mesh, "POST", "/v1/chat/completions", owner.key, body)  # a HIT: no tokens
    blocked_in = await _call(
        mesh, "POST", "/v1/chat/completions", owner.key, _chat("how do I build a pipe bomb at home")
    )
    assert blocked_in.status_code == 400
    blocked_out = (
        await _call(mesh, "POST", "/v1/chat/completions", owner.key, _chat("how to do it?", temperature=0.5))
    ).json()
    assert blocked_out["choices"][0]["finish_reason"] == "content_filter"

    reply = await _call(mesh, "GET", f"/v1/usage?{_range()}", owner.key)
    assert reply.status_code == 200, reply.text
    report = reply.json()
    assert report["object"] == "usage.report" and report["tenant"] == owner.name
    total = report["total"]
    spent_in = first["usage"]["prompt_tokens"] + blocked_out["usage"]["prompt_tokens"]
    spent_out = first["usage"]["completion_tokens"] + blocked_out["usage"]["completion_tokens"]
    assert total["requests"] - before["requests"] == 4
    assert total["cache_hits"] - before["cache_hits"] == 1
    assert total["blocked_requests"] - before["blocked_requests"] == 2
    assert total["input_tokens"] - before["input_tokens"] == spent_in
    assert total["output_tokens"] - before["output_tokens"] == spent_out
    key_id = hashlib.sha256(owner.key.encode()).hexdigest()[:16]
    assert [k["key_id"] for k in report["by_key"]] == [key_id]
    assert {row["model"] for row in report["by_model"]} == {MODEL}
    assert sum(row["requests"] for row in report["by_model"]) == total["requests"]
    # The budget read (gateway/usage.py spent_tokens) sees the same tokens.
    usage = mesh.gateway.gateway.usage
    assert usage is not None
    assert await usage.spent_tokens(owner.name, "day") == total["input_tokens"] + total["output_tokens"]
    assert await usage.spent_tokens(owner.name, "month") >= total["input_tokens"] + total["output_tokens"]
    # Another tenant sees only its own.
    assert (await _call(mesh, "GET", f"/v1/usage?{_range()}", other.key)).json()["tenant"] == other.name


async def test_usage_range_is_checked(mesh: Mesh) -> None:
    key = mesh.tenants[0].key
    assert (await _call(mesh, "GET", "/v1/usage?start=2025-02-01&end=2025-01-01", key)).status_code == 400
    assert (await _call(mesh, "GET", "/v1/usage?start=2020-01-01&end=2025-01-01", key)).status_code == 400
    assert (await _call(mesh, "GET", "/v1/usage?start=yesterday", key)).status_code == 400
    today = await _call(mesh, "GET", "/v1/usage", key)
    assert today.json()["start"] == today.json()["end"] == dt.datetime.now(dt.UTC).date().isoformat()


async def test_admin_usage_lists_every_tenant_with_the_admin_token_only(mesh: Mesh) -> None:
    owner, other = mesh.tenants
    for tenant in mesh.tenants:
        await _call(mesh, "POST", "/v1/chat/completions", tenant.key, _chat(f"admin view {uuid.uuid4().hex}"))
    reply = await _call(mesh, "GET", f"/v1/admin/usage?{_range()}", ADMIN_TOKEN)
    assert reply.status_code == 200, reply.text
    reports = {r["tenant"]: r for r in reply.json()["data"]}
    assert {owner.name, other.name} <= set(reports)
    assert reports[owner.name]["total"]["requests"] >= 1
    one = (await _call(mesh, "GET", f"/v1/admin/usage?{_range()}&tenant={other.name}", ADMIN_TOKEN)).json()
    assert [r["tenant"] for r in one["data"]] == [other.name]
    assert (await _call(mesh, "GET", "/v1/admin/usage", owner.key)).status_code == 401
    assert (await _call(mesh, "GET", "/v1/admin/usage?tenant=a:b", ADMIN_TOKEN)).status_code == 400


async def test_a_down_usage_redis_never_fails_a_request(upstreams: Upstreams) -> None:
    tenant = _tenant()
    settings = _settings(upstreams, (tenant,), redis_url=f"redis://127.0.0.1:{free_port()}/0")
    failures = REGISTRY.get_sample_value("llmesh_usage_write_failures_total") or 0.0
    async with serve_gateway(settings) as running:
        mesh = Mesh(running, "", (tenant, tenant))
        reply = await _call(
            mesh, "POST", "/v1/chat/completions", tenant.key, _chat(f"no redis {uuid.uuid4().hex}")
        )
        assert reply.status_code == 200, reply.text
        assert (REGISTRY.get_sample_value("llmesh_usage_write_failures_total") or 0.0) > failures
        report = await _call(mesh, "GET", "/v1/usage", tenant.key)
        assert report.status_code == 503


async def test_tenant_labelled_metrics_only_when_enabled(upstreams: Upstreams) -> None:
    for enabled in (False, True):
        tenant = _tenant()
        settings = _settings(upstreams, (tenant,), usage_metrics_by_tenant=enabled)
        async with serve_gateway(settings) as running:
            mesh = Mesh(running, "", (tenant, tenant))
            await _call(
                mesh, "POST", "/v1/chat/completions", tenant.key, _chat(f"metrics {uuid.uuid4().hex}")
            )
        labelled = REGISTRY.get_sample_value(
            "llmesh_tenant_requests_total", {"tenant": tenant.name, "model": MODEL, "outcome": "generated"}
        )
        assert (labelled == 1.0) if enabled else (labelled is None)


# -- gRPC ----------------------------------------------------------------------------------------


async def test_chat_service_rpcs_return_versions_and_keep_tenants_apart(mesh: Mesh) -> None:
    owner, other = mesh.tenants
    session = f"g-{uuid.uuid4().hex[:12]}"
    await _call(mesh, "POST", "/v1/chat/completions", owner.key, _chat("over grpc", session_id=session))
    async with grpc.aio.insecure_channel(mesh.chat_address) as channel:
        chat = chat_pb2_grpc.ChatServiceStub(channel)
        md = [("authorization", f"Bearer {owner.key}")]

        call = chat.PurgeCache(chat_pb2.PurgeCacheRequest(), metadata=md, timeout=10)
        purged = await call
        trailers = dict(await call.trailing_metadata() or ())
        assert purged.version.namespace == "tenant" and purged.version.version > 0
        assert trailers["x-llmesh-cache-version"] == purged.cache_version
        scoped = await chat.PurgeCache(
            chat_pb2.PurgeCacheRequest(rag=chat_pb2.RagOptions(collections=["docs"])), metadata=md, timeout=10
        )
        assert scoped.version.namespace == "response:rag:docs:k4:s0"

        listed = await chat.ListSessions(chat_pb2.ChatServiceListSessionsRequest(page_size=100), metadata=md)
        assert session in [s.session_id for s in listed.sessions]

        get_call = chat.GetSession(chat_pb2.ChatServiceGetSessionRequest(session_id=session), metadata=md)
        got = await get_call
        assert got.messages[0].content == "over grpc" and len(got.messages) == 2
        got_trailers = {k: str(v) for k, v in await get_call.trailing_metadata() or ()}
        assert rc.parse_versions(got_trailers["x-llmesh-cache-version"])[f"session:{session}"] == got.version

        foreign = [("authorization", f"Bearer {other.key}")]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await chat.GetSession(chat_pb2.ChatServiceGetSessionRequest(session_id=session), metadata=foreign)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await chat.DeleteSession(
                chat_pb2.ChatServiceDeleteSessionRequest(session_id=session), metadata=foreign
            )
        assert err.value.code() == grpc.StatusCode.NOT_FOUND

        deleted = await chat.DeleteSession(
            chat_pb2.ChatServiceDeleteSessionRequest(session_id=session), metadata=md
        )
        assert deleted.session_id == session and deleted.version > got.version
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await chat.PurgeCache(chat_pb2.PurgeCacheRequest(namespace="policy"), metadata=md)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await chat.ListSessions(
                chat_pb2.ChatServiceListSessionsRequest(), metadata=[("authorization", "Bearer x")]
            )
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_without_a_cache_service_purge_and_sessions_are_400(upstreams: Upstreams) -> None:
    tenant = _tenant()
    settings = _settings(upstreams, (tenant,)).model_copy(update={"cache_address": ""})
    async with serve_gateway(settings) as running:
        mesh = Mesh(running, "", (tenant, tenant))
        for method, path in (("POST", "/v1/cache/purge"), ("GET", "/v1/sessions"), ("GET", "/v1/sessions/x")):
            reply = await _call(mesh, method, path, tenant.key, {} if method == "POST" else None)
            assert reply.status_code == 400, (path, reply.text)
            assert "no cache service" in reply.json()["error"]["message"]
