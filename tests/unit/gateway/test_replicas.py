"""Routing across fake replicas over real gRPC: retries before the first token, a killed
replica, the breaker, client cancellation, and the gRPC ChatService."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import openai
import pytest
from llmesh.v1 import chat_pb2, chat_pb2_grpc, common_pb2

from gateway.auth import hash_key
from gateway.config import GatewaySettings
from gateway.routing.breaker import BreakerState
from gateway.servicer import ChatServicer
from services.runtime import twins
from services.runtime.server import RunningServer, ServiceBinding, build_server
from tests.fixtures.fake_inference import MODEL, FakeInference, start_fake
from tests.fixtures.gateway import RunningGateway, serve_gateway

KEY = "sk-replicas"


Pair = tuple[list[FakeInference], list[RunningServer]]


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    fakes = [FakeInference("r1"), FakeInference("r2")]
    servers = [await start_fake(f) for f in fakes]
    yield fakes, servers
    for server in servers:
        await server.stop(0)


def _settings(addresses: list[str], **extra: object) -> GatewaySettings:
    return GatewaySettings(
        inference_addresses=addresses,
        api_keys={hash_key(KEY): "t"},
        breaker_failures=2,
        breaker_open_s=60,
        **extra,  # type: ignore[arg-type]
    )


def _ask(text: str) -> list[Any]:
    return [{"role": "system", "content": "shared system prompt " * 30}, {"role": "user", "content": text}]


async def test_failure_before_first_token_is_retried_elsewhere(pair: Pair) -> None:
    fakes, servers = pair
    # Round robin makes the broken replica come up every other request.
    settings = _settings([s.address for s in servers], route_policy="round_robin")
    async with (
        serve_gateway(settings) as gw,
        openai.AsyncOpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0) as client,
    ):
        for fake in fakes:
            fake.fail_next = 100
        fakes[1].fail_next = 0
        for i in range(6):
            reply = await client.chat.completions.create(model=MODEL, messages=_ask(f"q{i}"))
            assert reply.choices[0].message.content == f"echo: q{i}"
            stream = await client.chat.completions.create(model=MODEL, messages=_ask(f"s{i}"), stream=True)
            assert "".join([c.choices[0].delta.content or "" async for c in stream]) == f"echo: s{i}"
        r1 = gw.gateway.inference.balancer.replicas[servers[0].address]
        # r1 failed twice, then its breaker opened and it got no more calls.
        assert r1.breaker.state is BreakerState.OPEN
        assert len(fakes[0].calls) == 2


async def test_all_replicas_down_is_503_with_retry_after(pair: Pair) -> None:
    fakes, servers = pair
    async with serve_gateway(_settings([s.address for s in servers])) as gw:
        for fake in fakes:
            fake.fail_next = 100
        async with httpx.AsyncClient(base_url=gw.url) as http:
            reply = await http.post(
                "/v1/chat/completions",
                json={"model": MODEL, "messages": _ask("x")},
                headers={"authorization": f"Bearer {KEY}"},
            )
        assert reply.status_code == 503
        assert int(reply.headers["retry-after"]) >= 1
        assert reply.json()["error"]["type"] == "service_unavailable"


async def test_killed_replica_leaves_the_ring_and_requests_keep_succeeding(pair: Pair) -> None:
    _, servers = pair
    async with (
        serve_gateway(_settings([s.address for s in servers])) as gw,
        openai.AsyncOpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0) as client,
    ):
        first = await client.chat.completions.create(model=MODEL, messages=_ask("warm"))
        assert first.choices
        served_by = max(gw.gateway.inference.replicas, key=lambda r: r.served)
        victim = next(s for s in servers if s.address == served_by.address)
        await victim.stop(0)
        for i in range(5):
            reply = await client.chat.completions.create(model=MODEL, messages=_ask(f"after {i}"))
            assert reply.choices[0].message.content == f"echo: after {i}"
        assert not served_by.healthy


async def test_client_disconnect_cancels_the_engine_request() -> None:
    fake = FakeInference("r1", hold=asyncio.Event())
    server = await start_fake(fake)
    try:
        await _disconnect(fake, server)
    finally:
        await server.stop(0)


async def _disconnect(fake: FakeInference, server: RunningServer) -> None:
    async with serve_gateway(_settings([server.address])) as gw:
        async with (
            httpx.AsyncClient(base_url=gw.url, timeout=10) as http,
            http.stream(
                "POST",
                "/v1/chat/completions",
                json={"model": MODEL, "messages": _ask("a b c d"), "stream": True},
                headers={"authorization": f"Bearer {KEY}"},
            ) as reply,
        ):
            assert reply.status_code == 200
            async for line in reply.aiter_lines():
                if line.startswith("data: "):
                    break  # the first chunk arrived; now hang up
        await asyncio.wait_for(fake.cancel_seen.wait(), timeout=10)
        assert fake.cancelled == 1
        assert gw.gateway.pipeline.admission.inflight == 0


@pytest.fixture
async def grpc_gateway() -> AsyncIterator[tuple[RunningGateway, str]]:
    fake = FakeInference("r1")
    server = await start_fake(fake)
    async with serve_gateway(_settings([server.address])) as gw:
        binding = ServiceBinding(
            name="llmesh.v1.ChatService",
            add=chat_pb2_grpc.add_ChatServiceServicer_to_server,
            servicer=ChatServicer(gw.gateway),
        )
        from services.runtime.settings import ServiceSettings

        chat_server = await build_server(ServiceSettings(port=0), [binding])
        yield gw, chat_server.address
        await chat_server.stop(0)
    await server.stop(0)


async def test_grpc_chat_service(grpc_gateway: tuple[RunningGateway, str]) -> None:
    _, address = grpc_gateway
    request = chat_pb2.CompleteRequest(
        model=MODEL, messages=[common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content="hi grpc")]
    )
    auth = (("authorization", f"Bearer {KEY}"),)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = chat_pb2_grpc.ChatServiceStub(channel)
        reply = await stub.Complete(request, metadata=auth)
        assert reply.choices[0].text == "echo: hi grpc"
        parts = [
            m
            async for m in stub.CompleteStream(
                twins.convert(request, chat_pb2.CompleteStreamRequest), metadata=auth
            )
        ]
        assert "".join(d.text for m in parts for d in m.deltas) == "echo: hi grpc"
        assert parts[-1].usage.completion_tokens == 3
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Complete(request, metadata=(("authorization", "Bearer nope"),))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
