"""Token counters: framing measured from the template, remote counting via a fake Tokenize."""

from __future__ import annotations

from collections.abc import Sequence

from cache.domain import Turn
from cache.tokenizers import RemoteTokenCounter


async def test_remote_counter_adds_the_measured_framing() -> None:
    # A fake model: one token per word, and the template adds 3 tokens per message.
    async def tokenize(model: str, text: str, messages: Sequence[tuple[str, str]]) -> int:
        if messages:
            return sum(len(c.split()) + 3 for _, c in messages)
        return len(text.split())

    counter = RemoteTokenCounter(tokenize)
    counts = await counter.count_turns([Turn("system", "be brief"), Turn("user", "hello there you")])
    assert counts == [2 + 3, 3 + 3]
