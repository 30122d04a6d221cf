"""Checks a domain request and turns it into the request vLLM's own OpenAI layer takes.

The engine renders chat through vLLM's ``OnlineRenderer`` and builds sampling
parameters (structured outputs for forced tool calls and JSON schemas included)
with vLLM's ``ChatCompletionRequest`` / ``CompletionRequest``: the same code path
``vllm serve`` runs, so templates, tool parsers and grammars behave identically.
This module validates what vLLM would reject with a vague message, or not at all,
and says exactly what is wrong.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema  # type: ignore[import-untyped]

from services.inference.types import GenerateRequest, Message, ResponseFormat, Sampling, Tool, ToolChoice
from services.runtime.errors import InvalidArgument
from services.runtime.limits import MAX_CHOICES
from services.runtime.sampling import OPTIONAL_FIELDS as OPTIONAL_SAMPLING_FIELDS

ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})
MAX_STOP_STRINGS = 16
MAX_N = MAX_CHOICES


def check_input(messages: list[Message], prompt: str | None) -> None:
    """Exactly one of chat messages and a raw prompt, every message with a known role."""
    if prompt is not None and messages:
        raise InvalidArgument("set either messages or prompt, not both")
    if prompt is None and not messages:
        raise InvalidArgument("messages is empty (and no prompt was given): nothing to generate from")
    if prompt is not None and not prompt:
        raise InvalidArgument("prompt is empty")
    for i, message in enumerate(messages):
        if message.role not in ROLES:
            raise InvalidArgument(
                f"messages[{i}].role {message.role!r} is not one of {', '.join(sorted(ROLES))}"
            )
        if message.role == "tool" and not message.tool_call_id:
            raise InvalidArgument(f"messages[{i}] is a tool message without tool_call_id")
        for j, call in enumerate(message.tool_calls):
            if message.role != "assistant":
                raise InvalidArgument(f"messages[{i}] has tool_calls but only assistant messages may")
            _json_value(f"messages[{i}].tool_calls[{j}].function.arguments", call.arguments or "{}")


def check_sampling(sampling: Sampling, max_logprobs: int) -> None:
    """Ranges vLLM enforces too, reported with the field name and the bound."""
    if sampling.max_tokens is not None and sampling.max_tokens <= 0:
        raise InvalidArgument(f"sampling.max_tokens must be > 0, got {sampling.max_tokens}")
    if sampling.min_tokens is not None and sampling.min_tokens < 0:
        raise InvalidArgument(f"sampling.min_tokens must be >= 0, got {sampling.min_tokens}")
    if (
        sampling.min_tokens is not None
        and sampling.max_tokens is not None
        and sampling.min_tokens > sampling.max_tokens
    ):
        raise InvalidArgument(
            f"sampling.min_tokens ({sampling.min_tokens}) is larger than max_tokens ({sampling.max_tokens})"
        )
    if sampling.temperature is not None and not sampling.temperature >= 0:
        raise InvalidArgument(f"sampling.temperature must be >= 0, got {sampling.temperature}")
    if sampling.top_p is not None and not 0 < sampling.top_p <= 1:
        raise InvalidArgument(f"sampling.top_p must be in (0, 1], got {sampling.top_p}")
    if sampling.top_k is not None and sampling.top_k < -1:
        raise InvalidArgument(f"sampling.top_k must be -1, 0 (off) or positive, got {sampling.top_k}")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(sampling, name)
        if value is not None and not -2 <= value <= 2:
            raise InvalidArgument(f"sampling.{name} must be in [-2, 2], got {value}")
    if sampling.repetition_penalty is not None and not sampling.repetition_penalty > 0:
        raise InvalidArgument(f"sampling.repetition_penalty must be > 0, got {sampling.repetition_penalty}")
    if not 1 <= sampling.n <= MAX_N:
        raise InvalidArgument(f"sampling.n must be in [1, {MAX_N}], got {sampling.n}")
    if not 0 <= sampling.top_logprobs <= max_logprobs:
        raise InvalidArgument(
            f"sampling.top_logprobs must be in [0, {max_logprobs}], got {sampling.top_logprobs}"
        )
    if sampling.top_logprobs and not sampling.logprobs:
        raise InvalidArgument("sampling.top_logprobs needs sampling.logprobs = true")
    if len(sampling.stop) > MAX_STOP_STRINGS:
        raise InvalidArgument(f"sampling.stop has {len(sampling.stop)} strings, at most {MAX_STOP_STRINGS}")
    if any(not s for s in sampling.stop):
        raise InvalidArgument("sampling.stop contains an empty string")


def tool_dicts(tools: list[Tool], *, strict: bool = False) -> list[dict[str, Any]]:
    """OpenAI-style tool definitions; each parameters schema must be a valid JSON schema.

    ``strict`` pins every tool's arguments to its schema (vLLM's structured outputs),
    as for a tool that asks for it itself.
    """
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not tool.name:
            raise InvalidArgument(f"{where}.function.name is empty")
        if tool.name in seen:
            raise InvalidArgument(f"{where}.function.name {tool.name!r} is defined twice")
        seen.add(tool.name)
        function: dict[str, Any] = {"name": tool.name}
        if tool.description:
            function["description"] = tool.description
        if tool.parameters_json:
            schema = _json_value(f"{where}.function.parameters_json", tool.parameters_json)
            _check_schema(f"{where}.function.parameters_json", schema)
            function["parameters"] = schema
        if tool.strict or strict:
            function["strict"] = True
        out.append({"type": "function", "function": function})
    return out


def tool_choice_value(choice: ToolChoice, tools: list[Tool]) -> str | dict[str, Any] | None:
    """vLLM's ``tool_choice``: None (no tools), a mode, or a named function."""
    if choice.function is not None:
        if not tools:
            raise InvalidArgument(f"tool_choice names function {choice.function!r} but no tools are given")
        if choice.function not in {t.name for t in tools}:
            raise InvalidArgument(f"tool_choice names function {choice.function!r}, which is not in tools")
        return {"type": "function", "function": {"name": choice.function}}
    if choice.mode == "required" and not tools:
        raise InvalidArgument("tool_choice is 'required' but no tools are given")
    if not tools:
        return None
    return choice.mode or "auto"


