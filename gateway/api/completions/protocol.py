"""OpenAI (legacy) text completion wire models."""

from __future__ import annotations

from typing import Literal

from llmesh.v1 import chat_pb2, common_pb2
from pydantic import BaseModel, Field, model_validator

from gateway.api.protocol import FINISH_REASONS, SamplingFields, UsageInfo, now_s


class CompletionRequest(SamplingFields):
    """``POST /v1/completions`` (one prompt string; token-id prompts are not supported)."""

    model: str = ""
    prompt: str | list[str]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @model_validator(mode="after")
    def _check(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise ValueError("prompt: exactly one prompt string per request is supported")
        if not self.prompt_text():
            raise ValueError("prompt must not be empty")
        if self.echo or self.suffix:
            raise ValueError("echo and suffix are not supported")
        if self.best_of not in (None, self.n):
            raise ValueError("best_of is not supported")
        return self

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    def to_pb(self) -> chat_pb2.CompleteRequest:
        request = chat_pb2.CompleteRequest(
            model=self.model,
            prompt=self.prompt_text(),
            sampling=self.sampling_pb(
                self.max_tokens if self.max_tokens is not None else 16,
                self.logprobs is not None,
                self.logprobs or 0,
            ),
        )
        self.extensions_pb(request)
        return request


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)

    @classmethod
    def from_pb(cls, logprobs: list[common_pb2.TokenLogprob], offset: int = 0) -> CompletionLogprobs:
        out = cls()
        for lp in logprobs:
            out.tokens.append(lp.token)
            out.token_logprobs.append(lp.logprob)
            out.top_logprobs.append({t.token: t.logprob for t in lp.top_logprobs})
            out.text_offset.append(offset)
            offset += len(lp.token)
        return out


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=now_s)
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None

    @classmethod
    def from_pb(cls, response: chat_pb2.CompleteResponse, logprobs: bool) -> CompletionResponse:
        return cls(
            id=f"cmpl-{response.id}",
            model=response.model,
            choices=[
                CompletionChoice(
                    index=c.index,
                    text=c.text,
                    finish_reason=FINISH_REASONS.get(c.finish_reason, "stop") or "stop",
                    logprobs=CompletionLogprobs.from_pb(list(c.logprobs)) if logprobs else None,
                )
                for c in response.choices
            ],
            usage=UsageInfo.from_pb(response.usage),
        )
