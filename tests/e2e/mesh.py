"""The whole mesh for end-to-end tests: the session's real inference engine and embedding
service, real cache and policy services (in-process, real Redis), and the gateway's HTTP
API (uvicorn) and gRPC ChatService, all on free ports."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from llmesh.v1 import chat_pb2_grpc, inference_pb2_grpc

from cache.app import create as create_cache
from cache.config import CacheSettings
from gateway.auth import hash_key
from gateway.config import GatewaySettings, TenantSettings
from gateway.servicer import ChatServicer
from policy.app import create as create_policy
from policy.config import DEFAULT_RULESET, PolicySettings
from services.runtime.channels import connect
from services.runtime.server import RunningServer, ServiceBinding, build_server
from services.runtime.settings import ServiceSettings
from tests.fixtures.fake_inference import inference_binding, serve_streams
from tests.fixtures.gateway import RunningGateway, serve_gateway

# Tenants: "main" for most tests, "strict" with an extra output rule (mid-stream block).
KEYS = {"main": "sk-e2e-main", "strict": "sk-e2e-strict"}
STRICT_RULES = """
tenants:
  e2e-strict:
    rules:
      - id: no-paris
        detector: keyword
        scope: output
        action: block
        message: Paris may not be named.
        options: {keywords: [Paris]}
"""


@dataclass
class Mesh:
    gateway: RunningGateway
    chat_address: str
    cache_address: str
    embeddings_address: str
    proxy: ProxyReplica


class ProxyReplica:
    """A second inference replica in front of the same engine (one engine per test run):
    a gRPC server forwarding InferenceService calls. Stopping it is a replica dying."""

    def __init__(self, upstream: str) -> None:
        self._upstream = upstream
        self.server: RunningServer | None = None
        self.calls = 0
        # N: the proxy dies (stops, cancelling every call) once a stream has forwarded N messages
        # with text: a replica dying mid-stream, at a known point of the stream.
        self.die_after: int | None = None
        self._dying: asyncio.Task[None] | None = None

    async def start(self) -> str:
        channel = await connect(self._upstream)
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        proxy = self

        class Forward(inference_pb2_grpc.InferenceServiceServicer):
            async def Generate(self, request: Any, context: Any) -> Any:
                proxy.calls += 1
                return await stub.Generate(request)

            async def GenerateStream(self, request: Any, context: Any) -> Any:
                proxy.calls += 1
                texts = 0
                async for message in stub.GenerateStream(request):
                    yield message
                    texts += any(d.text for d in message.deltas)
                    if proxy.die_after is not None and texts >= proxy.die_after:
                        proxy._dying = asyncio.ensure_future(proxy.stop())
                        await asyncio.Event().wait()  # the stop cancels this call

            async def GenerateStreams(self, request_iterator: Any, context: Any) -> Any:
                async for reply in serve_streams(
                    request_iterator, lambda start: self.GenerateStream(start, context)
                ):
                    yield reply

            async def GetModelInfo(self, request: Any, context: Any) -> Any:
                return await stub.GetModelInfo(request)

            async def Tokenize(self, request: Any, context: Any) -> Any:
                return await stub.Tokenize(request)

            async def WatchPrefixes(self, request: Any, context: Any) -> Any:
                # Like a replica from before WatchPrefixes: the gateway routes without its reports.
                await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
                yield  # pragma: no cover (a generator, as a stream handler is)

        self._channel = channel
        self.server = await build_server(ServiceSettings(port=0), [inference_binding(Forward())])
        return self.server.address

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)
            self.server = None

    async def close(self) -> None:
        if self._dying is not None:
            await self._dying
        await self.stop()
        await self._channel.close()


@contextlib.asynccontextmanager
async def start_mesh(
    redis_url: str, inference_address: str, embeddings_address: str, tmp: Path
) -> AsyncIterator[Mesh]:
    async with contextlib.AsyncExitStack() as stack:
        cache_settings = CacheSettings(
            port=0,
            redis_url=redis_url,
            embeddings_address=embeddings_address,
            inference_address=inference_address,
        )
        cache = await create_cache(cache_settings)
        cache_server = await build_server(cache_settings, [cache.binding()])
        await cache.start(cache_server)
        stack.push_async_callback(cache.close)
        stack.push_async_callback(cache_server.stop, 0)

        rules = tmp / "rules.yaml"
        rules.write_text(DEFAULT_RULESET.read_text().replace("tenants: {}", "") + STRICT_RULES)
        policy_settings = PolicySettings(port=0, redis_url=redis_url, ruleset_path=rules)
        policy = await create_policy(policy_settings)
        policy_server = await build_server(policy_settings, [policy.binding()])
        await policy.start(policy_server)
        stack.push_async_callback(policy.close)
        stack.push_async_callback(policy_server.stop, 0)

        proxy = ProxyReplica(inference_address)
        proxy_address = await proxy.start()
        stack.push_async_callback(proxy.close)

        settings = GatewaySettings(
            inference_addresses=[inference_address, proxy_address],
            policy_address=policy_server.address,
            cache_address=cache_server.address,
            embeddings_address=embeddings_address,
            api_keys={hash_key(KEYS["main"]): "e2e-main", hash_key(KEYS["strict"]): "e2e-strict"},
            tenants={"e2e-main": TenantSettings(), "e2e-strict": TenantSettings()},
        )
        gateway = await stack.enter_async_context(serve_gateway(settings))
        chat_server = await build_server(
            ServiceSettings(port=0),
            [
                ServiceBinding(
                    name="llmesh.v1.ChatService",
                    add=chat_pb2_grpc.add_ChatServiceServicer_to_server,
                    servicer=ChatServicer(gateway.gateway),
                )
            ],
        )
        stack.push_async_callback(chat_server.stop, 0)
        yield Mesh(gateway, chat_server.address, cache_server.address, embeddings_address, proxy)


async def tenant_channel(address: str) -> grpc.aio.Channel:
    return await connect(address)
