"""Hypothesis strategies that build arbitrary protobuf messages from their descriptors, and
byte-level mangling of serialized messages, to throw at llmesh's gRPC services."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import descriptor as d
from google.protobuf import message_factory
from google.protobuf.message import Message
from hypothesis import strategies as st

MAX_DEPTH = 3
_INT_RANGES = {
    d.FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    d.FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    d.FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    d.FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    d.FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    d.FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    d.FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    d.FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    d.FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    d.FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
# Strings a service must survive: empty, whitespace, control and non-Latin text, JSON-ish,
# and one far over any sane limit.
_SPECIAL_TEXT = [
    "",
    " ",
    "\x00",
    "\u200b\u200d",
    "日本語のテキスト",
    '{"a": [1, {"b": null}]}',
    "x" * 300_000,
]


def _interesting_ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    edges = [v for v in (lo, hi, -1, 0, 1, 2, 4096, 2**31 - 1) if lo <= v <= hi]
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi), st.integers(max(lo, -5), min(hi, 200)))


def _scalar(field: d.FieldDescriptor) -> st.SearchStrategy[Any]:
    t = field.type
    if t == d.FieldDescriptor.TYPE_STRING:
        return st.one_of(st.text(max_size=40), st.sampled_from(_SPECIAL_TEXT))
    if t == d.FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=40)
    if t == d.FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == d.FieldDescriptor.TYPE_FLOAT:
        return st.floats(width=32)
    if t == d.FieldDescriptor.TYPE_DOUBLE:
        return st.floats()
    if t == d.FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None
        top = max(v.number for v in field.enum_type.values)
        return st.integers(-2, top + 2)  # proto3 enums are open: unknown values must be handled
    lo, hi = _INT_RANGES[t]
    return _interesting_ints(lo, hi)


def _field(field: d.FieldDescriptor, depth: int) -> st.SearchStrategy[Any] | None:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key = _scalar(field.message_type.fields_by_name["key"])
        value_field = field.message_type.fields_by_name["value"]
        if value_field.message_type is not None:
            return None
        return st.dictionaries(key, _scalar(value_field), max_size=4)
    if field.message_type is not None:
        if depth >= MAX_DEPTH:
            return None
        single = message_strategy(field.message_type, depth + 1)
    else:
        single = _scalar(field)
    if field.is_repeated:
        return st.lists(single, max_size=4)
    return single


def message_strategy(descriptor: d.Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Messages of ``descriptor``'s type with any subset of fields set to arbitrary values."""
    cls = message_factory.GetMessageClass(descriptor)
    parts: dict[str, st.SearchStrategy[Any]] = {}
    for field in descriptor.fields:
        strategy = _field(field, depth)
        if strategy is not None:
            parts[field.name] = st.one_of(st.none(), strategy)
    return st.fixed_dictionaries(parts).map(lambda values: _build(cls, descriptor, values))


def _build(cls: type[Message], descriptor: d.Descriptor, values: dict[str, Any]) -> Message:
    message = cls()
    for name, value in values.items():
        if value is None:
            continue
        field = descriptor.fields_by_name[name]
        target: Any = getattr(message, name) if field.is_repeated or field.message_type else None
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            target.update(value)
        elif field.is_repeated and field.message_type is not None:
            for item in value:
                target.add().CopyFrom(item)
        elif field.is_repeated:
            target.extend(value)
        elif field.message_type is not None:
            target.CopyFrom(value)
        else:
            setattr(message, name, value)
    return message


@st.composite
def mangled(draw: st.DrawFn, descriptor: d.Descriptor) -> bytes:
    """A valid serialized message damaged at the byte level, or random bytes."""
    raw = draw(message_strategy(descriptor)).SerializeToString()
    how = draw(st.sampled_from(["truncate", "flip", "insert", "random"]))
    if how == "random" or not raw:
        return draw(st.binary(min_size=1, max_size=64))
    at = draw(st.integers(0, len(raw) - 1))
    if how == "truncate":
        return raw[:at]
    if how == "flip":
        return raw[:at] + bytes([draw(st.integers(0, 255))]) + raw[at + 1 :]
    return raw[:at] + draw(st.binary(min_size=1, max_size=8)) + raw[at:]


# Codes a service may answer arbitrary input with; anything else (INTERNAL, UNKNOWN,
# UNIMPLEMENTED, DATA_LOSS, UNAVAILABLE from a healthy service) is a bug.
ACCEPTABLE = frozenset(
    {
        grpc.StatusCode.OK,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.OUT_OF_RANGE,
    }
)


@dataclass
class Outcome:
    method: str
    code: grpc.StatusCode
    details: str
    elapsed_s: float


def _identity(b: bytes) -> bytes:
    return b


def call_raw(
    channel: grpc.Channel,
    method: d.MethodDescriptor,
    payloads: list[bytes],
    *,
    timeout: float,
    metadata: tuple[tuple[str, str], ...],
    max_responses: int = 64,
) -> Outcome:
    """Sends ``payloads`` (one, or a stream) to ``method`` as raw bytes; never raises."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    started = time.monotonic()
    code, details = grpc.StatusCode.OK, ""
    try:
        if method.client_streaming:
            multi: Callable[..., Any] = (
                channel.stream_stream(path, _identity, _identity)
                if method.server_streaming
                else channel.stream_unary(path, _identity, _identity)
            )
            reply = multi(iter(payloads), timeout=timeout, metadata=metadata)
        elif method.server_streaming:
            reply = channel.unary_stream(path, _identity, _identity)(
                payloads[0], timeout=timeout, metadata=metadata
            )
        else:
            channel.unary_unary(path, _identity, _identity)(payloads[0], timeout=timeout, metadata=metadata)
            reply = None
        if method.server_streaming:
            for count, _ in enumerate(reply):
                if count >= max_responses:
                    reply.cancel()
                    break
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""
        if code == grpc.StatusCode.CANCELLED and method.server_streaming:
            code = grpc.StatusCode.OK  # we cancelled a long stream ourselves
    return Outcome(path, code, details, time.monotonic() - started)
