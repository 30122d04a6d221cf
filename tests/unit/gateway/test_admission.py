"""The admission slot is the pipeline's: every way a request can end gives it back.

A fake replica that holds each stream after its first word stands behind a real
gateway (HTTP on uvicorn, the gRPC ChatService on a real server). The gateway's
admission is swapped for one that records its peak and says when it is idle again,
so a test waits for the slot on an event instead of polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, MutableMapping
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import pytest
from llmesh.v1 import chat_pb2, chat_pb2_grpc, common_pb2
from starlette.requests import ClientDisconnect

from gateway.admission import Admission, Slot
from gateway.api.deps import Call
from gateway.api.streaming import sse_response
from gateway.auth import Principal, hash_key
from gateway.config import GatewaySettings
from gateway.ratelimit import NoLimits
from gateway.servicer import ChatServicer
from services.runtime import context as rc
from services.runtime import twins
from services.runtime.errors import ResourceExhausted, Unavailable
from services.runtime.server import RunningServer, ServiceBinding, build_server
from services.runtime.settings import ServiceSettings
from tests.fixtures.fake_inference import MODEL, FakeInference, start_fake
from tests.fixtures.gateway import RunningGateway, serve_gateway

KEY = "sk-admission"
AUTH = {"authorization": f"Bearer {KEY}"}
GRPC_AUTH = (("authorization", f"Bearer {KEY}"),)


class WatchedAdmission(Admission):
    """The gateway's admission, recording its peak and setting ``idle`` when the last slot is back."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.peak = 0
        self.idle = asyncio.Event()

    def acquire(self, count: int = 1, *, tenant: str | None = None, tenant_limit: int = 0) -> list[Slot]:
        slots = super().acquire(count, tenant=tenant, tenant_limit=tenant_limit)
        self.peak = max(self.peak, self.inflight)
        self.idle.clear()
        return slots

    def _give_back(self, tenant: str | None) -> None:
        super()._give_back(tenant)
        if self.inflight == 0:
            self.idle.set()

    async def settled(self) -> None:
        """Every slot is back (the server side finishes a hung-up request on its own time)."""
        await asyncio.wait_for(self.idle.wait(), timeout=10)
        assert self.inflight == 0


class RefuseSecond(NoLimits):
    """A rate limiter that lets the first request through and refuses the next ones."""

    def __init__(self) -> None:
        self.admitted = 0

    async def admit(self, principal: Principal) -> None:
        self.admitted += 1
        if self.admitted > 1:
            raise ResourceExhausted("request rate limit reached", retry_after_s=1.0)


@dataclass
class Rig:
    gw: RunningGateway
    fake: FakeInference
    admission: WatchedAdmission
    grpc_address: str
    limiter: RefuseSecond | None

    async def principal(self) -> Principal:
        return await self.gw.gateway.auth.authenticate(f"Bearer {KEY}")


@contextlib.asynccontextmanager
async def _rig(limiter: RefuseSecond | None) -> AsyncIterator[Rig]:
    """A fresh gateway per test: a failing replica opens its breaker, which must not leak."""
    fake = FakeInference("r1", hold=asyncio.Event())
    server = await start_fake(fake)
    settings = GatewaySettings(inference_addresses=[server.address], api_keys={hash_key(KEY): "t"})
    chat_server: RunningServer | None = None
    try:
        async with serve_gateway(settings, limiter=limiter) as gw:
            admission = WatchedAdmission(limit=8)
            gw.gateway.pipeline.admission = admission
            binding = ServiceBinding(
                name="llmesh.v1.ChatService",
                add=chat_pb2_grpc.add_ChatServiceServicer_to_server,
                servicer=ChatServicer(gw.gateway),
            )
            chat_server = await build_server(ServiceSettings(port=0), [binding])
            yield Rig(gw, fake, admission, chat_server.address, limiter)
            fake.hold.set()  # type: ignore[union-attr]
    finally:
        if chat_server is not None:
            await chat_server.stop(0)
        await server.stop(0)


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    async with _rig(None) as running:
        yield running


@pytest.fixture
async def refusing_rig() -> AsyncIterator[Rig]:
    """The same, with a rate limiter that refuses every request after the first."""
    async with _rig(RefuseSecond()) as running:
        yield running


