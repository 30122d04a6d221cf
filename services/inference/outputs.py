"""vLLM's per-request outputs turned into domain choices, usage and timings.

Tool calls are read back with vLLM's own parser (the one ``--tool-call-parser``
names), one parser per choice because parsers keep streaming state.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from services.inference.types import FinishReason, Timings, TokenLogprob, ToolCall, TopLogprob, Usage

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


def finish_reason(reason: str | None, *, tool_calls: bool, forced_function: bool) -> FinishReason:
    """OpenAI's rule: "tool_calls" when the model called tools, except for a forced (named) call."""
    if reason is None:
        return ""
    mapped = _FINISH.get(reason, "stop")
    if tool_calls and mapped == "stop" and not forced_function:
        return "tool_calls"
    return mapped


def stop_reason(value: int | str | None, tokenizer: Any) -> str:
    """The stop string, or the text of the stop token, that ended a choice."""
    if value is None:
        return ""
    if isinstance(value, int):
        return str(tokenizer.decode([value]))
    return value


def token_logprobs(
    token_ids: Sequence[int],
    logprobs: Iterable[Mapping[int, Any]] | None,
    top_n: int,
    tokenizer: Any,
) -> list[TokenLogprob]:
    """One entry per generated token: its logprob and the ``top_n`` most likely alternatives."""
    if logprobs is None:
        return []
    out: list[TokenLogprob] = []
    for token_id, entry in zip(token_ids, logprobs, strict=False):
        chosen = entry.get(token_id)
        if chosen is None:
            continue
        ranked = sorted(entry.items(), key=lambda kv: kv[1].rank if kv[1].rank is not None else 1 << 30)
        top = [
            _top(tid, lp, tokenizer) for tid, lp in ranked[:top_n] if lp.rank is not None and lp.rank <= top_n
        ]
        token = _token_text(token_id, chosen, tokenizer)
        out.append(
            TokenLogprob(
                token=token,
                logprob=_finite(chosen.logprob),
                bytes=token.encode("utf-8", "replace"),
                top=top,
            )
        )
    return out


def usage(prompt_tokens: int, completion_tokens: int, cached: int | None) -> Usage:
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_prompt_tokens=int(cached or 0),
    )


def timings(metrics: Any, arrival_wall: float) -> Timings:
    """From vLLM's ``RequestStateStats`` (engine timestamps on one monotonic clock)."""
    e2e_ms = (time.time() - arrival_wall) * 1000.0
    if metrics is None or not getattr(metrics, "scheduled_ts", 0.0):
        return Timings(e2e_ms=e2e_ms)
    queued, scheduled = metrics.queued_ts, metrics.scheduled_ts
    first, last = metrics.first_token_ts, metrics.last_token_ts
    return Timings(
        queue_ms=max(0.0, scheduled - queued) * 1000.0,
        time_to_first_token_ms=max(0.0, metrics.first_token_latency) * 1000.0,
        prefill_ms=max(0.0, first - scheduled) * 1000.0 if first else 0.0,
        decode_ms=max(0.0, last - first) * 1000.0 if first else 0.0,
        e2e_ms=e2e_ms,
    )


class ToolCallReader:
    """Separates content from tool calls in one choice's output, unary or streamed."""

    def __init__(self, parser: Any, vllm_request: Any, prompt_token_ids: Sequence[int] | None) -> None:
        self._parser = parser
        self._request = vllm_request
        self._prompt_token_ids = list(prompt_token_ids or [])
        if prompt_token_ids is not None:
            parser.set_prompt_token_ids(prompt_token_ids)

    def parse(self, text: str, token_ids: Sequence[int]) -> tuple[str, list[ToolCall]]:
        _reasoning, content, calls = self._parser.parse(
            text, self._request, enable_auto_tools=True, model_output_token_ids=token_ids
        )
        tool_calls = [
            ToolCall(id=call.id or _call_id(), name=call.name, arguments=call.arguments, index=i)
            for i, call in enumerate(calls or [])
        ]
        return content or "", tool_calls

    def parse_delta(
        self, text: str, token_ids: Sequence[int], *, finished: bool
    ) -> tuple[str, list[ToolCall]]:
        delta = self._parser.parse_delta(
            text, list(token_ids), self._request, self._prompt_token_ids, finished=finished
        )
        if delta is None:
            return "", []
        calls = [
            ToolCall(
                id=call.id or "",
                name=(call.function.name or "") if call.function else "",
                arguments=(call.function.arguments or "") if call.function else "",
                index=call.index,
            )
            for call in delta.tool_calls
        ]
        return delta.content or "", calls


def _call_id() -> str:
    from vllm.renderers.chat_utils import make_tool_call_id

    return str(make_tool_call_id())


def _top(token_id: int, logprob: Any, tokenizer: Any) -> TopLogprob:
    token = _token_text(token_id, logprob, tokenizer)
    return TopLogprob(token=token, logprob=_finite(logprob.logprob), bytes=token.encode("utf-8", "replace"))


def _token_text(token_id: int, logprob: Any, tokenizer: Any) -> str:
    text = getattr(logprob, "decoded_token", None)
    if text is None:
        text = tokenizer.decode([token_id])
    return str(text)


def _finite(value: float) -> float:
    # -inf (a token masked out by a grammar) does not survive JSON clients well.
    return value if value > -1e30 else -9999.0
