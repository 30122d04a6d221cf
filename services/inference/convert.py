"""Protos of ``llmesh.v1`` to and from the inference domain types."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import grpc
from llmesh.v1 import common_pb2, inference_pb2

from services.inference import render
from services.inference.kv_events import Update
from services.inference.streams import Part, StreamStart
from services.inference.types import (
    Choice,
    GenerateRequest,
    GenerateResult,
    Message,
    ModelInfo,
    ResponseFormat,
    RoutePrefix,
    Sampling,
    StreamChunk,
    Timings,
    TokenizeRequest,
    TokenizeResult,
    TokenLogprob,
    Tool,
    ToolCall,
    ToolChoice,
    Usage,
)
from services.runtime.build_info import BuildInfo
from services.runtime.errors import InvalidArgument
from services.runtime.status import status_for

log = logging.getLogger(__name__)

_ROLES = {
    common_pb2.ROLE_SYSTEM: "system",
    common_pb2.ROLE_USER: "user",
    common_pb2.ROLE_ASSISTANT: "assistant",
    common_pb2.ROLE_TOOL: "tool",
    common_pb2.ROLE_DEVELOPER: "developer",
}
_MODES = {
    common_pb2.ToolChoice.MODE_AUTO: "auto",
    common_pb2.ToolChoice.MODE_NONE: "none",
    common_pb2.ToolChoice.MODE_REQUIRED: "required",
}
_FORMATS = {
    common_pb2.ResponseFormat.TYPE_UNSPECIFIED: "text",
    common_pb2.ResponseFormat.TYPE_TEXT: "text",
    common_pb2.ResponseFormat.TYPE_JSON_OBJECT: "json_object",
    common_pb2.ResponseFormat.TYPE_JSON_SCHEMA: "json_schema",
}
_FINISH = {
    "": common_pb2.FINISH_REASON_UNSPECIFIED,
    "stop": common_pb2.FINISH_REASON_STOP,
    "length": common_pb2.FINISH_REASON_LENGTH,
    "tool_calls": common_pb2.FINISH_REASON_TOOL_CALLS,
    "abort": common_pb2.FINISH_REASON_ABORT,
}


def message_from_pb(msg: common_pb2.ChatMessage, index: int) -> Message:
    role = _ROLES.get(msg.role)
    if role is None:
        name = common_pb2.Role.Name(msg.role) if msg.role in common_pb2.Role.values() else str(msg.role)
        raise InvalidArgument(
            f"messages[{index}].role is {name}: one of system, user, assistant, tool, developer is required"
        )
    return Message(
        role=role,
        content=msg.content,
        name=msg.name,
        tool_calls=[
            ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments, index=c.index)
            for c in msg.tool_calls
        ],
        tool_call_id=msg.tool_call_id,
    )


def tool_from_pb(tool: common_pb2.ToolDefinition) -> Tool:
    fn = tool.function
    return Tool(
        name=fn.name, description=fn.description, parameters_json=fn.parameters_json, strict=fn.strict
    )


def tool_choice_from_pb(choice: common_pb2.ToolChoice) -> ToolChoice:
    which = choice.WhichOneof("choice")
    if which == "function_name":
        if not choice.function_name:
            raise InvalidArgument("tool_choice.function_name is empty")
        return ToolChoice(function=choice.function_name)
    if which == "mode":
        return ToolChoice(mode=_MODES.get(choice.mode))  # type: ignore[arg-type]
    return ToolChoice()


def sampling_from_pb(s: common_pb2.SamplingParams) -> Sampling:
    return Sampling(
        temperature=s.temperature if s.HasField("temperature") else None,
        top_p=s.top_p if s.HasField("top_p") else None,
        top_k=s.top_k if s.HasField("top_k") else None,
        max_tokens=s.max_tokens if s.HasField("max_tokens") else None,
        min_tokens=s.min_tokens if s.HasField("min_tokens") else None,
        stop=list(s.stop),
        seed=s.seed if s.HasField("seed") else None,
        presence_penalty=s.presence_penalty if s.HasField("presence_penalty") else None,
        frequency_penalty=s.frequency_penalty if s.HasField("frequency_penalty") else None,
        repetition_penalty=s.repetition_penalty if s.HasField("repetition_penalty") else None,
        n=s.n or 1,
        logprobs=s.logprobs,
        top_logprobs=s.top_logprobs,
        priority=s.priority,
    )


def generate_from_pb(
    req: inference_pb2.GenerateRequest | inference_pb2.GenerateStreamRequest,
) -> GenerateRequest:
    fmt = req.response_format
    return GenerateRequest(
        model=req.model,
        messages=[message_from_pb(m, i) for i, m in enumerate(req.messages)],
        prompt=req.prompt if req.prompt else None,
        tools=[tool_from_pb(t) for t in req.tools],
        tool_choice=tool_choice_from_pb(req.tool_choice),
        response_format=ResponseFormat(
            type=_FORMATS.get(fmt.type, "text"),  # type: ignore[arg-type]
            name=fmt.name,
            schema_json=fmt.json_schema,
            strict=fmt.strict,
        ),
        sampling=sampling_from_pb(req.sampling),
        chat_template_kwargs=render.parse_json_object(
            "chat_template_kwargs_json", req.chat_template_kwargs_json
        ),
        add_generation_prompt=req.add_generation_prompt if req.HasField("add_generation_prompt") else True,
        resume_token_ids=list(req.resume_token_ids)
        if isinstance(req, inference_pb2.GenerateStreamRequest)
        else [],
        stream_interval=req.stream_interval if isinstance(req, inference_pb2.GenerateStreamRequest) else 0,
        route_prefix=route_prefix_from_pb(req.route_prefix) if req.HasField("route_prefix") else None,
    )


# More keys than any router sends (the gateway's LLMESH_GATEWAY_ROUTE_MAX_BLOCKS is 16).
MAX_ROUTE_KEYS = 256


def route_prefix_from_pb(route: inference_pb2.RoutePrefix) -> RoutePrefix | None:
    if not route.keys:
        return None
    if len(route.keys) > MAX_ROUTE_KEYS:
        raise InvalidArgument(f"route_prefix.keys: at most {MAX_ROUTE_KEYS} keys, got {len(route.keys)}")
    if route.block_chars == 0 or route.text_chars == 0:
        raise InvalidArgument("route_prefix: block_chars and text_chars must be > 0 when keys are given")
    return RoutePrefix(list(route.keys), route.block_chars, route.text_chars)


def prefixes_to_pb(update: Update) -> inference_pb2.WatchPrefixesResponse:
    return inference_pb2.WatchPrefixesResponse(
        reset=update.reset,
        held=update.held,
        released=update.released,
        blocks_held=update.blocks_held,
        blocks_total=update.blocks_total,
    )


def tokenize_from_pb(req: inference_pb2.TokenizeRequest) -> TokenizeRequest:
    return TokenizeRequest(
        model=req.model,
        messages=[message_from_pb(m, i) for i, m in enumerate(req.messages)],
        prompt=req.prompt if req.prompt else None,
        tools=[tool_from_pb(t) for t in req.tools],
        add_generation_prompt=req.add_generation_prompt if req.HasField("add_generation_prompt") else True,
        return_token_ids=req.return_token_ids,
    )


def _tool_call_to_pb(call: ToolCall) -> common_pb2.ToolCall:
    return common_pb2.ToolCall(
        id=call.id,
        type="function",
        function=common_pb2.FunctionCall(name=call.name, arguments=call.arguments),
        index=call.index,
    )


def _logprobs_to_pb(items: list[TokenLogprob]) -> list[common_pb2.TokenLogprob]:
    return [
        common_pb2.TokenLogprob(
            token=item.token,
            logprob=item.logprob,
            bytes=item.bytes,
            top_logprobs=[
                common_pb2.TopLogprob(token=t.token, logprob=t.logprob, bytes=t.bytes) for t in item.top
            ],
        )
        for item in items
    ]


_ChoicePb = TypeVar("_ChoicePb", common_pb2.Completion, common_pb2.CompletionDelta)
R = TypeVar("R")
T = TypeVar("T")


def completion_to_pb(choice: Choice) -> common_pb2.Completion:
    return _choice_to_pb(common_pb2.Completion, choice)


def delta_to_pb(choice: Choice) -> common_pb2.CompletionDelta:
    delta = _choice_to_pb(common_pb2.CompletionDelta, choice)
    delta.token_ids.extend(choice.token_ids)
    return delta


def _choice_to_pb(cls: type[_ChoicePb], choice: Choice) -> _ChoicePb:
    """A finished choice and a streamed delta share their fields."""
    return cls(
        index=choice.index,
        text=choice.text,
        tool_calls=[_tool_call_to_pb(c) for c in choice.tool_calls],
        finish_reason=_FINISH[choice.finish_reason],  # type: ignore[arg-type]
        stop_reason=choice.stop_reason,
        logprobs=_logprobs_to_pb(choice.logprobs),
    )


def usage_to_pb(usage: Usage) -> common_pb2.Usage:
    return common_pb2.Usage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
        cached_prompt_tokens=usage.cached_prompt_tokens,
    )


def timings_to_pb(t: Timings) -> common_pb2.Timings:
    return common_pb2.Timings(
        queue_ms=t.queue_ms,
        time_to_first_token_ms=t.time_to_first_token_ms,
        prefill_ms=t.prefill_ms,
        decode_ms=t.decode_ms,
        e2e_ms=t.e2e_ms,
    )


def generate_to_pb(result: GenerateResult) -> inference_pb2.GenerateResponse:
    return inference_pb2.GenerateResponse(
        id=result.id,
        model=result.model,
        choices=[completion_to_pb(c) for c in result.choices],
        usage=usage_to_pb(result.usage),
        timings=timings_to_pb(result.timings),
        model_revision=result.revision,
    )


def chunk_to_pb(chunk: StreamChunk) -> inference_pb2.GenerateStreamResponse:
    out = inference_pb2.GenerateStreamResponse()
    fill_chunk_pb(out, chunk)
    return out


def fill_chunk_pb(out: inference_pb2.GenerateStreamResponse, chunk: StreamChunk) -> None:
    """Writes ``chunk`` into ``out`` (a part of a GenerateStreamsResponse: no copy)."""
    out.id = chunk.id
    out.model = chunk.model
    out.deltas.extend([delta_to_pb(d) for d in chunk.deltas])
    out.model_revision = chunk.revision
    if chunk.usage is not None:
        out.usage.CopyFrom(usage_to_pb(chunk.usage))
    if chunk.timings is not None:
        out.timings.CopyFrom(timings_to_pb(chunk.timings))


def stream_orders_from_pb(
    request: inference_pb2.GenerateStreamsRequest,
    start: Callable[[inference_pb2.GenerateStreamRequest], R] = generate_from_pb,  # type: ignore[assignment]
) -> list[StreamStart[R] | int]:
    """The orders of one GenerateStreams message: a start (its request read by ``start``), or
    the number of a stream to cancel."""
    orders: list[StreamStart[R] | int] = []
    for order in request.orders:
        if order.HasField("start"):
            orders.append(
                StreamStart(
                    order.stream,
                    start(order.start),
                    order.request_id,
                    order.timeout_ms,
                    order.traceparent,
                )
            )
        elif order.cancel:
            orders.append(order.stream)
        else:
            raise InvalidArgument(f"order for stream {order.stream} is neither start nor cancel")
    return orders


def stream_parts_to_pb(
    parts: list[Part[T]],
    fill: Callable[[inference_pb2.GenerateStreamResponse, T], None] = fill_chunk_pb,  # type: ignore[assignment]
) -> inference_pb2.GenerateStreamsResponse:
    """One GenerateStreams message of ``parts`` (each chunk written by ``fill``), errors as statuses."""
    reply = inference_pb2.GenerateStreamsResponse()
    add = reply.parts.add
    for part in parts:
        out = add(stream=part.stream)
        if part.chunk is not None:
            fill(out.message, part.chunk)
            continue
        out.end = True
        if part.error is not None:
            code, message, retry_after = status_for(part.error, part.request_id)
            if code is grpc.StatusCode.INTERNAL:
                log.error("stream %d (request %s) failed", part.stream, part.request_id, exc_info=part.error)
            out.error_code = code.value[0]
            out.error = message
            if retry_after is not None:
                out.retry_after_s = retry_after
    return reply


def tokenize_to_pb(result: TokenizeResult) -> inference_pb2.TokenizeResponse:
    return inference_pb2.TokenizeResponse(
        count=result.count, token_ids=result.token_ids, max_model_len=result.max_model_len
    )


def model_info_to_pb(info: ModelInfo, build: BuildInfo) -> inference_pb2.GetModelInfoResponse:
    return inference_pb2.GetModelInfoResponse(
        name=info.name,
        revision=info.revision,
        max_model_len=info.max_model_len,
        supports_tools=info.supports_tools,
        supports_json_schema=info.supports_json_schema,
        tool_parser=info.tool_parser,
        dtype=info.dtype,
        vocab_size=info.vocab_size,
        aliases=info.aliases,
        path=info.path,
        max_num_seqs=info.max_num_seqs,
        max_waiting_requests=info.max_waiting_requests,
        unfinished_requests=info.unfinished_requests,
        running_requests=info.running_requests,
        waiting_requests=info.waiting_requests,
        llmesh_version=build.version,
        llmesh_revision=build.revision,
    )
