"""Server-sent events for streamed completions: the pipeline's messages as OpenAI chunks.

Everything that can fail with a status code has run before the stream starts
(``ChatPipeline.prepare``); an error after that ends the stream with an error
event, as OpenAI and vLLM do. A client that disconnects cancels the generator,
which cancels the engine request.
"""

from __future__ import annotations

import json
import logging
import weakref
from collections.abc import AsyncIterator, Callable

from fastapi.responses import StreamingResponse
from llmesh.v1 import chat_pb2

from gateway.api.context import response_headers
from gateway.api.deps import Call
from gateway.api.protocol import LlmeshInfo
from gateway.errors import to_http
from gateway.pipeline import Prepared
from services.runtime import context as rc

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"


def event(payload: str) -> bytes:
    return b"data: " + payload.encode() + b"\n\n"


# (message, is_last) -> the chunks' JSON payloads.
ChunkMaker = Callable[[chat_pb2.CompleteStreamResponse, bool], list[str]]


def llmesh_info(call: Call) -> LlmeshInfo:
    """What the response headers could not carry yet when the stream started."""
    ctx = call.ctx
    versions = rc.merged_versions(ctx.floors, ctx.observed)
    return LlmeshInfo(
        cache_status=ctx.cache_status, cache_version=rc.format_versions(versions) if versions else None
    )


def trailer_comment(call: Call) -> bytes:
    """The same as an SSE comment (clients ignore comments; curl users can read it)."""
    info = llmesh_info(call)
    return (
        f": x-cache-status={info.cache_status or ''} x-cache-version={info.cache_version or ''}\n\n".encode()
    )


def sse_response(
    call: Call,
    prepared: Prepared,
    make_chunks: ChunkMaker,
    *,
    source: AsyncIterator[chat_pb2.CompleteStreamResponse] | None = None,
    slots: int = 1,
) -> StreamingResponse:
    """``prepared``'s stream (or ``source``, e.g. several prompts' streams merged) as SSE;
    gives back ``slots`` admission slots when it ends."""
    pipeline = call.mesh.pipeline
    messages = source if source is not None else pipeline.stream(prepared)
    headers = response_headers(call.ctx)
    headers["cache-control"] = "no-cache"
    headers["x-accel-buffering"] = "no"

    released = False

    def release_once() -> None:
        nonlocal released
        if not released:
            released = True
            for _ in range(slots):
                pipeline.admission.release()

    async def body() -> AsyncIterator[bytes]:
        try:
            async for message in messages:
                # The pipeline's last message is the only one that carries usage.
                for payload in make_chunks(message, message.HasField("usage")):
                    yield event(payload)
            yield trailer_comment(call)
            yield DONE
        except Exception as exc:
            error = to_http(exc, call.ctx.request_id)
            if error.status >= 500:
                log.warning("stream %s failed: %s", call.ctx.request_id, error.body)
            yield event(json.dumps(error.body))
            yield DONE
        finally:
            release_once()

    stream = body()
    # A client gone before the body was started never runs the generator's finally:
    # the slot is then given back when the generator is collected.
    weakref.finalize(stream, release_once)
    return StreamingResponse(stream, media_type="text/event-stream", headers=headers)
