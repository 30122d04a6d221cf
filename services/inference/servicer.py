"""gRPC InferenceService: proto in, engine call, proto out."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc
from llmesh.v1 import inference_pb2, inference_pb2_grpc

from services.inference import convert
from services.inference.engine import InferenceEngine
from services.inference.streams import StreamSet, serve
from services.runtime.build_info import build_info
from services.runtime.server import ServiceBinding

SERVICE_NAME = "llmesh.v1.InferenceService"


class InferenceServicer(inference_pb2_grpc.InferenceServiceServicer):
    """Generate, GenerateStream(s), Tokenize, GetModelInfo and WatchPrefixes over one engine."""

    def __init__(self, engine: InferenceEngine, max_streams_per_call: int = 4096) -> None:
        self._engine = engine
        self._max_streams_per_call = max_streams_per_call

    async def Generate(
        self,
        request: inference_pb2.GenerateRequest,
        context: grpc.aio.ServicerContext[inference_pb2.GenerateRequest, inference_pb2.GenerateResponse],
    ) -> inference_pb2.GenerateResponse:
        """Generates the whole answer and returns it at once."""
        result = await self._engine.generate(convert.generate_from_pb(request))
        return convert.generate_to_pb(result)

    async def GenerateStream(
        self,
        request: inference_pb2.GenerateStreamRequest,
        context: grpc.aio.ServicerContext[
            inference_pb2.GenerateStreamRequest, inference_pb2.GenerateStreamResponse
        ],
    ) -> AsyncIterator[inference_pb2.GenerateStreamResponse]:
        """Streams one message per engine step; the last one carries usage and timings."""
        stream = self._engine.generate_stream(convert.generate_from_pb(request))
        async with contextlib.aclosing(stream):  # type: ignore[type-var]
            async for chunk in stream:
                yield convert.chunk_to_pb(chunk)

    async def GenerateStreams(
        self,
        request_iterator: AsyncIterator[inference_pb2.GenerateStreamsRequest],
        context: grpc.aio.ServicerContext[
            inference_pb2.GenerateStreamsRequest, inference_pb2.GenerateStreamsResponse
        ],
    ) -> AsyncIterator[inference_pb2.GenerateStreamsResponse]:
        """Many streams over one call: what they produced in one loop turn, in one message."""
        streams = StreamSet(self._engine.generate_stream, self._max_streams_per_call)
        async for parts in serve(request_iterator, streams, convert.stream_orders_from_pb):
            yield convert.stream_parts_to_pb(parts)

    async def Tokenize(
        self,
        request: inference_pb2.TokenizeRequest,
        context: grpc.aio.ServicerContext[inference_pb2.TokenizeRequest, inference_pb2.TokenizeResponse],
    ) -> inference_pb2.TokenizeResponse:
        """Counts the tokens of a prompt or of chat messages rendered by the chat template."""
        return convert.tokenize_to_pb(await self._engine.tokenize(convert.tokenize_from_pb(request)))

    async def GetModelInfo(
        self,
        request: inference_pb2.GetModelInfoRequest,
        context: grpc.aio.ServicerContext[
            inference_pb2.GetModelInfoRequest, inference_pb2.GetModelInfoResponse
        ],
    ) -> inference_pb2.GetModelInfoResponse:
        """Describes the served model and its current load."""
        return convert.model_info_to_pb(self._engine.model_info(request.model), build_info())

    async def WatchPrefixes(
        self,
        request: inference_pb2.WatchPrefixesRequest,
        context: grpc.aio.ServicerContext[
            inference_pb2.WatchPrefixesRequest, inference_pb2.WatchPrefixesResponse
        ],
    ) -> AsyncIterator[inference_pb2.WatchPrefixesResponse]:
        """The prefixes this replica's KV cache holds: a snapshot, then changes."""
        updates = self._engine.watch_prefixes()
        async with contextlib.aclosing(updates):  # type: ignore[type-var]
            async for update in updates:
                yield convert.prefixes_to_pb(update)


def binding(engine: InferenceEngine, max_streams_per_call: int = 4096) -> ServiceBinding:
    return ServiceBinding(
        name=SERVICE_NAME,
        add=inference_pb2_grpc.add_InferenceServiceServicer_to_server,
        servicer=InferenceServicer(engine, max_streams_per_call),
    )
