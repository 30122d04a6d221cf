"""OpenAI wire models shared by the endpoints: usage, sampling, logprobs, the llmesh extensions."""

from __future__ import annotations

import time

from llmesh.v1 import chat_pb2, common_pb2
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from services.runtime.limits import MAX_CHOICES, MAX_SESSION_ID_CHARS
from services.runtime.sampling import OPTIONAL_FIELDS as OPTIONAL_SAMPLING_FIELDS

FINISH_REASONS: dict[int, str | None] = {
    common_pb2.FINISH_REASON_UNSPECIFIED: None,
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_TOOL_CALLS: "tool_calls",
    common_pb2.FINISH_REASON_CONTENT_FILTER: "content_filter",
    common_pb2.FINISH_REASON_ABORT: "stop",
}


class OpenAIModel(BaseModel):
    # Unknown fields are ignored, as OpenAI-compatible servers do (clients send vendor extras).
    model_config = ConfigDict(extra="ignore")


class RagRequest(OpenAIModel):
    """llmesh extension: retrieve context from these collections before generating."""

    collections: list[str] = Field(default_factory=list, max_length=8)
    top_k: int = Field(default=0, ge=0, le=32)
    min_score: float = 0.0


class StreamOptions(OpenAIModel):
    include_usage: bool = False


# Bounds of the proto fields these values travel in (int32 / int64): a larger number is a 400,
# never a failed conversion (found by schemathesis: min_tokens=2**31 was a 500).
INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class SamplingFields(OpenAIModel):
    """Sampling parameters common to chat and text completions (OpenAI names, vLLM extras)."""

    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
    max_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    user: str | None = Field(default=None, max_length=256)
    stream: bool = False
    stream_options: StreamOptions | None = None
    # vLLM extras.
    top_k: int | None = Field(default=None, ge=-1, le=INT32_MAX)
    repetition_penalty: float | None = None
    min_tokens: int | None = Field(default=None, ge=0, le=INT32_MAX)
    # llmesh extensions.
    session_id: str | None = Field(default=None, max_length=MAX_SESSION_ID_CHARS)
    rag: RagRequest | None = None

    def sampling_pb(
        self, max_tokens: int | None, logprobs: bool, top_logprobs: int
    ) -> common_pb2.SamplingParams:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        sampling = common_pb2.SamplingParams(
            stop=stops, n=self.n, logprobs=logprobs, top_logprobs=top_logprobs
        )
        for name in OPTIONAL_SAMPLING_FIELDS:
            value = getattr(self, name)
            if value is not None:
                setattr(sampling, name, value)
        if max_tokens is not None:
            sampling.max_tokens = max_tokens
        return sampling

    def extensions_pb(self, request: chat_pb2.CompleteRequest) -> None:
        if self.session_id:
            request.session_id = self.session_id
        if self.rag is not None:
            request.rag.collections.extend(self.rag.collections)
            request.rag.top_k = self.rag.top_k
            request.rag.min_score = self.rag.min_score
        if self.user:
            request.user = self.user


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None

    @classmethod
    def from_pb(cls, usage: common_pb2.Usage) -> UsageInfo:
        return cls(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            total_tokens=usage.total_tokens or usage.prompt_tokens + usage.completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.cached_prompt_tokens),
        )


class TopLogprobOut(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprobOut(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprobOut] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprobOut] | None = None

    @classmethod
    def from_pb(cls, logprobs: list[common_pb2.TokenLogprob]) -> ChoiceLogprobs:
        return cls(
            content=[
                TokenLogprobOut(
                    token=lp.token,
                    logprob=lp.logprob,
                    bytes=list(lp.bytes) or list(lp.token.encode()),
                    top_logprobs=[
                        TopLogprobOut(
                            token=t.token, logprob=t.logprob, bytes=list(t.bytes) or list(t.token.encode())
                        )
                        for t in lp.top_logprobs
                    ],
                )
                for lp in logprobs
            ]
        )


class LlmeshInfo(BaseModel):
    """llmesh extension on the last chunk of a stream: what the headers could not carry."""

    cache_status: str | None = None
    cache_version: str | None = None
    # "skipped": part of this answer went out unmoderated (policy down, tenant fails open).
    moderation: str | None = None
    # How many times the stream continued on another inference replica after the one
    # generating it failed (absent = never): the text is still one answer.
    resumed: int | None = None


def now_s() -> int:
    return int(time.time())


def dump_json(payload: BaseModel) -> bytes:
    """``payload`` as JSON without its ``None`` fields, straight to bytes."""
    return payload.__pydantic_serializer__.to_json(payload, exclude_none=True)


def json_response(payload: BaseModel, headers: dict[str, str], *, exclude_none: bool = False) -> Response:
    """``payload`` as a JSON response, serialised by pydantic straight to bytes (no intermediate
    dicts and ``json.dumps``: about a tenth of the gateway's CPU per cache hit went there)."""
    return Response(
        payload.model_dump_json(exclude_none=exclude_none), media_type="application/json", headers=headers
    )
