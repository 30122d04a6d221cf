"""Text completions: OpenAI request -> pipeline (raw prompt) -> OpenAI response or SSE chunks."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, Sequence

import anyio
from fastapi.responses import Response
from llmesh.v1 import chat_pb2, common_pb2

from gateway.api.completions.protocol import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
)
from gateway.api.context import response_headers
from gateway.api.deps import Call
from gateway.api.protocol import FINISH_REASONS, UsageInfo, dump_json, json_response, now_s
from gateway.api.streaming import ChunkMaker, Messages, llmesh_info, sse_response


async def create_completion(body: CompletionRequest, call: Call) -> Response:
    pipeline = call.gateway.pipeline
    # Each prompt is a generation of its own, with its own admission slot; all prompts pass
    # auth, policy and the cache lookup before anything is generated, so a blocked or invalid
    # prompt fails the whole request with nothing started.
    requests = [body.to_pb(i) for i in range(len(body.prompts()))]
    prepared = await pipeline.prepare_all(requests, call.principal)
    if body.stream:
        streams = [pipeline.stream(p) for p in prepared]
        merge = None if len(streams) == 1 else functools.partial(_merged, n=body.n)
        return await sse_response(call, streams, _chunk_maker(body, call), merge=merge)
    responses = await pipeline.complete_all(prepared)
    payload = CompletionResponse.from_pbs(responses, body.n, body.logprobs is not None)
    return json_response(payload, response_headers(call.ctx), exclude_none=True)


async def _merged(
    streams: Sequence[Messages], n: int
) -> AsyncGenerator[chat_pb2.CompleteStreamResponse, None]:
    """The streams of all prompts as one: choice ``j`` of prompt ``i`` is index ``i * n + j``
    (OpenAI's numbering); usage is summed into the one last message."""
    queue: asyncio.Queue[tuple[int, chat_pb2.CompleteStreamResponse | BaseException | None]] = asyncio.Queue()

    async def pump(i: int) -> None:
        try:
            async for message in streams[i]:
                await queue.put((i, message))
        except BaseException as exc:  # handed to the consumer, which ends the response with it
            await queue.put((i, exc))
            return
        await queue.put((i, None))

    tasks = [asyncio.create_task(pump(i)) for i in range(len(streams))]
    usage = common_pb2.Usage()
    model = ""
    try:
        running = len(tasks)
        while running:
            i, item = await queue.get()
            if item is None:
                running -= 1
                continue
            if isinstance(item, BaseException):
                raise item
            model = item.model or model
            if item.HasField("usage"):
                _add_usage(usage, item.usage)
            if item.deltas:
                out = chat_pb2.CompleteStreamResponse(id=item.id, model=item.model)
                for delta in item.deltas:
                    out.deltas.add().CopyFrom(delta)
                    out.deltas[-1].index = i * n + delta.index
                yield out
        yield chat_pb2.CompleteStreamResponse(model=model, usage=usage)
    finally:
        for task in tasks:
            task.cancel()
        # Wait for every reader to stop, even when a client disconnect cancelled the response
        # (an anyio scope cancels each await in it): its stream is closed after this, and a
        # stream still being read cannot be closed.
        with anyio.CancelScope(shield=True):
            await asyncio.gather(*tasks, return_exceptions=True)


def _add_usage(total: common_pb2.Usage, part: common_pb2.Usage) -> None:
    total.prompt_tokens += part.prompt_tokens
    total.completion_tokens += part.completion_tokens
    total.total_tokens += part.total_tokens
    total.cached_prompt_tokens += part.cached_prompt_tokens


def _chunk_maker(body: CompletionRequest, call: Call) -> ChunkMaker:
    created = now_s()
    chunk_id = f"cmpl-{call.ctx.request_id}"
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    logprobs = body.logprobs is not None

    def make(message: chat_pb2.CompleteStreamResponse, last: bool) -> list[bytes]:
        out: list[bytes] = []
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
            out.append(dump_json(chunk))
        info = llmesh_info(call) if last else None
        if info is not None and (include_usage or info.resumed):
            final = CompletionResponse(
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
