"""Twin messages: the request of a streaming RPC and of its unary sibling.

Buf's standard lint rules give every RPC a request type of its own
(``CompleteStreamRequest`` beside ``CompleteRequest``, ``GenerateStreamRequest`` beside
``GenerateRequest``), so each can evolve with its call. Each pair has the same fields
with the same numbers and types, which makes them wire-identical: one converts into the
other through its bytes, losing nothing. The one exception is :data:`STREAM_ONLY`: fields
that only mean something to a stream (``GenerateStreamRequest.resume_token_ids`` and
``stream_interval``), which the unary twin keeps as unknown fields. :data:`TWINS` lists the pairs and
``tests/unit/protos/test_twins.py`` fails the day any other field is added to one and not the
other.
"""

from __future__ import annotations

from typing import TypeVar

from google.protobuf.message import Message
from llmesh.v1 import chat_pb2, inference_pb2

M = TypeVar("M", bound=Message)

# (unary request, streaming request): kept field for field alike.
TWINS: tuple[tuple[type[Message], type[Message]], ...] = (
    (chat_pb2.CompleteRequest, chat_pb2.CompleteStreamRequest),
    (inference_pb2.GenerateRequest, inference_pb2.GenerateStreamRequest),
)
# Fields of a streaming request its unary twin does not have (by message name).
STREAM_ONLY: dict[str, frozenset[str]] = {
    "llmesh.v1.GenerateStreamRequest": frozenset({"resume_token_ids", "stream_interval"}),
}


def convert(message: Message, twin: type[M]) -> M:
    """``message`` as its twin type (same fields, same values)."""
    return twin.FromString(message.SerializeToString())
