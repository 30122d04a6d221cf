"""OpenTelemetry: calls that cross a ``quic://`` link say so on the current span.

``llmesh.transport`` = ``quic`` and ``llmesh.quic.peer`` = the upstream URL are set on the span that
is current when the call starts (the caller's stage span; the client side has no span of its own).
One interceptor class per call type, as grpc.aio requires.
"""

from __future__ import annotations

from typing import Any

import grpc
from opentelemetry import trace

TRANSPORT_ATTRIBUTE = "llmesh.transport"
PEER_ATTRIBUTE = "llmesh.quic.peer"


class _Mark:
    def __init__(self, peer: str) -> None:
        self._peer = peer

    def _mark(self) -> None:
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attribute(TRANSPORT_ATTRIBUTE, "quic")
            span.set_attribute(PEER_ATTRIBUTE, self._peer)


class _UnaryUnary(_Mark, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        self._mark()
        return await continuation(client_call_details, request)


class _UnaryStream(_Mark, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        self._mark()
        return await continuation(client_call_details, request)


class _StreamUnary(_Mark, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        self._mark()
        return await continuation(client_call_details, request_iterator)


class _StreamStream(_Mark, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        self._mark()
        return await continuation(client_call_details, request_iterator)


def transport_interceptors(quic_url: str) -> list[grpc.aio.ClientInterceptor]:
    """Interceptors for a channel to ``quic_url`` that mark the current span."""
    return [_UnaryUnary(quic_url), _UnaryStream(quic_url), _StreamUnary(quic_url), _StreamStream(quic_url)]
