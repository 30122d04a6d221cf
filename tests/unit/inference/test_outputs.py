"""vLLM outputs to domain choices: finish reasons, logprobs, timings."""

from __future__ import annotations

import time
from dataclasses import dataclass

from services.inference import outputs


@dataclass
class FakeLogprob:
    logprob: float
    rank: int | None
    decoded_token: str | None


class FakeTokenizer:
    def decode(self, ids: list[int]) -> str:
        return f"<{ids[0]}>"


def test_finish_reason_follows_openai() -> None:
    assert outputs.finish_reason(None, tool_calls=False, forced_function=False) == ""
    assert outputs.finish_reason("stop", tool_calls=False, forced_function=False) == "stop"
    assert outputs.finish_reason("length", tool_calls=True, forced_function=False) == "length"
    assert outputs.finish_reason("stop", tool_calls=True, forced_function=False) == "tool_calls"
    assert outputs.finish_reason("stop", tool_calls=True, forced_function=True) == "stop"
    assert outputs.finish_reason("abort", tool_calls=False, forced_function=False) == "abort"


def test_stop_reason_decodes_stop_tokens() -> None:
    tok = FakeTokenizer()
    assert outputs.stop_reason(None, tok) == ""
    assert outputs.stop_reason("\n\n", tok) == "\n\n"
    assert outputs.stop_reason(2, tok) == "<2>"


def test_token_logprobs_keep_the_top_n_in_rank_order() -> None:
    entries = [
        {7: FakeLogprob(-0.5, 2, "b"), 5: FakeLogprob(-0.1, 1, "a"), 9: FakeLogprob(-3.0, 3, None)},
        {4: FakeLogprob(-0.2, 1, "x"), 1: FakeLogprob(float("-inf"), 2, "y")},
    ]
    items = outputs.token_logprobs([7, 4], entries, 2, FakeTokenizer())
    assert [i.token for i in items] == ["b", "x"]
    assert [t.token for t in items[0].top] == ["a", "b"]
    assert items[1].top[1].logprob == -9999.0  # -inf made finite
    assert items[0].bytes == b"b"
    assert outputs.token_logprobs([1], None, 2, FakeTokenizer()) == []
    only_chosen = outputs.token_logprobs([9], [entries[0]], 0, FakeTokenizer())
    assert only_chosen[0].token == "<9>" and only_chosen[0].top == []


@dataclass
class FakeStats:
    queued_ts: float = 10.0
    scheduled_ts: float = 10.5
    first_token_ts: float = 11.0
    last_token_ts: float = 13.0
    first_token_latency: float = 1.2


def test_timings_come_from_engine_timestamps() -> None:
    t = outputs.timings(FakeStats(), time.time() - 2.0)
    assert (t.queue_ms, t.prefill_ms, t.decode_ms) == (500.0, 500.0, 2000.0)
    assert abs(t.time_to_first_token_ms - 1200.0) < 1e-6
    assert t.e2e_ms >= 2000.0
    empty = outputs.timings(None, time.time())
    assert empty.queue_ms == 0.0 and empty.e2e_ms >= 0.0


def test_usage_counts_cached_tokens() -> None:
    u = outputs.usage(10, 5, None)
    assert (u.prompt_tokens, u.completion_tokens, u.cached_prompt_tokens, u.total_tokens) == (10, 5, 0, 15)
    assert outputs.usage(10, 5, 8).cached_prompt_tokens == 8
