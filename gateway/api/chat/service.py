"""Chat completions: OpenAI request -> pipeline -> OpenAI response or SSE chunks."""

from __future__ import annotations

from fastapi.responses import Response
from llmesh.v1 import chat_pb2

from gateway.api.chat.protocol import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    chunk_head_json,
    delta_choice,
    text_choice_json,
)
from gateway.api.context import response_headers
from gateway.api.deps import Call
from gateway.api.protocol import UsageInfo, dump_json, json_response, now_s
from gateway.api.streaming import ChunkMaker, llmesh_info, sse_response


async def create_chat_completion(body: ChatCompletionRequest, call: Call) -> Response:
    pipeline = call.gateway.pipeline
    prepared = await pipeline.prepare(body.to_pb(), call.principal, stream=bool(body.stream))
    if body.stream:
        return await sse_response(call, [pipeline.stream(prepared)], _chunk_maker(body, call))
    response = await pipeline.complete(prepared)
    payload = ChatCompletionResponse.from_pb(response, body.logprobs)
    return json_response(payload, response_headers(call.ctx), exclude_none=True)


def _chunk_maker(body: ChatCompletionRequest, call: Call) -> ChunkMaker:
    seen: set[int] = set()
    created = now_s()
    chunk_id = f"chatcmpl-{call.ctx.request_id}"
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    heads: dict[str, bytes] = {}  # each model name's chunk head (one, but for a resumed stream)

    def text_chunk(message: chat_pb2.CompleteStreamResponse) -> bytes:
        head = heads.get(message.model)
        if head is None:
            head = heads[message.model] = chunk_head_json(chunk_id, created, message.model)
        choices = []
        for delta in message.deltas:
            choices.append(text_choice_json(delta, delta.index not in seen))
            seen.add(delta.index)
        return head + b",".join(choices) + b"]}"

    def make(message: chat_pb2.CompleteStreamResponse, last: bool) -> list[bytes]:
        out: list[bytes] = []
        if message.deltas:
            if not any(d.tool_calls or (body.logprobs and d.logprobs) for d in message.deltas):
                out.append(text_chunk(message))
            else:
                choices = []
                for delta in message.deltas:
                    choices.append(delta_choice(delta, delta.index not in seen, body.logprobs))
                    seen.add(delta.index)
                chunk = ChatCompletionChunk(
                    id=chunk_id, created=created, model=message.model, choices=choices
                )
                out.append(dump_json(chunk))
        info = llmesh_info(call) if last else None
        # The usage chunk when asked for; a resumed stream always ends with its marker.
        if info is not None and (include_usage or info.resumed):
            final = ChatCompletionChunk(
                id=chunk_id,
                created=created,
                model=message.model,
                choices=[],
                usage=UsageInfo.from_pb(message.usage) if include_usage else None,
                llmesh=info,
            )
            out.append(dump_json(final))
        return out

    return make
