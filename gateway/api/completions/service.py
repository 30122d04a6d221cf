"""Text completions: OpenAI request -> pipeline (raw prompt) -> OpenAI response or SSE chunks."""

from __future__ import annotations

from fastapi.responses import JSONResponse, Response
from llmesh.v1 import chat_pb2

from gateway.api.completions.protocol import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
)
from gateway.api.context import response_headers
from gateway.api.deps import Call
from gateway.api.protocol import FINISH_REASONS, UsageInfo, now_s
from gateway.api.streaming import ChunkMaker, sse_response


async def create_completion(body: CompletionRequest, call: Call) -> Response:
    pipeline = call.mesh.pipeline
    pipeline.admission.acquire()
    try:
        prepared = await pipeline.prepare(body.to_pb(), call.principal)
        if body.stream:
            return sse_response(call, prepared, _chunk_maker(body, call))
        response = await pipeline.complete(prepared)
    except BaseException:
        pipeline.admission.release()
        raise
    pipeline.admission.release()
    payload = CompletionResponse.from_pb(response, body.logprobs is not None)
    return JSONResponse(payload.model_dump(exclude_none=True), headers=response_headers(call.ctx))


def _chunk_maker(body: CompletionRequest, call: Call) -> ChunkMaker:
    created = now_s()
    chunk_id = f"cmpl-{call.ctx.request_id}"
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    logprobs = body.logprobs is not None

    def make(message: chat_pb2.CompleteStreamResponse, last: bool) -> list[str]:
        out: list[str] = []
        if message.deltas:
            chunk = CompletionResponse(
                id=chunk_id,
                created=created,
                model=message.model,
                choices=[
                    CompletionChoice(
                        index=d.index,
                        text=d.text,
                        finish_reason=FINISH_REASONS.get(d.finish_reason),
                        logprobs=CompletionLogprobs.from_pb(list(d.logprobs)) if logprobs else None,
                    )
                    for d in message.deltas
                ],
            )
            out.append(chunk.model_dump_json(exclude_none=True))
        if last and include_usage:
            final = CompletionResponse(
                id=chunk_id,
                created=created,
                model=message.model,
                choices=[],
                usage=UsageInfo.from_pb(message.usage),
            )
            out.append(final.model_dump_json(exclude_none=True))
        return out

    return make
