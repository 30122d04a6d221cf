"""gRPC InferenceService: proto in, engine call, proto out."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
from llmesh.v1 import inference_pb2, inference_pb2_grpc

from services.inference import convert
from services.inference.engine import InferenceEngine
from services.runtime.server import ServiceBinding

SERVICE_NAME = "llmesh.v1.InferenceService"


class InferenceServicer(inference_pb2_grpc.InferenceServiceServicer):
    """Generate, GenerateStream, Tokenize and GetModelInfo over one engine."""

    def __init__(self, engine: InferenceEngine) -> None:
        self._engine = engine

    async def Generate(
        self, request: inference_pb2.GenerateRequest | convert.Undecodable, context: Any
    ) -> inference_pb2.GenerateResponse:
        """Generates the whole answer and returns it at once."""
        result = await self._engine.generate(convert.generate_from_pb(request))
        return convert.generate_to_pb(result)

    async def GenerateStream(
        self, request: inference_pb2.GenerateRequest | convert.Undecodable, context: Any
    ) -> AsyncIterator[inference_pb2.GenerateStreamResponse]:
        """Streams one message per engine step; the last one carries usage and timings."""
        stream = self._engine.generate_stream(convert.generate_from_pb(request))
        async with contextlib.aclosing(stream):  # type: ignore[type-var]
            async for chunk in stream:
                yield convert.chunk_to_pb(chunk)

    async def Tokenize(
        self, request: inference_pb2.TokenizeRequest | convert.Undecodable, context: Any
    ) -> inference_pb2.TokenizeResponse:
        """Counts the tokens of a prompt or of chat messages rendered by the chat template."""
        return convert.tokenize_to_pb(await self._engine.tokenize(convert.tokenize_from_pb(request)))

    async def GetModelInfo(
        self, request: inference_pb2.GetModelInfoRequest, context: Any
    ) -> inference_pb2.GetModelInfoResponse:
        """Describes the served model and its current load."""
        return convert.model_info_to_pb(self._engine.model_info(request.model))


def add_to_server(servicer: InferenceServicer, server: grpc.aio.Server) -> None:
    """Like the generated ``add_InferenceServiceServicer_to_server``, with lenient request decoding."""
    pb = inference_pb2
    handlers = {
        "Generate": grpc.unary_unary_rpc_method_handler(
            servicer.Generate,
            request_deserializer=convert.lenient(pb.GenerateRequest),
            response_serializer=pb.GenerateResponse.SerializeToString,
        ),
        "GenerateStream": grpc.unary_stream_rpc_method_handler(
            servicer.GenerateStream,
            request_deserializer=convert.lenient(pb.GenerateRequest),
            response_serializer=pb.GenerateStreamResponse.SerializeToString,
        ),
        "Tokenize": grpc.unary_unary_rpc_method_handler(
            servicer.Tokenize,
            request_deserializer=convert.lenient(pb.TokenizeRequest),
            response_serializer=pb.TokenizeResponse.SerializeToString,
        ),
        "GetModelInfo": grpc.unary_unary_rpc_method_handler(
            servicer.GetModelInfo,
            request_deserializer=pb.GetModelInfoRequest.FromString,
            response_serializer=pb.GetModelInfoResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


def binding(engine: InferenceEngine) -> ServiceBinding:
    return ServiceBinding(name=SERVICE_NAME, add=add_to_server, servicer=InferenceServicer(engine))
