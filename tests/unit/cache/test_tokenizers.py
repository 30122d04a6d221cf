"""Token counters: framing measured from the template, remote counting via a fake Tokenize."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from cache.domain import Turn
from cache.tokenizers import LocalTokenCounter, RemoteTokenCounter
from services.runtime.errors import FailedPrecondition


async def test_remote_counter_adds_the_measured_framing() -> None:
    # A fake model: one token per word, and the template adds 3 tokens per message.
    async def tokenize(model: str, text: str, messages: Sequence[tuple[str, str]]) -> int:
        if messages:
            return sum(len(c.split()) + 3 for _, c in messages)
        return len(text.split())

    counter = RemoteTokenCounter(tokenize)
    counts = await counter.count_turns([Turn("system", "be brief"), Turn("user", "hello there you")])
    assert counts == [2 + 3, 3 + 3]


def test_a_tokenizer_without_transformers_is_a_failed_precondition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The cache image installs llmesh[cache] only; a tokenizer directory found there must
    # fall back to the inference service's Tokenize, not crash the service at start.
    (tmp_path / "tokenizer.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(FailedPrecondition, match="transformers is not installed"):
        LocalTokenCounter.load(tmp_path)