def response_format_dict(fmt: ResponseFormat) -> dict[str, Any] | None:
    if fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if not fmt.schema_json:
        raise InvalidArgument("response_format is json_schema but json_schema is empty")
    schema = _json_value("response_format.json_schema", fmt.schema_json)
    _check_schema("response_format.json_schema", schema)
    return {
        "type": "json_schema",
        "json_schema": {"name": fmt.name or "response", "schema": schema, "strict": fmt.strict},
    }


def message_dicts(messages: list[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in messages:
        item: dict[str, Any] = {"role": message.role, "content": message.content}
        if message.name:
            item["name"] = message.name
        if message.tool_calls:
            item["tool_calls"] = [
                {
                    "id": call.id or f"call_{i}",
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments or "{}"},
                }
                for i, call in enumerate(message.tool_calls)
            ]
        if message.tool_call_id:
            item["tool_call_id"] = message.tool_call_id
        out.append(item)
    return out


def sampling_fields(sampling: Sampling, *, chat: bool) -> dict[str, Any]:
    """The sampling part of a vLLM OpenAI request (unset fields left to vLLM's defaults)."""
    fields: dict[str, Any] = {"n": sampling.n, "priority": sampling.priority}
    for name in OPTIONAL_SAMPLING_FIELDS:
        value = getattr(sampling, name)
        if value is not None:
            fields[name] = value
    if sampling.stop:
        fields["stop"] = list(sampling.stop)
    if chat:
        if sampling.logprobs:
            fields["logprobs"] = True
            fields["top_logprobs"] = sampling.top_logprobs
    elif sampling.logprobs:
        fields["logprobs"] = sampling.top_logprobs
    return fields


def chat_request_dict(request: GenerateRequest, model: str, *, stream: bool) -> dict[str, Any]:
    """The body of an OpenAI chat completion request for vLLM's ``ChatCompletionRequest``."""
    body: dict[str, Any] = {
        "model": model,
        "messages": message_dicts(request.messages),
        "stream": stream,
        "add_generation_prompt": request.add_generation_prompt,
        **sampling_fields(request.sampling, chat=True),
    }
    choice = tool_choice_value(request.tool_choice, request.tools)
    if request.tools:
        # A forced call (required / a named function) must also be schema-valid: a
        # small model left to itself often is not.
        forced = choice == "required" or isinstance(choice, dict)
        body["tools"] = tool_dicts(request.tools, strict=forced)
    if choice is not None:
        body["tool_choice"] = choice
    fmt = response_format_dict(request.response_format)
    if fmt is not None:
        body["response_format"] = fmt
    if request.chat_template_kwargs:
        body["chat_template_kwargs"] = dict(request.chat_template_kwargs)
    return body


def completion_request_dict(request: GenerateRequest, model: str, *, stream: bool) -> dict[str, Any]:
    """The body of an OpenAI (legacy) completion request for vLLM's ``CompletionRequest``."""
    if request.tools or request.tool_choice.function or request.tool_choice.mode:
        raise InvalidArgument("tools need chat messages; a raw prompt cannot use them")
    body: dict[str, Any] = {
        "model": model,
        "prompt": request.prompt,
        "stream": stream,
        # The engine checks max_tokens against the context window itself (check_context).
        "max_tokens": None,
        **sampling_fields(request.sampling, chat=False),
    }
    fmt = response_format_dict(request.response_format)
    if fmt is not None:
        body["response_format"] = fmt
    return body


def check_context(prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> int:
    """The max_tokens to use: the caller's, or all the room left; errors name the overflow."""
    if prompt_tokens >= max_model_len:
        over = prompt_tokens - max_model_len + 1
        raise InvalidArgument(
            f"the prompt is {prompt_tokens} tokens, the context window is {max_model_len} tokens "
            f"and at least 1 must be left for the answer: shorten the prompt by {over} tokens"
        )
    room = max_model_len - prompt_tokens
    if max_tokens is None:
        return room
    if max_tokens > room:
        raise InvalidArgument(
            f"max_tokens {max_tokens} does not fit: the prompt is {prompt_tokens} tokens and the context "
            f"window is {max_model_len}, so at most {room} tokens can be generated "
            f"({max_tokens - room} too many)"
        )
    return max_tokens


def parse_json_object(field: str, text: str) -> dict[str, Any]:
    """A JSON object given as text (empty = {})."""
    if not text:
        return {}
    value = _json_value(field, text)
    if not isinstance(value, dict):
        raise InvalidArgument(f"{field} must be a JSON object, got {type(value).__name__}")
    return value


def _json_value(field: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"{field} is not valid JSON: {exc.msg} at position {exc.pos}") from exc


def _check_schema(field: str, schema: Any) -> None:
    if not isinstance(schema, dict):
        raise InvalidArgument(f"{field} must be a JSON schema object, got {type(schema).__name__}")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        path = "/".join(str(p) for p in exc.path) or "(root)"
        raise InvalidArgument(f"{field} is not a valid JSON schema at {path}: {exc.message}") from exc
