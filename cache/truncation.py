"""Cutting a session down to a token budget: "tail", "system+tail" and "pinned".

Token counts come from a :class:`TokenCounter` (the model's own tokenizer, see
:mod:`cache.tokenizers`); this module only decides which turns to keep.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from cache.domain import Strategy, Turn
from services.runtime.errors import InvalidArgument

SYSTEM_ROLES = frozenset({"system", "developer"})


class TokenCounter(Protocol):
    """Counts the tokens each turn takes in a model's prompt (chat-template framing included)."""

    async def count_turns(self, turns: Sequence[Turn], model: str = "") -> list[int]: ...


@dataclass(frozen=True, slots=True)
class Truncation:
    kept: tuple[int, ...]
    token_count: int

    def dropped(self, total: int) -> int:
        return total - len(self.kept)


def truncate(turns: Sequence[Turn], counts: Sequence[int], budget: int, strategy: Strategy) -> Truncation:
    """The indices of the turns to keep (in order) so that their tokens fit ``budget``."""
    if len(turns) != len(counts):
        raise ValueError("one count per turn")
    if budget <= 0 or sum(counts) <= budget:
        return Truncation(kept=tuple(range(len(turns))), token_count=sum(counts))
    required: list[int] = []
    if strategy in (Strategy.SYSTEM_TAIL, Strategy.PINNED) and turns and turns[0].role in SYSTEM_ROLES:
        required.append(0)
    if strategy is Strategy.PINNED:
        required.extend(i for i, t in enumerate(turns) if t.pinned and i not in required)
    used = sum(counts[i] for i in required)
    if used > budget:
        raise InvalidArgument(
            f"token_budget {budget} is smaller than the {used} tokens of the turns that must be kept "
            f"(strategy {strategy.value})"
        )
    kept = set(required)
    # Newest first; stop at the first turn that does not fit so the tail stays contiguous.
    for i in range(len(turns) - 1, -1, -1):
        if i in kept:
            continue
        if used + counts[i] > budget:
            break
        kept.add(i)
        used += counts[i]
    ordered = sorted(kept)
    # A tool result whose assistant call was dropped is meaningless to the model: drop it too.
    while ordered:
        first_free = next((i for i in ordered if i not in required), None)
        if first_free is None or turns[first_free].role != "tool":
            break
        ordered.remove(first_free)
        used -= counts[first_free]
    return Truncation(kept=tuple(ordered), token_count=used)
