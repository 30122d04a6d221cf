"""Protobuf <-> domain conversion for the cache (from_pb / to_pb)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from google.protobuf.message import DecodeError, Message
from llmesh.v1 import cache_pb2, common_pb2

from cache.domain import (
    CacheEntry,
    LookupResult,
    ResponseKey,
    SessionSummary,
    SessionView,
    Strategy,
    ToolCallRef,
    Turn,
)
from services.runtime.errors import InvalidArgument

_ROLE_TO_STR = {
    common_pb2.ROLE_SYSTEM: "system",
    common_pb2.ROLE_USER: "user",
    common_pb2.ROLE_ASSISTANT: "assistant",
    common_pb2.ROLE_TOOL: "tool",
    common_pb2.ROLE_DEVELOPER: "developer",
}
_STR_TO_ROLE = {v: k for k, v in _ROLE_TO_STR.items()}
_STRATEGY: dict[int, Strategy] = {
    cache_pb2.TRUNCATION_STRATEGY_UNSPECIFIED: Strategy.SYSTEM_TAIL,
    cache_pb2.TRUNCATION_STRATEGY_TAIL: Strategy.TAIL,
    cache_pb2.TRUNCATION_STRATEGY_SYSTEM_TAIL: Strategy.SYSTEM_TAIL,
    cache_pb2.TRUNCATION_STRATEGY_PINNED: Strategy.PINNED,
}


def turn_from_pb(message: common_pb2.ChatMessage, index: int = 0) -> Turn:
    role = _ROLE_TO_STR.get(message.role)
    if role is None:
        raise InvalidArgument(f"message {index}: role must be set")
    calls = tuple(
        ToolCallRef(id=c.id, type=c.type or "function", name=c.function.name, arguments=c.function.arguments)
        for c in message.tool_calls
    )
    return Turn(
        role=role,
        content=message.content,
        name=message.name,
        tool_calls=calls,
        tool_call_id=message.tool_call_id,
        pinned=message.pinned,
    )


def turns_from_pb(messages: Iterable[common_pb2.ChatMessage]) -> list[Turn]:
    return [turn_from_pb(m, i) for i, m in enumerate(messages)]


def turn_to_pb(turn: Turn) -> common_pb2.ChatMessage:
    return common_pb2.ChatMessage(
        role=_STR_TO_ROLE[turn.role],
        content=turn.content,
        name=turn.name,
        tool_calls=[
            common_pb2.ToolCall(
                id=c.id,
                type=c.type,
                index=i,
                function=common_pb2.FunctionCall(name=c.name, arguments=c.arguments),
            )
            for i, c in enumerate(turn.tool_calls)
        ],
        tool_call_id=turn.tool_call_id,
        pinned=turn.pinned,
    )


def strategy_from_pb(value: int) -> Strategy:
    strategy = _STRATEGY.get(value)
    if strategy is None:
        raise InvalidArgument(f"unknown truncation strategy {value}")
    return strategy


def _fingerprint(messages: Iterable[Message]) -> str:
    digest = hashlib.sha256()
    for message in messages:
        blob = message.SerializeToString(deterministic=True)
        digest.update(len(blob).to_bytes(8, "big") + blob)
    return digest.hexdigest()


def _sampling(params: common_pb2.SamplingParams) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in params.DESCRIPTOR.fields:
        if field.has_presence:
            if params.HasField(field.name):
                out[field.name] = getattr(params, field.name)
        elif field.name == "stop":
            if params.stop:
                out["stop"] = list(params.stop)
        else:
            value = getattr(params, field.name)
            if value:
                out[field.name] = value
    return out


def key_from_pb(key: cache_pb2.ResponseKey) -> ResponseKey:
    if key.messages and key.prompt:
        raise InvalidArgument("key: set messages or prompt, not both")
    return ResponseKey(
        model=key.model,
        model_revision=key.model_revision,
        messages=tuple(turns_from_pb(key.messages)),
        prompt=key.prompt,
        tools=_fingerprint(key.tools) if key.tools else "",
        tool_choice=_fingerprint([key.tool_choice]) if key.HasField("tool_choice") else "",
        response_format=_fingerprint([key.response_format]) if key.HasField("response_format") else "",
        sampling=_sampling(key.sampling),
        scope=key.scope,
    )


def stamps_from_pb(stamps: Iterable[common_pb2.VersionStamp]) -> dict[str, int]:
    out: dict[str, int] = {}
    for stamp in stamps:
        if stamp.version < 0:
            raise InvalidArgument(f"derived_from {stamp.namespace}: version must be >= 0")
        out[stamp.namespace] = max(stamp.version, out.get(stamp.namespace, 0))
    return out


def stamps_to_pb(stamps: Mapping[str, int]) -> list[common_pb2.VersionStamp]:
    return [common_pb2.VersionStamp(namespace=ns, version=v) for ns, v in sorted(stamps.items())]


def payload_from_pb(entry: cache_pb2.CachedResponse) -> bytes:
    """What is stored of a CachedResponse: choices, usage, model (stamps and times are the cache's)."""
    body = cache_pb2.CachedResponse(model=entry.model)
    body.choices.extend(entry.choices)
    if entry.HasField("usage"):
        body.usage.CopyFrom(entry.usage)
    return body.SerializeToString()


def entry_to_pb(entry: CacheEntry) -> cache_pb2.CachedResponse:
    body = cache_pb2.CachedResponse()
    try:
        body.ParseFromString(entry.payload)
    except DecodeError:
        body = cache_pb2.CachedResponse()
    body.derived_from.extend(stamps_to_pb(entry.derived_from))
    body.created_at_ms = entry.created_at_ms
    if not body.model:
        body.model = entry.model
    return body


def lookup_to_pb(result: LookupResult) -> cache_pb2.LookupResponseResponse:
    out = cache_pb2.LookupResponseResponse(
        status=result.status.to_pb(),
        age_ms=result.age_ms,
        semantic=result.semantic,
        similarity=result.similarity,
        verifier=result.verifier,
        verifier_score=result.verifier_score,
        lease_token=result.lease_token,
        detail=result.detail,
        ttl_ms=result.ttl_ms,
        entry_id=result.entry_id,
    )
    if result.entry is not None:
        out.entry.CopyFrom(entry_to_pb(result.entry))
    return out


def session_to_pb(view: SessionView) -> cache_pb2.GetSessionResponse:
    return cache_pb2.GetSessionResponse(
        session_id=view.session_id,
        messages=[turn_to_pb(t) for t in view.turns],
        version=view.version,
        truncated=view.truncated,
        dropped_turns=view.dropped_turns,
        token_count=view.token_count,
        total_turns=view.total_turns,
    )


def summary_to_pb(summary: SessionSummary) -> common_pb2.SessionSummary:
    return common_pb2.SessionSummary(
        session_id=summary.session_id,
        total_turns=summary.total_turns,
        version=summary.version,
        expires_at_ms=summary.expires_at_ms,
    )
