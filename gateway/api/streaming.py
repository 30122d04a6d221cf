"""Server-sent events for streamed completions: the pipeline's messages as OpenAI chunks.

Everything that can fail with a status code has run before the stream starts
(``ChatPipeline.prepare``); an error after that ends the stream with an error
event, as OpenAI and vLLM do. A client that disconnects cancels the generator,
which cancels the engine request. The response closes the pipeline's streams
however it ends, even when it never started, and each closed stream gives back
its admission slot.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncGenerator, Callable, Sequence

from fastapi.responses import StreamingResponse
from llmesh.v1 import chat_pb2
from starlette.types import Receive, Scope, Send

from gateway.admission import SlotStream
from gateway.api.context import response_headers
from gateway.api.deps import Call
from gateway.api.protocol import LlmeshInfo
from gateway.errors import to_http
from gateway.stages.policy import MODERATION_KEY, MODERATION_SKIPPED, moderation_skipped
from gateway.upstream_inference import RESUMED_KEY, resumed_count
from services.runtime import context as rc

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"

# One prompt's stream from the pipeline (it holds the prompt's admission slot), and a merge of several.
Messages = SlotStream[chat_pb2.CompleteStreamResponse]
Merge = Callable[[Sequence[Messages]], AsyncGenerator[chat_pb2.CompleteStreamResponse, None]]


def event(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


# (message, is_last) -> the chunks' JSON payloads (UTF-8).
ChunkMaker = Callable[[chat_pb2.CompleteStreamResponse, bool], list[bytes]]


def llmesh_info(call: Call) -> LlmeshInfo:
    """What the response headers could not carry yet when the stream started."""
    ctx = call.ctx
    versions = rc.merged_versions(ctx.floors, ctx.observed)
    return LlmeshInfo(
        cache_status=ctx.cache_status,
        cache_version=rc.format_versions(versions) if versions else None,
        moderation=MODERATION_SKIPPED if moderation_skipped(ctx) else None,
        resumed=resumed_count(ctx) or None,
    )


def trailer_comment(call: Call) -> bytes:
    """The same as an SSE comment (clients ignore comments; curl users can read it)."""
    info = llmesh_info(call)
    comment = f": x-cache-status={info.cache_status or ''} x-cache-version={info.cache_version or ''}"
    if info.moderation:
        comment += f" {MODERATION_KEY}={info.moderation}"
    if info.resumed:
        comment += f" {RESUMED_KEY}={info.resumed}"
    return (comment + "\n\n").encode()


async def sse_response(
    call: Call,
    streams: Sequence[Messages],
    make_chunks: ChunkMaker,
    *,
    merge: Merge | None = None,
) -> StreamingResponse:
    """The pipeline's ``streams`` as SSE: the one stream, or several ``merge``d into one.

    The response owns the streams from this call on: it closes them when it ends, fails,
    is cancelled or is never sent, so each gives back its admission slot.
    """
    try:
        headers = response_headers(call.ctx)
        headers["cache-control"] = "no-cache"
        headers["x-accel-buffering"] = "no"
        messages: Messages | AsyncGenerator[chat_pb2.CompleteStreamResponse, None] = (
            merge(streams) if merge is not None else streams[0]
        )
        return _EventStream(_events(call, messages, make_chunks), streams, headers)
    except BaseException:
        for stream in streams:
            await stream.aclose()
        raise


async def _events(
    call: Call,
    messages: Messages | AsyncGenerator[chat_pb2.CompleteStreamResponse, None],
    make_chunks: ChunkMaker,
) -> AsyncGenerator[bytes, None]:
    # Each message's chunks go out in one write (one send through the server, one syscall),
    # and the last message's together with the trailer and [DONE].
    last = b""
    try:
        async for message in messages:
            # The pipeline's last message is the only one that carries usage.
            final = message.HasField("usage")
            data = b"".join([event(payload) for payload in make_chunks(message, final)])
            if final:
                last += data
            elif data:
                yield last + data if last else data
                last = b""
        yield last + trailer_comment(call) + DONE
    except Exception as exc:
        error = to_http(exc, call.ctx.request_id)
        if error.status >= 500:
            log.warning("stream %s failed: %s", call.ctx.request_id, error.body)
        yield last + event(json.dumps(error.body).encode()) + DONE
    finally:
        # Leaving an ``async for`` early closes nothing: a merge stops its own readers here.
        await messages.aclose()


class _EventStream(StreamingResponse):
    """A ``text/event-stream`` response that closes its body and the pipeline's streams when it
    is done with them, however it ended (an ``async for`` that stops early closes nothing)."""

    def __init__(
        self, body: AsyncGenerator[bytes, None], streams: Sequence[Messages], headers: dict[str, str]
    ) -> None:
        super().__init__(body, media_type="text/event-stream", headers=headers)
        self._body = body
        self._streams = list(streams)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with contextlib.AsyncExitStack() as closing:
            for stream in self._streams:
                closing.push_async_callback(stream.aclose)
            closing.push_async_callback(self._body.aclose)  # runs first: the body stops reading
            await super().__call__(scope, receive, send)
