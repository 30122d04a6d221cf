"""A real cache server (real Redis from REDIS_URL, gRPC on port 0) and a small client for tests."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from llmesh.v1 import cache_pb2, cache_pb2_grpc, common_pb2

from cache.app import CacheApp, create
from cache.config import CacheSettings
from cache.embedder import Embedder
from cache.truncation import TokenCounter
from services.runtime.server import RunningServer, build_server


@dataclass
class Served:
    app: CacheApp
    server: RunningServer
    channel: grpc.aio.Channel

    @property
    def stub(self) -> cache_pb2_grpc.ContextCacheServiceAsyncStub:
        return cache_pb2_grpc.ContextCacheServiceStub(self.channel)

    async def close(self) -> None:
        await self.channel.close()
        await self.server.stop(0)
        await self.app.close()


async def serve_cache(
    redis_url: str,
    *,
    embedder: Embedder | None = None,
    counter: TokenCounter | None = None,
    **overrides: Any,
) -> Served:
    # Timeouts above the default: the suite shares two busy cores; a down Redis still fails
    # at once (connection refused), which is what the fault tests look at.
    overrides.setdefault("redis_timeout_s", 3.0)
    overrides.setdefault("redis_connect_timeout_s", 3.0)
    settings = CacheSettings(
        port=0, redis_url=redis_url, embeddings_address="", tokenizer_dir="/nonexistent", **overrides
    )
    app = await create(settings, embedder=embedder, counter=counter)
    server = await build_server(settings, [app.binding()])
    await app.start(server)
    channel = grpc.aio.insecure_channel(server.address)
    return Served(app=app, server=server, channel=channel)


@dataclass
class Client:
    """Calls the cache as one tenant, with floors/max-age/no-store, and keeps the trailers."""

    stub: cache_pb2_grpc.ContextCacheServiceAsyncStub
    tenant: str
    trailers: dict[str, str] = field(default_factory=dict)

    async def call(
        self,
        method: str,
        request: Any,
        *,
        floors: str | None = None,
        max_age_ms: int | None = None,
        no_store: bool = False,
        semantic: bool = False,
        deadline_s: float = 10.0,
    ) -> Any:
        md = [("x-llmesh-tenant", self.tenant)]
        if floors is not None:
            md.append(("x-llmesh-cache-version", floors))
        if max_age_ms is not None:
            md.append(("x-llmesh-max-age", str(max_age_ms)))
        if no_store:
            md.append(("x-llmesh-no-store", "1"))
        if semantic:
            md.append(("x-llmesh-semantic", "on"))
        call = getattr(self.stub, method)(request, metadata=md, timeout=deadline_s)
        reply = await call
        self.trailers = dict(await call.trailing_metadata() or ())
        return reply


def user(text: str) -> common_pb2.ChatMessage:
    return common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=text)


def system(text: str) -> common_pb2.ChatMessage:
    return common_pb2.ChatMessage(role=common_pb2.ROLE_SYSTEM, content=text)


def assistant(text: str, pinned: bool = False) -> common_pb2.ChatMessage:
    return common_pb2.ChatMessage(role=common_pb2.ROLE_ASSISTANT, content=text, pinned=pinned)


def key(
    messages: Sequence[common_pb2.ChatMessage],
    *,
    model: str = "smol",
    temperature: float = 0.0,
    scope: str = "",
) -> cache_pb2.ResponseKey:
    return cache_pb2.ResponseKey(
        model=model,
        model_revision="r1",
        messages=list(messages),
        sampling=common_pb2.SamplingParams(temperature=temperature, max_tokens=64),
        scope=scope,
    )


def answer(text: str, *stamps: tuple[str, int]) -> cache_pb2.CachedResponse:
    return cache_pb2.CachedResponse(
        choices=[common_pb2.Completion(index=0, text=text, finish_reason=common_pb2.FINISH_REASON_STOP)],
        usage=common_pb2.Usage(prompt_tokens=5, completion_tokens=2, total_tokens=7),
        derived_from=[common_pb2.VersionStamp(namespace=ns, version=v) for ns, v in stamps],
        model="smol",
    )


@pytest.fixture(scope="module")
async def served(redis_url: str) -> AsyncIterator[Served]:
    s = await serve_cache(redis_url)
    yield s
    await s.close()


@pytest.fixture
def client(served: Served) -> Client:
    return Client(stub=served.stub, tenant="t-" + uuid.uuid4().hex[:12])
