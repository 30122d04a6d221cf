"""OpenAI (legacy) text completion wire models."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from llmesh.v1 import chat_pb2, common_pb2
from pydantic import BaseModel, Field, model_validator

from gateway.api.protocol import FINISH_REASONS, LlmeshInfo, SamplingFields, UsageInfo, now_s

# Each prompt of a batch is a generation of its own (and holds an admission slot).
MAX_PROMPTS = 16


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``: one prompt string or a list of them (token-id prompts
    are rejected: the API takes text and the model's tokenizer stays server-side)."""

    model: str = ""
    prompt: str | list[str]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @model_validator(mode="after")
    def _check(self) -> CompletionRequest:
        prompts = self.prompts()
        if not prompts:
            raise ValueError("prompt must not be an empty list")
        if len(prompts) > MAX_PROMPTS:
            raise ValueError(f"prompt: at most {MAX_PROMPTS} prompts per request, got {len(prompts)}")
        for i, text in enumerate(prompts):
            if not text:
                where = f"prompt[{i}]" if len(prompts) > 1 else "prompt"
                raise ValueError(f"{where} must not be empty")
        if self.echo or self.suffix:
            raise ValueError("echo and suffix are not supported")
        if self.best_of not in (None, self.n):
            raise ValueError("best_of is not supported")
        return self

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    def to_pb(self, index: int = 0) -> chat_pb2.CompleteRequest:
        """The gateway request of prompt ``index``."""
        request = chat_pb2.CompleteRequest(
            model=self.model,
            prompt=self.prompts()[index],
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
    # llmesh extension on the last chunk of a stream (as on chat completions).
    llmesh: LlmeshInfo | None = None

    @classmethod
    def from_pbs(
        cls, responses: Sequence[chat_pb2.CompleteResponse], n: int, logprobs: bool
    ) -> CompletionResponse:
        """One response for a batch of prompts: choice ``j`` of prompt ``i`` is index ``i * n + j``."""
        usage = common_pb2.Usage()
        for response in responses:
            usage.prompt_tokens += response.usage.prompt_tokens
            usage.completion_tokens += response.usage.completion_tokens
            usage.total_tokens += response.usage.total_tokens
            usage.cached_prompt_tokens += response.usage.cached_prompt_tokens
        return cls(
            id=f"cmpl-{responses[0].id}",
            model=responses[0].model,
            choices=[
                CompletionChoice(
                    index=i * n + c.index,
                    text=c.text,
                    finish_reason=FINISH_REASONS.get(c.finish_reason, "stop") or "stop",
                    logprobs=CompletionLogprobs.from_pb(list(c.logprobs)) if logprobs else None,
                )
                for i, response in enumerate(responses)
                for c in response.choices
            ],
            usage=UsageInfo.from_pb(usage),
        )