def _chat(text: str, *, stream: bool = True) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "stream": stream}


def _completion(prompts: list[str], *, stream: bool = True) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompts, "stream": stream, "max_tokens": 8}


def _events(text: str) -> list[Any]:
    return [
        json.loads(line[6:])
        for line in text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


async def _hang_up_after_first_chunk(rig: Rig, path: str, body: dict[str, Any]) -> None:
    async with (
        httpx.AsyncClient(base_url=rig.gw.url, timeout=10) as http,
        http.stream("POST", path, json=body, headers=AUTH) as reply,
    ):
        assert reply.status_code == 200
        async for line in reply.aiter_lines():
            if line.startswith("data: "):
                break  # the first chunk arrived (the replica now holds); hang up


# -- the admission itself ----------------------------------------------------------------------


def test_acquire_is_all_or_none_and_release_is_once() -> None:
    admission = Admission(limit=3)
    first, second = admission.acquire(2)
    with pytest.raises(Unavailable) as info:
        admission.acquire(2)  # one is free, two are asked: nothing is taken
    assert info.value.retry_after_s == 1.0
    assert admission.inflight == 2
    first.release()
    first.release()
    assert admission.inflight == 1
    with admission.slot():
        assert admission.inflight == 2
    second.release()
    assert admission.inflight == 0


def test_a_tenant_holds_at_most_its_share_and_the_others_still_get_in() -> None:
    admission = Admission(limit=4, tenant_share=0.5)
    held = admission.acquire(2, tenant="a")
    with pytest.raises(ResourceExhausted) as info:
        admission.acquire(tenant="a")
    assert info.value.retry_after_s == 1.0 and "limit of 2" in info.value.message
    assert admission.inflight == 2 and admission.held_by("a") == 2  # nothing taken
    (other,) = admission.acquire(tenant="b")
    (own,) = admission.acquire(tenant="a", tenant_limit=3)  # a tenant's own bound wins
    assert admission.held_by("a") == 3
    with pytest.raises(Unavailable):
        admission.acquire(tenant="c")  # the gateway is full: 503, whatever the share
    for slot in (*held, other, own):
        slot.release()
    assert admission.inflight == 0 and admission.held_by("a") == 0
    assert Admission(limit=1, tenant_share=0.1).tenant_limit() == 1  # never below one


# -- HTTP: chat ----------------------------------------------------------------------------------


async def test_chat_client_disconnect_mid_stream_returns_the_slot(rig: Rig) -> None:
    await _hang_up_after_first_chunk(rig, "/v1/chat/completions", _chat("a b c"))
    await rig.admission.settled()
    await asyncio.wait_for(rig.fake.cancel_seen.wait(), timeout=10)
    assert rig.admission.peak == 1


async def test_chat_error_before_first_chunk_returns_the_slot(rig: Rig) -> None:
    rig.fake.fail_next = 100
    async with httpx.AsyncClient(base_url=rig.gw.url, timeout=10) as http:
        reply = await http.post("/v1/chat/completions", json=_chat("a b c"), headers=AUTH)
    assert reply.status_code == 200  # the stream had started: the error is its last event
    events = _events(reply.text)
    assert [e["error"]["type"] for e in events] == ["service_unavailable"]
    assert rig.admission.peak == 1
    assert rig.admission.inflight == 0  # the response ends after its stream is closed


async def test_chat_refused_in_preparation_returns_the_slot(rig: Rig) -> None:
    async with httpx.AsyncClient(base_url=rig.gw.url, timeout=10) as http:
        for stream in (True, False):
            body = {**_chat("a"), "model": "no-such-model", "stream": stream}
            reply = await http.post("/v1/chat/completions", json=body, headers=AUTH)
            assert reply.status_code == 404
    assert rig.admission.peak == 1
    assert rig.admission.inflight == 0


async def test_chat_at_capacity_is_503_and_the_slot_comes_back(rig: Rig) -> None:
    rig.admission.limit = 1
    async with httpx.AsyncClient(base_url=rig.gw.url, timeout=10) as http:
        async with http.stream("POST", "/v1/chat/completions", json=_chat("a b"), headers=AUTH) as held:
            lines = held.aiter_lines()
            async for line in lines:
                if line.startswith("data: "):
                    break  # holds the only slot now
            full = await http.post("/v1/chat/completions", json=_chat("c", stream=False), headers=AUTH)
            assert full.status_code == 503
            assert full.headers["retry-after"] == "1"
            assert full.json()["error"]["type"] == "service_unavailable"
            assert "at capacity" in full.json()["error"]["message"]
            rig.fake.hold.set()  # type: ignore[union-attr]
            assert "data: [DONE]" in [line async for line in lines]
        assert rig.admission.inflight == 0  # the response ends after its stream is closed
        ok = await http.post("/v1/chat/completions", json=_chat("c", stream=False), headers=AUTH)
        assert ok.status_code == 200
    assert rig.admission.inflight == 0


# -- HTTP: completions, one prompt and a batch -------------------------------------------------


@pytest.mark.parametrize("prompts", [["a b"], ["a b", "c d", "e f"]])
async def test_completions_client_disconnect_mid_stream_returns_every_slot(
    rig: Rig, prompts: list[str]
) -> None:
    await _hang_up_after_first_chunk(rig, "/v1/completions", _completion(prompts))
    await rig.admission.settled()
    assert rig.admission.peak == len(prompts)


@pytest.mark.parametrize("prompts", [["a b"], ["a b", "c d", "e f"]])
async def test_completions_error_before_first_chunk_returns_every_slot(rig: Rig, prompts: list[str]) -> None:
    rig.fake.fail_next = 100
    async with httpx.AsyncClient(base_url=rig.gw.url, timeout=10) as http:
        reply = await http.post("/v1/completions", json=_completion(prompts), headers=AUTH)
    assert reply.status_code == 200
    assert [e["error"]["type"] for e in _events(reply.text)] == ["service_unavailable"]
    await rig.admission.settled()  # the other prompts' streams stop after the first error
    assert rig.admission.peak == len(prompts)


async def test_completions_batch_answers_hold_one_slot_per_prompt(rig: Rig) -> None:
    rig.fake.hold.set()  # type: ignore[union-attr]
    async with httpx.AsyncClient(base_url=rig.gw.url, timeout=10) as http:
        whole = await http.post("/v1/completions", json=_completion(["a", "b"], stream=False), headers=AUTH)
        assert whole.status_code == 200
        assert [c["text"] for c in whole.json()["choices"]] == ["echo: a", "echo: b"]
        assert rig.admission.inflight == 0
        rig.fake.fail_next = 100
        failed = await http.post("/v1/completions", json=_completion(["a", "b"], stream=False), headers=AUTH)
        assert failed.status_code == 503
        assert rig.admission.inflight == 0
        rig.admission.limit = 1
        full = await http.post("/v1/completions", json=_completion(["a", "b"]), headers=AUTH)
        assert full.status_code == 503  # a batch is admitted whole or not at all
    assert rig.admission.peak == 2
    assert rig.admission.inflight == 0


@pytest.mark.parametrize("stream", [True, False])
async def test_completions_later_prompt_refused_returns_every_slot(refusing_rig: Rig, stream: bool) -> None:
    rig = refusing_rig
    async with httpx.AsyncClient(base_url=rig.gw.url, timeout=10) as http:
        reply = await http.post(
            "/v1/completions", json=_completion(["a", "b", "c"], stream=stream), headers=AUTH
        )
    assert reply.status_code == 429  # the first prompt was prepared, the second refused
    assert rig.limiter is not None and rig.limiter.admitted == 2
    assert rig.admission.peak == 3
    assert rig.admission.inflight == 0
    assert rig.fake.calls == []  # nothing was generated


# -- the pipeline's streams: cancelled, never started, never sent ------------------------------


async def test_cancelled_stream_returns_the_slot(rig: Rig) -> None:
    pipeline = rig.gw.gateway.pipeline
    prepared = await pipeline.prepare(
        chat_pb2.CompleteRequest(model=MODEL, prompt="a b c"), await rig.principal()
    )
    first = asyncio.Event()

    async def consume() -> None:
        async for _ in pipeline.stream(prepared):
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), timeout=10)  # the replica now holds the stream
    assert rig.admission.inflight == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert rig.admission.inflight == 0
    await asyncio.wait_for(rig.fake.cancel_seen.wait(), timeout=10)


