"""Truncation strategies on per-turn token counts (no tokenizer needed)."""

from __future__ import annotations

import pytest

from cache.domain import Strategy, Turn
from cache.truncation import truncate
from services.runtime.errors import InvalidArgument

SYS = Turn("system", "rules")
TURNS = [
    SYS,
    Turn("user", "u1"),
    Turn("assistant", "a1", pinned=True),
    Turn("user", "u2"),
    Turn("assistant", "a2"),
]
COUNTS = [10, 5, 7, 5, 6]


def test_no_budget_or_fitting_budget_keeps_everything() -> None:
    for budget in (0, 33, 100):
        cut = truncate(TURNS, COUNTS, budget, Strategy.TAIL)
        assert cut.kept == (0, 1, 2, 3, 4)
        assert cut.token_count == 33


def test_tail_keeps_the_most_recent_turns() -> None:
    cut = truncate(TURNS, COUNTS, 12, Strategy.TAIL)
    assert cut.kept == (3, 4)
    assert cut.token_count == 11
    assert cut.dropped(len(TURNS)) == 3


def test_system_tail_always_keeps_the_system_prompt() -> None:
    cut = truncate(TURNS, COUNTS, 22, Strategy.SYSTEM_TAIL)
    assert cut.kept == (0, 3, 4)
    assert cut.token_count == 21


def test_pinned_keeps_pinned_turns_and_fills_with_recent_ones() -> None:
    cut = truncate(TURNS, COUNTS, 24, Strategy.PINNED)
    assert cut.kept == (0, 2, 4)
    assert cut.token_count == 23


def test_tail_is_contiguous_and_never_exceeds_the_budget() -> None:
    counts = [1, 50, 1, 1]
    turns = [Turn("user", str(i)) for i in range(4)]
    cut = truncate(turns, counts, 10, Strategy.TAIL)
    assert cut.kept == (2, 3)


def test_orphan_tool_result_is_dropped_with_its_call() -> None:
    turns = [Turn("user", "q"), Turn("assistant", "call"), Turn("tool", "result"), Turn("assistant", "final")]
    cut = truncate(turns, [5, 5, 5, 5], 10, Strategy.TAIL)
    assert cut.kept == (3,)
    assert cut.token_count == 5


def test_required_turns_over_budget_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match="smaller than"):
        truncate(TURNS, COUNTS, 9, Strategy.SYSTEM_TAIL)
