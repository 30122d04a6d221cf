"""Domain types of the inference service (no gRPC, no vLLM).

:mod:`services.inference.convert` maps them to and from the protos; the engine
(:mod:`services.inference.engine`) takes and returns only these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool", "developer"]
ToolChoiceMode = Literal["auto", "none", "required"]
FinishReason = Literal["stop", "length", "tool_calls", "abort", ""]


@dataclass(slots=True)
class ToolCall:
    """A function call made by the model (or, in a message, by an earlier turn)."""

    id: str
    name: str
    # JSON-encoded arguments; in a streamed delta, the next fragment of them.
    arguments: str
    index: int = 0


@dataclass(slots=True)
class Message:
    role: str
    content: str = ""
    name: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str = ""


@dataclass(slots=True)
class Tool:
    name: str
    description: str = ""
    # The JSON schema of the parameters, still JSON-encoded (validated by the engine).
    parameters_json: str = ""
    strict: bool = False


@dataclass(slots=True)
class ToolChoice:
    """``mode`` auto/none/required, or ``function`` set to force a call of that function."""

    mode: ToolChoiceMode | None = None
    function: str | None = None


@dataclass(slots=True)
class ResponseFormat:
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str = ""
    # JSON-encoded schema (json_schema only).
    schema_json: str = ""
    strict: bool = False


@dataclass(slots=True)
class Sampling:
    """Sampling parameters; None = the engine's (or the model's generation config) default."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    min_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    n: int = 1
    logprobs: bool = False
    top_logprobs: int = 0
    priority: int = 0


@dataclass(slots=True)
class RoutePrefix:
    """A router's keys for the prompt's prefixes (inference_pb2.RoutePrefix)."""

    keys: list[int]
    block_chars: int
    text_chars: int


@dataclass(slots=True)
class GenerateRequest:
    """Chat (``messages``) or raw text (``prompt``) generation: exactly one of them is set."""

    model: str = ""
    messages: list[Message] = field(default_factory=list)
    prompt: str | None = None
    tools: list[Tool] = field(default_factory=list)
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    response_format: ResponseFormat = field(default_factory=ResponseFormat)
    sampling: Sampling = field(default_factory=Sampling)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    add_generation_prompt: bool = True
    # Tokens another replica already generated for this stream (its one choice): the engine
    # continues after them (GenerateStreamRequest.resume_token_ids).
    resume_token_ids: list[int] = field(default_factory=list)
    # Tokens per streamed message after the first; 0 = the service's setting
    # (GenerateStreamRequest.stream_interval).
    stream_interval: int = 0
    # The router's prefix keys (reported held through WatchPrefixes); None = none.
    route_prefix: RoutePrefix | None = None


@dataclass(slots=True)
class TopLogprob:
    token: str
    logprob: float
    bytes: bytes


@dataclass(slots=True)
class TokenLogprob:
    token: str
    logprob: float
    bytes: bytes
    top: list[TopLogprob] = field(default_factory=list)


@dataclass(slots=True)
class Choice:
    """One finished choice (unary) or the new part of one choice (stream delta)."""

    index: int
    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    # "" on a delta that does not end the choice.
    finish_reason: FinishReason = ""
    stop_reason: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    # The ids of the tokens this delta was decoded from (streams only).
    token_ids: list[int] = field(default_factory=list)


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(slots=True)
class Timings:
    """Where the time of one request went, in milliseconds (from the engine's own timestamps)."""

    queue_ms: float = 0.0
    time_to_first_token_ms: float = 0.0
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    e2e_ms: float = 0.0


@dataclass(slots=True)
class GenerateResult:
    id: str
    model: str
    revision: str
    choices: list[Choice]
    usage: Usage
    timings: Timings


@dataclass(slots=True)
class StreamChunk:
    """One engine step's output; ``usage``/``timings`` are set on the last chunk only."""

    id: str
    model: str
    revision: str
    deltas: list[Choice]
    usage: Usage | None = None
    timings: Timings | None = None


@dataclass(slots=True)
class TokenizeRequest:
    model: str = ""
    messages: list[Message] = field(default_factory=list)
    prompt: str | None = None
    tools: list[Tool] = field(default_factory=list)
    add_generation_prompt: bool = True
    return_token_ids: bool = False


@dataclass(slots=True)
class TokenizeResult:
    count: int
    token_ids: list[int]
    max_model_len: int


@dataclass(slots=True)
class ModelInfo:
    name: str
    revision: str
    path: str
    max_model_len: int
    supports_tools: bool
    supports_json_schema: bool
    tool_parser: str
    dtype: str
    vocab_size: int
    aliases: list[str]
    max_num_seqs: int
    max_waiting_requests: int
    # Requests the engine holds right now (running or waiting), and the scheduler's
    # last reported split of them.
    unfinished_requests: int
    running_requests: int
    waiting_requests: int
