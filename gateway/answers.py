"""Building answers: streamed deltas into whole choices, cache entries into responses."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from llmesh.v1 import cache_pb2, chat_pb2, common_pb2


@dataclass
class ChoiceBuilder:
    """One choice assembled from its deltas."""

    index: int
    text: list[str] = field(default_factory=list)
    tool_calls: dict[int, common_pb2.ToolCall] = field(default_factory=dict)
    finish_reason: int = common_pb2.FINISH_REASON_UNSPECIFIED
    stop_reason: str = ""
    logprobs: list[common_pb2.TokenLogprob] = field(default_factory=list)

    def add(self, delta: common_pb2.CompletionDelta, released_text: str) -> None:
        if released_text:
            self.text.append(released_text)
        merge_tool_calls(self.tool_calls, delta.tool_calls)
        self.logprobs.extend(delta.logprobs)
        if delta.finish_reason:
            self.finish_reason = delta.finish_reason
            self.stop_reason = delta.stop_reason

    def build(self) -> common_pb2.Completion:
        return common_pb2.Completion(
            index=self.index,
            text="".join(self.text),
            tool_calls=[self.tool_calls[i] for i in sorted(self.tool_calls)],
            finish_reason=self.finish_reason or common_pb2.FINISH_REASON_STOP,  # type: ignore[arg-type]
            stop_reason=self.stop_reason,
            logprobs=self.logprobs,
        )


def merge_tool_calls(calls: dict[int, common_pb2.ToolCall], pieces: Iterable[common_pb2.ToolCall]) -> None:
    """Adds streamed tool-call pieces to ``calls`` (by index): the first piece of a call names it,
    the arguments arrive in fragments."""
    for call in pieces:
        merged = calls.get(call.index)
        if merged is None:
            merged = calls[call.index] = common_pb2.ToolCall(
                id=call.id, type=call.type or "function", index=call.index
            )
            merged.function.name = call.function.name
        else:
            if call.id and not merged.id:
                merged.id = call.id
            if call.function.name and not merged.function.name:
                merged.function.name = call.function.name
        merged.function.arguments += call.function.arguments


def assistant_turn(choice: common_pb2.Completion) -> common_pb2.ChatMessage:
    """The session turn an answer becomes."""
    return common_pb2.ChatMessage(
        role=common_pb2.ROLE_ASSISTANT, content=choice.text, tool_calls=choice.tool_calls
    )


def response_from_entry(
    request_id: str, entry: cache_pb2.CachedResponse, model: str
) -> chat_pb2.CompleteResponse:
    return chat_pb2.CompleteResponse(
        id=request_id,
        model=entry.model or model,
        choices=entry.choices,
        usage=entry.usage,
        cache_status=common_pb2.CACHE_STATUS_HIT,
    )


def stream_from_entry(
    request_id: str, entry: cache_pb2.CachedResponse, model: str
) -> Iterable[chat_pb2.CompleteStreamResponse]:
    """A cached answer replayed as one stream message per choice, then the usage."""
    for choice in entry.choices:
        yield chat_pb2.CompleteStreamResponse(
            id=request_id,
            model=entry.model or model,
            deltas=[
                common_pb2.CompletionDelta(
                    index=choice.index,
                    text=choice.text,
                    tool_calls=choice.tool_calls,
                    finish_reason=choice.finish_reason,
                    stop_reason=choice.stop_reason,
                    logprobs=choice.logprobs,
                )
            ],
            cache_status=common_pb2.CACHE_STATUS_HIT,
        )
    yield chat_pb2.CompleteStreamResponse(
        id=request_id, model=entry.model or model, usage=entry.usage, cache_status=common_pb2.CACHE_STATUS_HIT
    )


def cache_entry(
    choices: Sequence[common_pb2.Completion], usage: common_pb2.Usage, model: str, derived: dict[str, int]
) -> cache_pb2.CachedResponse:
    return cache_pb2.CachedResponse(
        choices=choices,
        usage=usage,
        model=model,
        derived_from=[common_pb2.VersionStamp(namespace=ns, version=v) for ns, v in sorted(derived.items())],
    )
