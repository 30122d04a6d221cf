"""Fail-open never persists (issue 14, row 6): an answer produced while the policy service was
down (the tenant has ``policy_fail_open``) is neither stored in the response cache nor appended
to the session, and says so (``X-Llmesh-Moderation: skipped`` over HTTP, the same trailing
metadata over gRPC).

Real components: the gateway over HTTP and gRPC, the real cache and policy services on Redis, a
fake inference replica. "Policy down" is a gateway whose policy address has no server (input and
output unmoderated), or a policy server stopped in the middle of a stream (output only). The
answer is then asked again of a gateway with the policy up, sharing the cache and the tenant.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import pytest
from llmesh.v1 import chat_pb2, chat_pb2_grpc, common_pb2

from gateway.app import SERVICE_NAME
from gateway.config import GatewaySettings
from gateway.servicer import ChatServicer
from policy.app import create as create_policy
from policy.config import PolicySettings
from services.runtime import twins
from services.runtime.server import ServiceBinding, build_server
from services.runtime.settings import ServiceSettings
from tests.fixtures.fake_inference import MODEL, FakeInference, start_fake
from tests.fixtures.gateway import RunningGateway, serve_gateway
from tests.fixtures.ports import free_port
from tests.integration.gateway.conftest import (  # noqa: F401  (fixtures)
    Tenant,
    Upstreams,
    make_settings,
    tenant,
    upstreams,
)

SKIPPED = ("x-llmesh-moderation", "skipped")
CONTACT = "who to contact?"  # -> "write to alice@example.com today" (the address is redacted)


def _body(text: str, **extra: Any) -> dict[str, Any]:
    # temperature 0: cacheable, so a stored answer would be a HIT.
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "temperature": 0, **extra}


def _policy_down(up: Upstreams, tenant: Tenant) -> GatewaySettings:  # noqa: F811
    settings = make_settings(up, tenant, policy_fail_open=True)
    settings.policy_address = f"127.0.0.1:{free_port()}"  # nothing listens there
    return settings


async def _chat(gw: RunningGateway, tenant: Tenant, body: dict[str, Any]) -> httpx.Response:  # noqa: F811
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
        reply = await http.post(
            "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {tenant.key}"}
        )
    assert reply.status_code == 200, reply.text
    return reply


def _content(lines: list[str]) -> str:
    """The text of an SSE stream's chunks (one choice)."""
    return "".join(
        line.split('"content":"', 1)[1].split('"', 1)[0] for line in lines if '"content":"' in line
    )


async def _chat_stream(
    gw: RunningGateway,
    tenant: Tenant,  # noqa: F811
    body: dict[str, Any],
) -> tuple[httpx.Headers, str, list[str]]:
    """Headers, content and SSE comment lines of one streamed chat completion."""
    async with (
        httpx.AsyncClient(base_url=gw.url, timeout=30) as http,
        http.stream(
            "POST",
            "/v1/chat/completions",
            json={**body, "stream": True},
            headers={"authorization": f"Bearer {tenant.key}"},
        ) as reply,
    ):
        assert reply.status_code == 200
        lines = [line async for line in reply.aiter_lines() if line]
    assert lines[-1] == "data: [DONE]", lines
    return reply.headers, _content(lines), [line for line in lines if line.startswith(":")]


@pytest.mark.parametrize("stream", [False, True])
async def test_fail_open_answer_is_marked_and_never_served_from_the_cache(
    upstreams: Upstreams,  # noqa: F811
    tenant: Tenant,  # noqa: F811
    stream: bool,
) -> None:
    body = _body(CONTACT)  # a fresh tenant per test: nothing of it is cached yet
    async with serve_gateway(_policy_down(upstreams, tenant)) as down:
        if stream:
            headers, content, comments = await _chat_stream(down, tenant, body)
            assert any("x-llmesh-moderation=skipped" in c for c in comments), comments
        else:
            reply = await _chat(down, tenant, body)
            headers, content = reply.headers, reply.json()["choices"][0]["message"]["content"]
            assert headers["x-cache-status"] == "BYPASS"
        assert headers.get("x-llmesh-moderation") == "skipped"
        assert "alice@example.com" in content  # really unmoderated: the fixture failed open
    async with serve_gateway(make_settings(upstreams, tenant, policy_fail_open=True)) as up:
        # Policy back: the same request is generated (and moderated) again, never the stored one.
        reply = await _chat(up, tenant, body)
        assert reply.headers["x-cache-status"] != "HIT"
        assert "alice@example.com" not in reply.json()["choices"][0]["message"]["content"]
        assert "x-llmesh-moderation" not in reply.headers
        # ... and that moderated answer is cached as usual.
        assert (await _chat(up, tenant, body)).headers["x-cache-status"] == "HIT"


