"""Limits before work at the gateway (issue 14), on the real gateway over HTTP.

* authentication comes before the body: no key means 401 whatever the body, and nothing of a
  chunked upload is read past what the sockets buffer;
* the body limit counts bytes as they arrive: 413 for a chunked upload too, without reading it all;
* one tenant cannot take every admission slot: past its share it gets 429 while another is served;
* a request naming a collection the tenant does not have is refused before any Redis key is made
  (the real cache and embeddings services on the test Redis);
* an open gateway (no API key) refuses to start beyond loopback unless told so
  (``python -m gateway`` in a process of its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from llmesh.v1 import embeddings_pb2, embeddings_pb2_grpc

from cache.app import create as create_cache
from cache.config import CacheSettings
from gateway.auth import hash_key
from gateway.config import GatewaySettings
from services.runtime.server import RunningServer, build_server
from tests.fixtures.fake_inference import MODEL, FakeInference, start_fake
from tests.fixtures.gateway import RunningGateway, serve_gateway
from tests.fixtures.ports import free_port
from tests.fixtures.processes import ServiceProcess, service_env

BODY_LIMIT = 64 * 1024
UPLOAD = 50 * 1024 * 1024
CHUNK = 64 * 1024


@dataclass
class Tenant:
    name: str
    key: str

    @property
    def auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.key}"}


def _tenant() -> Tenant:
    # Fresh names per test: nothing in Redis is shared with another test or run.
    suffix = uuid.uuid4().hex[:10]
    return Tenant(f"t-{suffix}", f"sk-{suffix}")


def _chat(text: str, *, stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "stream": stream, **extra}


class CountedUpload:
    """A chunked request body of ``UPLOAD`` bytes that counts how much the client was asked for."""

    def __init__(self, chunk: bytes = b"x" * CHUNK) -> None:
        self.chunk = chunk
        self.sent = 0

    def __iter__(self) -> Iterator[bytes]:
        while self.sent < UPLOAD:
            self.sent += len(self.chunk)
            yield self.chunk


async def _upload(url: str, body: CountedUpload, headers: dict[str, str]) -> httpx.Response:
    """POSTs ``body`` chunked. The blocking client, in a thread: it reads the answer after a write
    fails (the server closed the connection), where the asyncio transport drops what it had."""

    def post() -> httpx.Response:
        with httpx.Client(base_url=url, timeout=60) as http:
            return http.post("/v1/chat/completions", content=body, headers=headers)

    return await asyncio.to_thread(post)


@pytest_asyncio.fixture
async def fake() -> AsyncIterator[tuple[FakeInference, RunningServer]]:
    # Streams stop after their first word until released: a held stream keeps its slot.
    replica = FakeInference("r1", hold=asyncio.Event())
    server = await start_fake(replica)
    try:
        yield replica, server
    finally:
        assert replica.hold is not None
        replica.hold.set()
        await server.stop(0)


@dataclass
class Rig:
    gw: RunningGateway
    fake: FakeInference
    a: Tenant
    b: Tenant


@pytest_asyncio.fixture
async def rig(fake: tuple[FakeInference, RunningServer]) -> AsyncIterator[Rig]:
    replica, server = fake
    a, b = _tenant(), _tenant()
    settings = GatewaySettings(
        inference_addresses=[server.address],
        api_keys={hash_key(a.key): a.name, hash_key(b.key): b.name},
        max_inflight=4,
        tenant_max_inflight_share=0.5,
        max_body_bytes=BODY_LIMIT,
    )
    async with serve_gateway(settings) as gw:
        yield Rig(gw, replica, a, b)


def _error(reply: httpx.Response) -> dict[str, Any]:
    body = reply.json()
    assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(body["error"])
    error: dict[str, Any] = body["error"]
    return error


# -- authentication before the body ----------------------------------------------------------------


async def test_no_key_with_a_malformed_body_is_401_not_400(rig: Rig) -> None:
    async with httpx.AsyncClient(base_url=rig.gw.url, timeout=30) as http:
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
            reply = await http.post(path, content=b"{not json", headers={"content-type": "application/json"})
            assert reply.status_code == 401, (path, reply.text)
            assert _error(reply)["type"] == "authentication_error"
        nope = {"authorization": "Bearer nope"}
        wrong = await http.post("/v1/chat/completions", content=b"{", headers=nope)
        assert wrong.status_code == 401 and _error(wrong)["message"] == "invalid API key"
        # With a key the same body is what is wrong.
        keyed = await http.post("/v1/chat/completions", content=b"{not json", headers=rig.a.auth)
        assert keyed.status_code == 400


async def test_no_key_chunked_upload_is_refused_without_being_read(rig: Rig) -> None:
    upload = CountedUpload(b"{" * CHUNK)  # never valid JSON: read whole, it would be a 400
    reply = await _upload(rig.gw.url, upload, {})
    assert reply.status_code == 401, reply.text
    assert _error(reply)["type"] == "authentication_error"
    # The client stops being asked for bytes once the sockets' buffers are full (a few MiB).
    assert upload.sent < UPLOAD // 2


# -- the body limit counts what arrives --------------------------------------------------------------


async def test_chunked_upload_over_the_limit_is_413_without_reading_it_all(rig: Rig) -> None:
    upload = CountedUpload()
    reply = await _upload(rig.gw.url, upload, rig.a.auth)
    assert reply.status_code == 413, reply.text
    error = _error(reply)
    assert error["type"] == "invalid_request_error" and error["code"] == "request_too_large"
    assert str(BODY_LIMIT) in error["message"]
    assert reply.headers["connection"] == "close"
    assert upload.sent < UPLOAD // 2


async def test_declared_length_over_the_limit_is_413_and_a_body_at_the_limit_is_read(rig: Rig) -> None:
    async with httpx.AsyncClient(base_url=rig.gw.url, timeout=60) as http:
        big = await http.post("/v1/chat/completions", content=b"x" * (BODY_LIMIT + 1), headers=rig.a.auth)
        assert big.status_code == 413 and _error(big)["code"] == "request_too_large"
        assert rig.fake.hold is not None
        rig.fake.hold.set()
        request = _chat("hi")
        request["messages"].insert(0, {"role": "user", "content": ""})
        empty = len(httpx.Request("POST", "/", json=request).content)
        request["messages"][0]["content"] = "p" * (BODY_LIMIT - empty)
        body = httpx.Request("POST", "/", json=request).content
        assert len(body) == BODY_LIMIT
        ok = await http.post(
            "/v1/chat/completions",
            content=body,
            headers={**rig.a.auth, "content-type": "application/json"},
        )
        assert ok.status_code == 200, ok.text
        assert ok.json()["choices"][0]["message"]["content"] == "echo: hi"


# -- per-tenant share of admission -----------------------------------------------------------------


async def test_a_tenant_past_its_share_gets_429_while_another_is_served(rig: Rig) -> None:
    async with contextlib.AsyncExitStack() as stack:
        http = await stack.enter_async_context(httpx.AsyncClient(base_url=rig.gw.url, timeout=30))
        # max_inflight 4, share 0.5: tenant A may hold 2. Two held streams fill its share.
        # An iterator left to the garbage collector would close its response: keep them.
        readers = []
        for i in range(2):
            body = _chat(f"a{i} b", stream=True)
            held = await stack.enter_async_context(
                http.stream("POST", "/v1/chat/completions", json=body, headers=rig.a.auth)
            )
            assert held.status_code == 200
            readers.append(held.aiter_lines())
            async for line in readers[-1]:
                if line.startswith("data: "):
                    break  # the replica holds this stream now, and the gateway its slot
        admission = rig.gw.gateway.pipeline.admission
        assert (admission.inflight, admission.held_by(rig.a.name)) == (2, 2)
        third = await http.post("/v1/chat/completions", json=_chat("a2"), headers=rig.a.auth)
        assert third.status_code == 429, third.text
        assert third.headers["retry-after"] == "1"
        error = _error(third)
        assert error["type"] == "rate_limit_error" and "limit of 2 requests in flight" in error["message"]
        other = await http.post("/v1/chat/completions", json=_chat("b0"), headers=rig.b.auth)
        assert other.status_code == 200, other.text
        assert other.json()["choices"][0]["message"]["content"] == "echo: b0"
        assert rig.fake.hold is not None
        rig.fake.hold.set()
        for reader in readers:
            assert "data: [DONE]" in [line async for line in reader]
    assert (admission.inflight, admission.held_by(rig.a.name)) == (0, 0)


# -- RAG scopes validated before any key -------------------------------------------------------------


@pytest_asyncio.fixture
async def cache_address(redis_url: str) -> AsyncIterator[str]:
    settings = CacheSettings(port=0, redis_url=redis_url, semantic_enabled=False)
    cache = await create_cache(settings)
    server = await build_server(settings, [cache.binding()])
    await cache.start(server)
    try:
        yield server.address
    finally:
        await server.stop(0)
        await cache.close()


async def test_unknown_rag_collection_is_404_before_any_redis_key(
    fake: tuple[FakeInference, RunningServer], cache_address: str, embeddings_address: str, redis_url: str
) -> None:
    replica, server = fake
    assert replica.hold is not None
    replica.hold.set()
    tenant = _tenant()
    settings = GatewaySettings(
        inference_addresses=[server.address],
        cache_address=cache_address,
        embeddings_address=embeddings_address,
        api_keys={hash_key(tenant.key): tenant.name},
    )
    invented = f"invented-{uuid.uuid4().hex}"
    real = f"handbook-{uuid.uuid4().hex[:8]}"
    redis: Any = aioredis.Redis.from_url(redis_url)
    try:
        async with serve_gateway(settings) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            for stream in (False, True):
                reply = await http.post(
                    "/v1/chat/completions",
                    # Greedy: a cacheable request, which the cache would elect a producer for.
                    json=_chat("hi", stream=stream, temperature=0, rag={"collections": [invented]}),
                    headers=tenant.auth,
                )
                assert reply.status_code == 404, reply.text
                assert invented in _error(reply)["message"]
            # Nothing was asked of the cache: no key of this (fresh) tenant exists at all.
            assert [key async for key in redis.scan_iter(match=f"*{tenant.name}*")] == []
            # A collection the tenant does have is searched as before.
            async with embeddings_channel(embeddings_address) as stub:
                await stub.UpsertDocuments(
                    embeddings_pb2.UpsertDocumentsRequest(
                        collection=real,
                        documents=[embeddings_pb2.Document(id="d", text="The office opens at nine.")],
                    ),
                    metadata=(("x-llmesh-tenant", tenant.name),),
                )
            found = await http.post(
                "/v1/chat/completions",
                json=_chat("what did you see?", rag={"collections": [real]}),
                headers=tenant.auth,
            )
            assert found.status_code == 200, found.text
            assert "systems=1" in found.json()["choices"][0]["message"]["content"]
    finally:
        await redis.aclose()


@contextlib.asynccontextmanager
async def embeddings_channel(address: str) -> AsyncIterator[embeddings_pb2_grpc.EmbeddingServiceAsyncStub]:
    async with grpc.aio.insecure_channel(address) as channel:
        yield embeddings_pb2_grpc.EmbeddingServiceStub(channel)


# -- no open gateway by accident ---------------------------------------------------------------------


def _open_gateway_env(**extra: str) -> dict[str, str]:
    return service_env(
        "LLMESH_GATEWAY_",
        LLMESH_GATEWAY_HOST="0.0.0.0",
        LLMESH_GATEWAY_HTTP_HOST="0.0.0.0",
        LLMESH_GATEWAY_HTTP_PORT=str(free_port()),
        # Nothing has to answer there for the process to start.
        LLMESH_GATEWAY_INFERENCE_ADDRESSES=f"127.0.0.1:{free_port()}",
        LLMESH_GATEWAY_API_KEYS="{}",
        **extra,
    )


def test_open_gateway_beyond_loopback_refuses_to_start() -> None:
    with pytest.raises(RuntimeError) as refused:
        ServiceProcess("gateway", _open_gateway_env()).close()
    message = str(refused.value)
    assert "exit code 1" in message, message
    assert "no API keys are configured" in message and "LLMESH_GATEWAY_ALLOW_OPEN=true" in message


def test_open_gateway_beyond_loopback_starts_when_allowed() -> None:
    env = _open_gateway_env(LLMESH_GATEWAY_ALLOW_OPEN="true", LLMESH_TLS_ALLOW_PLAINTEXT="true")
    with ServiceProcess("gateway", env) as gateway:
        assert gateway.alive()
        assert gateway.stop() == 0
