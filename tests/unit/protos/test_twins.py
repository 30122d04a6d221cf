"""The twin requests (a streaming RPC's and its unary sibling's) stay wire-identical, so
``services.runtime.twins.convert`` loses nothing; and ChatService's embeddings call stays
field for field the embeddings service's, which the gateway copies across."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.message import Message
from llmesh.v1 import chat_pb2, common_pb2, embeddings_pb2, inference_pb2

from services.runtime import twins


def _shape(descriptor: Any) -> list[tuple[str, int, int, str, bool]]:
    only = twins.STREAM_ONLY.get(descriptor.full_name, frozenset())
    return sorted(
        (
            f.name,
            f.number,
            f.type,
            f.message_type.full_name if f.message_type else (f.enum_type.full_name if f.enum_type else ""),
            f.is_repeated,
        )
        for f in descriptor.fields
        if f.name not in only
    )


@pytest.mark.parametrize(
    ("unary", "streamed"),
    [
        *twins.TWINS,
        (embeddings_pb2.EmbedRequest, chat_pb2.CreateEmbeddingsRequest),
        (embeddings_pb2.EmbedResponse, chat_pb2.CreateEmbeddingsResponse),
    ],
    ids=lambda cls: cls.__name__,
)
def test_twins_have_the_same_fields(unary: type[Message], streamed: type[Message]) -> None:
    assert _shape(unary.DESCRIPTOR) == _shape(streamed.DESCRIPTOR)


def test_convert_keeps_every_value() -> None:
    request = chat_pb2.CompleteRequest(
        model="m",
        messages=[common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content="hi")],
        sampling=common_pb2.SamplingParams(temperature=0.5, max_tokens=7, seed=3),
        session_id="s1",
        rag=chat_pb2.RagOptions(collections=["docs"], top_k=2),
    )
    streamed = twins.convert(request, chat_pb2.CompleteStreamRequest)
    assert isinstance(streamed, chat_pb2.CompleteStreamRequest)
    assert streamed.sampling.max_tokens == 7 and streamed.rag.collections == ["docs"]
    assert twins.convert(streamed, chat_pb2.CompleteRequest) == request
    generate = inference_pb2.GenerateRequest(prompt="p", add_generation_prompt=False)
    back = twins.convert(
        twins.convert(generate, inference_pb2.GenerateStreamRequest), inference_pb2.GenerateRequest
    )
    assert back == generate and back.HasField("add_generation_prompt")
    # A stream-only field survives the round trip through the unary twin (as an unknown field).
    resumed = inference_pb2.GenerateStreamRequest(prompt="p", resume_token_ids=[5, 6])
    through = twins.convert(twins.convert(resumed, inference_pb2.GenerateRequest), type(resumed))
    assert list(through.resume_token_ids) == [5, 6]
