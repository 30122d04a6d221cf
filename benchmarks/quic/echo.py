"""A tiny raw-bytes gRPC echo service, the load for the QUIC tests and ``llmesh bench quic``.

It needs no .proto (generic handlers, identity serializers), so the transport can be exercised
without any llmesh service. Health and reflection are added by ``start_echo_server`` so grpcurl can
talk to it.

* ``Unary``: returns the request; request metadata ``x-echo`` comes back as initial metadata and
  ``x-echo-trailer`` as trailing metadata.
* ``Stream``: request is ``count:u32 size:u32``; answers ``count`` messages of ``size`` bytes.
* ``Sleep``: request is milliseconds as ASCII; sleeps that long (deadline tests).
* ``Upload``: client streaming; reads nothing until ``release`` is set (backpressure tests), then
  answers the total byte count as ASCII.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

SERVICE = "llmesh.test.Echo"
UNARY = f"/{SERVICE}/Unary"
STREAM = f"/{SERVICE}/Stream"
SLEEP = f"/{SERVICE}/Sleep"
UPLOAD = f"/{SERVICE}/Upload"
MAX_MESSAGE = 16 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.max_send_message_length", MAX_MESSAGE),
]


def _identity(data: bytes) -> bytes:
    return data


def stream_request(count: int, size: int) -> bytes:
    return struct.pack("!II", count, size)


async def _unary(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
    metadata = dict(context.invocation_metadata() or ())
    if "x-echo" in metadata:
        await context.send_initial_metadata((("x-echo", str(metadata["x-echo"])),))
    if "x-echo-trailer" in metadata:
        context.set_trailing_metadata((("x-echo-trailer", str(metadata["x-echo-trailer"])),))
    return request


async def _stream(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[bytes]:
    count, size = struct.unpack("!II", request[:8])
    chunk = bytes(size)
    for _ in range(count):
        yield chunk


# Sleep calls being handled right now (tests wait for a call to reach the handler).
sleeping = 0


async def _sleep(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
    global sleeping
    sleeping += 1
    try:
        await asyncio.sleep(int(request.decode()) / 1000)
    finally:
        sleeping -= 1
    return b"slept"


def echo_handler(release: asyncio.Event | None = None) -> grpc.GenericRpcHandler:
    async def _upload(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        if release is not None:
            await release.wait()
        total = 0
        async for chunk in requests:
            total += len(chunk)
        return str(total).encode()

    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        "Unary": grpc.unary_unary_rpc_method_handler(_unary, _identity, _identity),
        "Stream": grpc.unary_stream_rpc_method_handler(_stream, _identity, _identity),
        "Sleep": grpc.unary_unary_rpc_method_handler(_sleep, _identity, _identity),
        "Upload": grpc.stream_unary_rpc_method_handler(_upload, _identity, _identity),
    }
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


@dataclass
class EchoServer:
    server: grpc.aio.Server
    port: int
    # Set to let Upload handlers start reading; set from the start unless a test holds it.
    release: asyncio.Event

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


async def start_echo_server(host: str = "127.0.0.1", port: int = 0) -> EchoServer:
    """gRPC server with the echo service, health (SERVING) and reflection, on ``host:port``."""
    server = grpc.aio.server(options=CHANNEL_OPTIONS)
    release = asyncio.Event()
    release.set()
    server.add_generic_rpc_handlers((echo_handler(release),))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        (health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server
    )
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    return EchoServer(server, bound, release)


class EchoClient:
    """Typed callables for the echo methods on a channel."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.unary: Callable[..., Any] = channel.unary_unary(
            UNARY, request_serializer=_identity, response_deserializer=_identity
        )
        self.stream: Callable[..., Any] = channel.unary_stream(
            STREAM, request_serializer=_identity, response_deserializer=_identity
        )
        self.sleep: Callable[..., Any] = channel.unary_unary(
            SLEEP, request_serializer=_identity, response_deserializer=_identity
        )
        self.upload: Callable[..., Any] = channel.stream_unary(
            UPLOAD, request_serializer=_identity, response_deserializer=_identity
        )