async def test_stream_never_started_returns_the_slot_when_closed(rig: Rig) -> None:
    pipeline = rig.gw.gateway.pipeline
    prepared = await pipeline.prepare(
        chat_pb2.CompleteRequest(model=MODEL, prompt="a"), await rig.principal()
    )
    async with pipeline.stream(prepared):
        assert rig.admission.inflight == 1
    assert rig.admission.inflight == 0
    assert rig.fake.calls == []


@pytest.mark.parametrize("spec_version", ["2.3", "2.4"])
async def test_client_gone_before_the_response_started_returns_the_slot(rig: Rig, spec_version: str) -> None:
    """The SSE response closes the pipeline's stream even when its body never ran."""
    pipeline = rig.gw.gateway.pipeline
    principal = await rig.principal()
    prepared = await pipeline.prepare(chat_pb2.CompleteRequest(model=MODEL, prompt="a"), principal)
    call = Call(rig.gw.gateway, principal, rc.new_context())
    response = await sse_response(call, [pipeline.stream(prepared)], lambda message, last: [])
    assert rig.admission.inflight == 1

    async def gone() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        if spec_version == "2.4":
            raise OSError("connection reset")  # how an ASGI 2.4 server says the client is gone

    scope = {"type": "http", "asgi": {"spec_version": spec_version}}
    if spec_version == "2.4":
        with pytest.raises(ClientDisconnect):
            await response(scope, gone, send)
        assert rig.fake.calls == []  # the body never ran
    else:
        await response(scope, gone, send)  # the disconnect cancels the body wherever it is
    assert rig.admission.inflight == 0


