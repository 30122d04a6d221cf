"""A test-only service that relays each call to the next hop (raw JSON bytes over generic handlers).

The last hop answers with what it saw of the request context, optionally
produces a version, sleeps (deadline tests) or raises (error-table tests).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
from llmesh.v1.common_pb2 import VersionStamp
from opentelemetry import trace

from services.runtime import authz, errors
from services.runtime import context as rc
from services.runtime.channels import connect
from services.runtime.server import ServiceBinding

SERVICE = "llmesh.test.Chain"
CALL = f"/{SERVICE}/Call"
STREAM = f"/{SERVICE}/Stream"
BIDI = f"/{SERVICE}/Bidi"
TYPED = f"/{SERVICE}/Typed"
TYPED_STREAM = f"/{SERVICE}/TypedStream"

ERRORS: dict[str, type[errors.LlmeshError]] = {
    cls.__name__: cls
    for cls in (
        errors.InvalidArgument,
        errors.NotFound,
        errors.AlreadyExists,
        errors.Aborted,
        errors.FailedPrecondition,
        errors.ResourceExhausted,
        errors.Unavailable,
        errors.DeadlineExceeded,
        errors.PermissionDenied,
        errors.Unauthenticated,
    )
}


def _identity(b: bytes) -> bytes:
    return b


class ChainServicer:
    def __init__(self, hop: int, next_address: str | None) -> None:
        self.hop = hop
        self.next_address = next_address
        self._channel: grpc.aio.Channel | None = None

    async def _next(self) -> grpc.aio.Channel:
        if self._channel is None:
            assert self.next_address
            self._channel = await connect(self.next_address)
        return self._channel

    def _view(self) -> dict[str, Any]:
        ctx = rc.current()
        span = trace.get_current_span().get_span_context()
        return {
            "hop": self.hop,
            "request_id": ctx.request_id,
            "tenant": ctx.tenant,
            "remaining": ctx.time_remaining(),
            "floors": ctx.floors,
            "max_age_ms": ctx.max_age_ms,
            "no_store": ctx.no_store,
            "semantic": ctx.semantic,
            "trace_id": f"{span.trace_id:032x}",
        }

    async def _leaf(self, req: dict[str, Any]) -> None:
        ctx = rc.current()
        for namespace, version in req.get("produce", {}).items():
            ctx.observe(namespace, version)
        if req.get("status"):
            ctx.set_cache_status(req["status"], req.get("age_ms"))
        if req.get("sleep"):
            await asyncio.sleep(req["sleep"])
        if req.get("raise"):
            name = req["raise"]
            if name in ERRORS:
                raise ERRORS[name](f"{name} from hop {self.hop}", retry_after_s=req.get("retry_after"))
            raise RuntimeError("secret internal detail /etc/passwd")

    async def call(self, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        req = json.loads(request)
        mine = self._view()  # taken on arrival, so the deadline each hop saw can be compared
        if self.next_address and req.get("hops", 99) > self.hop:
            await asyncio.sleep(req.get("relay_delay", 0))
            channel = await self._next()
            answer = json.loads(await channel.unary_unary(CALL, _identity, _identity)(request))
        else:
            await self._leaf(req)
            answer = {"views": []}
        answer["views"].insert(0, mine)
        return json.dumps(answer).encode()

    async def stream(
        self, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        req = json.loads(request)
        mine = self._view()
        if self.next_address:
            await asyncio.sleep(req.get("relay_delay", 0))
            channel = await self._next()
            async for item in channel.unary_stream(STREAM, _identity, _identity)(request):
                view = json.loads(item)
                view["views"].insert(0, mine)
                yield json.dumps(view).encode()
            return
        await self._leaf(req)
        for i in range(req.get("count", 3)):
            if req.get("interval"):
                await asyncio.sleep(req["interval"])
            yield json.dumps({"i": i, "views": [mine]}).encode()

    async def bidi(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        """Echoes each message with the hop views; the leaf produces a version per message."""
        mine = self._view()
        if self.next_address:
            channel = await self._next()
            async for item in channel.stream_stream(BIDI, _identity, _identity)(requests):
                view = json.loads(item)
                view["views"].insert(0, mine)
                yield json.dumps(view).encode()
            return
        async for raw in requests:
            req = json.loads(raw)
            rc.current().observe("bidi", req["n"])
            yield json.dumps({"n": req["n"], "views": [mine]}).encode()

    async def typed(
        self, request: VersionStamp, context: grpc.aio.ServicerContext[VersionStamp, VersionStamp]
    ) -> VersionStamp:
        return VersionStamp(namespace=request.namespace, version=request.version + 1)

    async def typed_stream(
        self,
        requests: AsyncIterator[VersionStamp],
        context: grpc.aio.ServicerContext[VersionStamp, VersionStamp],
    ) -> AsyncIterator[VersionStamp]:
        async for request in requests:
            yield VersionStamp(namespace=request.namespace, version=request.version + 1)

    def binding(self) -> ServiceBinding:
        handler = grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Call": grpc.unary_unary_rpc_method_handler(self.call, _identity, _identity),
                "Stream": grpc.unary_stream_rpc_method_handler(self.stream, _identity, _identity),
                "Bidi": grpc.stream_stream_rpc_method_handler(self.bidi, _identity, _identity),
                "Typed": grpc.unary_unary_rpc_method_handler(
                    self.typed, VersionStamp.FromString, VersionStamp.SerializeToString
                ),
                "TypedStream": grpc.stream_stream_rpc_method_handler(
                    self.typed_stream, VersionStamp.FromString, VersionStamp.SerializeToString
                ),
            },
        )
        return ServiceBinding(
            name=SERVICE,
            add=lambda _servicer, server: server.add_generic_rpc_handlers((handler,)),
            servicer=self,
            reflect=False,
            # Under mTLS the test PKI's gateway and cache identities may call every method.
            access={
                name: authz.allow(authz.GATEWAY, authz.CACHE)
                for name in ("Call", "Stream", "Bidi", "Typed", "TypedStream")
            },
        )


if __name__ == "__main__":
    import sys

    from services.runtime.settings import ServiceSettings
    from tests.fixtures.bound_service import serve_binding

    next_address = sys.argv[1] if len(sys.argv) > 1 else None
    serve_binding(ServiceSettings(port=0, grace_seconds=10), ChainServicer(1, next_address).binding())
