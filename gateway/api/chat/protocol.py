"""OpenAI chat completion wire models and their conversion to and from the protos."""

from __future__ import annotations

import json
from typing import Any, Literal

from llmesh.v1 import chat_pb2, common_pb2
from pydantic import BaseModel, Field, model_validator
from pydantic_core import to_json

from gateway.api.protocol import (
    FINISH_REASONS,
    INT32_MAX,
    ChoiceLogprobs,
    LlmeshInfo,
    OpenAIModel,
    SamplingFields,
    UsageInfo,
    now_s,
)

ROLES = {
    "system": common_pb2.ROLE_SYSTEM,
    "user": common_pb2.ROLE_USER,
    "assistant": common_pb2.ROLE_ASSISTANT,
    "tool": common_pb2.ROLE_TOOL,
    "developer": common_pb2.ROLE_DEVELOPER,
    "function": common_pb2.ROLE_TOOL,
}


class ContentPart(OpenAIModel):
    type: str
    text: str | None = None


class FunctionCallIn(OpenAIModel):
    name: str
    arguments: str = ""


class ToolCallIn(OpenAIModel):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessageIn(OpenAIModel):
    role: Literal["system", "user", "assistant", "tool", "developer", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.type != "text":
                raise ValueError(f"content parts of type {part.type!r} are not supported (text only)")
            parts.append(part.text or "")
        return "".join(parts)

    def to_pb(self) -> common_pb2.ChatMessage:
        return common_pb2.ChatMessage(
            role=ROLES[self.role],
            content=self.text(),
            name=self.name or "",
            tool_calls=[
                common_pb2.ToolCall(
                    id=c.id,
                    type="function",
                    index=i,
                    function=common_pb2.FunctionCall(name=c.function.name, arguments=c.function.arguments),
                )
                for i, c in enumerate(self.tool_calls or [])
            ],
            tool_call_id=self.tool_call_id or "",
        )


class FunctionDefinitionIn(OpenAIModel):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolIn(OpenAIModel):
    type: Literal["function"] = "function"
    function: FunctionDefinitionIn


class NamedFunction(OpenAIModel):
    name: str


class NamedToolChoice(OpenAIModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class JsonSchemaIn(OpenAIModel):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormatIn(OpenAIModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaIn | None = None


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``."""

    model: str = ""
    messages: list[ChatMessageIn] = Field(min_length=1)
    tools: list[ToolIn] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    response_format: ResponseFormatIn | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)

    @model_validator(mode="after")
    def _check(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        fmt = self.response_format
        if (
            fmt is not None
            and fmt.type == "json_schema"
            and (fmt.json_schema is None or fmt.json_schema.schema_ is None)
        ):
            raise ValueError("response_format json_schema needs json_schema.schema")
        for message in self.messages:
            message.text()  # raises on unsupported content parts
        return self

    def to_pb(self) -> chat_pb2.CompleteRequest:
        request = chat_pb2.CompleteRequest(
            model=self.model,
            messages=[m.to_pb() for m in self.messages],
            sampling=self.sampling_pb(
                self.max_completion_tokens or self.max_tokens, self.logprobs, self.top_logprobs or 0
            ),
        )
        for tool in self.tools or []:
            request.tools.append(
                common_pb2.ToolDefinition(
                    type="function",
                    function=common_pb2.FunctionDefinition(
                        name=tool.function.name,
                        description=tool.function.description or "",
                        parameters_json=json.dumps(
                            tool.function.parameters or {"type": "object", "properties": {}}
                        ),
                        strict=bool(tool.function.strict),
                    ),
                )
            )
        if isinstance(self.tool_choice, NamedToolChoice):
            request.tool_choice.function_name = self.tool_choice.function.name
        elif self.tool_choice is not None:
            request.tool_choice.mode = {
                "none": common_pb2.ToolChoice.MODE_NONE,
                "auto": common_pb2.ToolChoice.MODE_AUTO,
                "required": common_pb2.ToolChoice.MODE_REQUIRED,
            }[self.tool_choice]
        if self.response_format is not None:
            fmt = self.response_format
            if fmt.type == "json_object":
                request.response_format.type = common_pb2.ResponseFormat.TYPE_JSON_OBJECT
            elif fmt.type == "json_schema" and fmt.json_schema is not None:
                request.response_format.type = common_pb2.ResponseFormat.TYPE_JSON_SCHEMA
                request.response_format.name = fmt.json_schema.name
                request.response_format.json_schema = json.dumps(fmt.json_schema.schema_)
                request.response_format.strict = bool(fmt.json_schema.strict)
            else:
                request.response_format.type = common_pb2.ResponseFormat.TYPE_TEXT
        self.extensions_pb(request)
        return request


class FunctionCallOut(BaseModel):
    name: str | None = None
    arguments: str = ""


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCallOut] | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    finish_reason: str | None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=now_s)
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None

    @classmethod
    def from_pb(cls, response: chat_pb2.CompleteResponse, logprobs: bool) -> ChatCompletionResponse:
        choices = []
        for choice in response.choices:
            calls = [
                ToolCallOut(
                    id=c.id, function=FunctionCallOut(name=c.function.name, arguments=c.function.arguments)
                )
                for c in choice.tool_calls
            ]
            choices.append(
                ChatChoice(
                    index=choice.index,
                    message=ChatMessageOut(
                        content=choice.text if choice.text or not calls else None, tool_calls=calls or None
                    ),
                    finish_reason=FINISH_REASONS.get(choice.finish_reason, "stop") or "stop",
                    logprobs=ChoiceLogprobs.from_pb(list(choice.logprobs)) if logprobs else None,
                )
            )
        return cls(
            id=f"chatcmpl-{response.id}",
            model=response.model,
            choices=choices,
            usage=UsageInfo.from_pb(response.usage),
        )


class ToolCallDelta(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallOut | None = None


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: UsageInfo | None = None
    llmesh: LlmeshInfo | None = None


def delta_choice(delta: common_pb2.CompletionDelta, first: bool, logprobs: bool) -> ChunkChoice:
    calls = [
        ToolCallDelta(
            index=c.index,
            id=c.id or None,
            type="function" if c.id else None,
            function=FunctionCallOut(name=c.function.name or None, arguments=c.function.arguments),
        )
        for c in delta.tool_calls
    ]
    return ChunkChoice(
        index=delta.index,
        delta=DeltaMessage(
            role="assistant" if first else None,
            content=delta.text if delta.text or (first and not calls) else None,
            tool_calls=calls or None,
        ),
        finish_reason=FINISH_REASONS.get(delta.finish_reason),
        logprobs=ChoiceLogprobs.from_pb(list(delta.logprobs)) if logprobs and delta.logprobs else None,
    )


# The JSON of each finish reason's field in a chunk's choice, as ChunkChoice dumps it.
_FINISH_JSON = {code: b',"finish_reason":' + to_json(name) for code, name in FINISH_REASONS.items() if name}


def text_choice_json(delta: common_pb2.CompletionDelta, first: bool) -> bytes:
    """``delta_choice(delta, first, logprobs=False)`` as JSON without its ``None`` fields, for a
    delta without tool calls, byte for byte what pydantic writes (tests/unit/gateway/
    test_chunk_json.py), without building three models per token: the streamed chunks' hot path.
    """
    if first:
        delta_json = b'{"role":"assistant","content":' + to_json(delta.text) + b"}"
    elif delta.text:
        delta_json = b'{"content":' + to_json(delta.text) + b"}"
    else:
        delta_json = b"{}"
    return (
        b'{"index":'
        + str(delta.index).encode()
        + b',"delta":'
        + delta_json
        + _FINISH_JSON.get(delta.finish_reason, b"")
        + b"}"
    )


def chunk_head_json(chunk_id: str, created: int, model: str) -> bytes:
    """A ``ChatCompletionChunk``'s JSON up to its choices' list (its first fields' order)."""
    return (
        b'{"id":'
        + to_json(chunk_id)
        + b',"object":"chat.completion.chunk","created":'
        + str(created).encode()
        + b',"model":'
        + to_json(model)
        + b',"choices":['
    )