# -- gRPC ChatService ----------------------------------------------------------------------------


def _grpc_request(text: str) -> chat_pb2.CompleteRequest:
    return chat_pb2.CompleteRequest(
        model=MODEL, messages=[common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=text)]
    )


def _grpc_stream_request(text: str) -> chat_pb2.CompleteStreamRequest:
    return twins.convert(_grpc_request(text), chat_pb2.CompleteStreamRequest)


async def test_grpc_cancelled_stream_returns_the_slot(rig: Rig) -> None:
    async with grpc.aio.insecure_channel(rig.grpc_address) as channel:
        stub = chat_pb2_grpc.ChatServiceStub(channel)
        call = stub.CompleteStream(_grpc_stream_request("a b c"), metadata=GRPC_AUTH)
        first = await call.read()
        assert isinstance(first, chat_pb2.CompleteStreamResponse)
        assert first.deltas[0].text == "echo:"
        call.cancel()
        await rig.admission.settled()
        await asyncio.wait_for(rig.fake.cancel_seen.wait(), timeout=10)
    assert rig.admission.peak == 1


async def test_grpc_error_before_first_message_returns_the_slot(rig: Rig) -> None:
    rig.fake.fail_next = 100
    async with grpc.aio.insecure_channel(rig.grpc_address) as channel:
        stub = chat_pb2_grpc.ChatServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            _ = [m async for m in stub.CompleteStream(_grpc_stream_request("a"), metadata=GRPC_AUTH)]
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert rig.admission.inflight == 0  # the call ends after its stream is closed
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Complete(_grpc_request("a"), metadata=GRPC_AUTH)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert rig.admission.peak == 1
    assert rig.admission.inflight == 0


async def test_grpc_answers_and_capacity(rig: Rig) -> None:
    rig.fake.hold.set()  # type: ignore[union-attr]
    async with grpc.aio.insecure_channel(rig.grpc_address) as channel:
        stub = chat_pb2_grpc.ChatServiceStub(channel)
        reply = await stub.Complete(_grpc_request("hi"), metadata=GRPC_AUTH)
        assert reply.choices[0].text == "echo: hi"
        parts = [m async for m in stub.CompleteStream(_grpc_stream_request("hi"), metadata=GRPC_AUTH)]
        assert parts[-1].usage.completion_tokens == 2
        assert rig.admission.inflight == 0
        rig.admission.limit = 0
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Complete(_grpc_request("hi"), metadata=GRPC_AUTH)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "at capacity" in (info.value.details() or "")
    assert rig.admission.inflight == 0
