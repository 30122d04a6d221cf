"""Embeddings: OpenAI request -> embeddings service -> OpenAI response."""

from __future__ import annotations

from fastapi.responses import Response

from gateway.api.context import response_headers
from gateway.api.deps import Call
from gateway.api.embeddings.protocol import EmbeddingRequest, EmbeddingResponse
from gateway.api.protocol import json_response
from services.runtime.errors import InvalidArgument


async def create_embeddings(body: EmbeddingRequest, call: Call) -> Response:
    reply = await call.gateway.pipeline.embed(body.to_pb(), call.principal, call.gateway.embeddings)
    if body.dimensions is not None and not 0 < body.dimensions <= reply.dimension:
        raise InvalidArgument(f"dimensions must be between 1 and {reply.dimension} for this model")
    payload = EmbeddingResponse.from_pb(reply, body.encoding_format, body.dimensions)
    return json_response(payload, response_headers(call.ctx))
