"""Streamed chunks: the hand-written JSON of a text delta is pydantic's, byte for byte, and each
message of the pipeline goes out in one write."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from types import SimpleNamespace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from llmesh.v1 import chat_pb2, common_pb2

from gateway.api import streaming
from gateway.api.chat.protocol import ChatCompletionChunk, chunk_head_json, delta_choice, text_choice_json
from gateway.api.protocol import dump_json
from services.runtime import context as rc

# Any text a protobuf string holds: control characters, quotes, backslashes, non-BMP, no surrogates.
TEXT = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40)
REASONS = st.sampled_from([*common_pb2.FinishReason.values(), 99])


@given(text=TEXT, index=st.integers(0, 2**31 - 1), first=st.booleans(), reason=REASONS)
def test_a_text_choice_is_what_pydantic_writes(text: str, index: int, first: bool, reason: int) -> None:
    delta = common_pb2.CompletionDelta(index=index, text=text, finish_reason=reason)  # type: ignore[arg-type]
    expected = dump_json(delta_choice(delta, first, logprobs=False))
    assert text_choice_json(delta, first) == expected


@given(chunk_id=TEXT, created=st.integers(0, 2**40), model=TEXT, texts=st.lists(TEXT, min_size=1, max_size=3))
def test_a_text_chunk_is_what_pydantic_writes(
    chunk_id: str, created: int, model: str, texts: list[str]
) -> None:
    deltas = [common_pb2.CompletionDelta(index=i, text=t) for i, t in enumerate(texts)]
    chunk = ChatCompletionChunk(
        id=chunk_id,
        created=created,
        model=model,
        choices=[delta_choice(d, i == 0, False) for i, d in enumerate(deltas)],
    )
    ours = (
        chunk_head_json(chunk_id, created, model)
        + b",".join(text_choice_json(d, i == 0) for i, d in enumerate(deltas))
        + b"]}"
    )
    assert ours == dump_json(chunk)
    assert json.loads(ours)["choices"][0]["delta"]["role"] == "assistant"


async def test_each_message_is_one_write_and_the_last_carries_the_trailer_and_done() -> None:
    messages = [
        chat_pb2.CompleteStreamResponse(deltas=[common_pb2.CompletionDelta(index=0, text="a")]),
        chat_pb2.CompleteStreamResponse(),  # nothing to send: no write
        chat_pb2.CompleteStreamResponse(
            deltas=[
                common_pb2.CompletionDelta(index=0, text="b"),
                common_pb2.CompletionDelta(index=1, text="c"),
            ]
        ),
        chat_pb2.CompleteStreamResponse(usage=common_pb2.Usage(completion_tokens=3)),
    ]

    async def source() -> AsyncGenerator[chat_pb2.CompleteStreamResponse, None]:
        for message in messages:
            yield message

    def make(message: chat_pb2.CompleteStreamResponse, last: bool) -> list[bytes]:
        out = [json.dumps(d.text).encode() for d in message.deltas]
        return out + ([b'"usage"'] if last else [])

    ctx = rc.RequestContext(request_id="r1")
    call: Any = SimpleNamespace(ctx=ctx)
    writes = [w async for w in streaming._events(call, source(), make)]
    assert writes[0] == b'data: "a"\n\n'
    assert writes[1] == b'data: "b"\n\ndata: "c"\n\n'
    assert writes[2].startswith(b'data: "usage"\n\n: x-cache-status=')
    assert writes[2].endswith(streaming.DONE)
    assert len(writes) == 3


async def test_an_error_after_the_last_message_still_sends_it_then_the_error() -> None:
    async def source() -> AsyncGenerator[chat_pb2.CompleteStreamResponse, None]:
        yield chat_pb2.CompleteStreamResponse(usage=common_pb2.Usage(completion_tokens=1))
        raise RuntimeError("boom")

    def make(message: chat_pb2.CompleteStreamResponse, last: bool) -> list[bytes]:
        return [b'"usage"'] if last else []

    call: Any = SimpleNamespace(ctx=rc.RequestContext(request_id="r2"))
    writes = [w async for w in streaming._events(call, source(), make)]
    assert len(writes) == 1
    events = [line for line in writes[0].split(b"\n\n") if line.startswith(b"data: ")]
    assert events[0] == b'data: "usage"'
    assert json.loads(events[1][6:])["error"]["type"] == "server_error"
    assert events[2] == b"data: [DONE]"