async def test_fail_open_turn_is_not_appended_to_the_session(
    upstreams: Upstreams,  # noqa: F811
    tenant: Tenant,  # noqa: F811
) -> None:
    session = f"s-{uuid.uuid4().hex[:12]}"
    async with serve_gateway(_policy_down(upstreams, tenant)) as down:
        reply = await _chat(down, tenant, _body(CONTACT, session_id=session))
        assert reply.headers["x-llmesh-moderation"] == "skipped"
    async with serve_gateway(make_settings(upstreams, tenant)) as up:
        seen = await _chat(up, tenant, _body("what did you see?", session_id=session))
    # The model saw only the new question: the unmoderated turn and answer were not kept.
    assert "turns=1" in seen.json()["choices"][0]["message"]["content"]


@pytest.fixture
async def chat_stub(
    upstreams: Upstreams,  # noqa: F811
    tenant: Tenant,  # noqa: F811
) -> AsyncIterator[chat_pb2_grpc.ChatServiceAsyncStub]:
    """The gateway's gRPC ChatService, its policy down (the tenant fails open)."""
    async with serve_gateway(_policy_down(upstreams, tenant)) as down:
        binding = ServiceBinding(
            name=SERVICE_NAME,
            add=chat_pb2_grpc.add_ChatServiceServicer_to_server,
            servicer=ChatServicer(down.gateway),
        )
        server = await build_server(ServiceSettings(port=0), [binding])
        try:
            async with grpc.aio.insecure_channel(server.address) as channel:
                stub: chat_pb2_grpc.ChatServiceAsyncStub = chat_pb2_grpc.ChatServiceStub(channel)  # type: ignore[assignment]
                yield stub
        finally:
            await server.stop(0)


def _grpc_request(text: str) -> chat_pb2.CompleteRequest:
    return chat_pb2.CompleteRequest(
        model=MODEL,
        messages=[common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=text)],
        sampling=common_pb2.SamplingParams(temperature=0),
    )


def _grpc_stream_request(text: str) -> chat_pb2.CompleteStreamRequest:
    return twins.convert(_grpc_request(text), chat_pb2.CompleteStreamRequest)


async def test_grpc_trailing_metadata_says_moderation_skipped(
    chat_stub: chat_pb2_grpc.ChatServiceAsyncStub,
    tenant: Tenant,  # noqa: F811
) -> None:
    metadata = (("authorization", f"Bearer {tenant.key}"),)
    call = chat_stub.Complete(_grpc_request(f"unary {uuid.uuid4().hex}"), metadata=metadata)
    await call
    assert SKIPPED in tuple(await call.trailing_metadata())
    stream = chat_stub.CompleteStream(_grpc_stream_request(f"stream {uuid.uuid4().hex}"), metadata=metadata)
    assert [m async for m in stream]
    assert SKIPPED in tuple(await stream.trailing_metadata())


async def test_output_failing_open_mid_stream_is_marked_and_not_cached(
    upstreams: Upstreams,  # noqa: F811
    tenant: Tenant,  # noqa: F811
    redis_url: str,
) -> None:
    """Input moderated, then the policy service goes away while the answer streams."""
    policy_settings = PolicySettings(port=0, redis_url=redis_url)
    policy = await create_policy(policy_settings)
    policy_server = await build_server(policy_settings, [policy.binding()])
    await policy.start(policy_server)
    held = FakeInference("held", hold=asyncio.Event())
    replica = await start_fake(held)
    settings = make_settings(upstreams, tenant, policy_fail_open=True)
    settings.policy_address = policy_server.address
    settings.inference_addresses = [replica.address]
    body = _body(CONTACT, stream=True)
    try:
        async with (
            serve_gateway(settings) as gw,
            httpx.AsyncClient(base_url=gw.url, timeout=30) as http,
            http.stream(
                "POST", "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {tenant.key}"}
            ) as reply,
        ):
            assert reply.status_code == 200
            assert "x-llmesh-moderation" not in reply.headers  # the input was moderated
            # The replica holds the stream after its first word: the policy service goes away now
            # (before or after the gateway opened its moderation stream), then the answer goes on.
            await held.called.wait()
            await policy_server.stop(0)
            assert held.hold is not None
            held.hold.set()
            rest = [line async for line in reply.aiter_lines() if line]
        assert any("x-llmesh-moderation=skipped" in line for line in rest), rest
        # Unmoderated, as the tenant chose, and whole: what the policy service held went out too.
        assert _content(rest) == "write to alice@example.com today", rest
        async with serve_gateway(make_settings(upstreams, tenant)) as up:
            again = await _chat(up, tenant, {**body, "stream": False})
        assert again.headers["x-cache-status"] != "HIT"
        assert "alice@example.com" not in again.json()["choices"][0]["message"]["content"]
    finally:
        await replica.stop(0)
        await policy_server.stop(0)
        await policy.close()
