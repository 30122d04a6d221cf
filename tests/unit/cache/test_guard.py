"""The semantic guard: numbers, negation and named entities."""

from __future__ import annotations

import pytest

from cache.guard import entities, negations, numbers, reject_reason


def test_numbers_normalize_digits_and_words() -> None:
    assert numbers("convert 1,000 km") == numbers("convert 1000 km")
    assert numbers("five apples") == numbers("5 apples")
    assert numbers("5 apples") != numbers("50 apples")


def test_negation_counts_contractions() -> None:
    assert negations("is it safe") == 0
    assert negations("isn't it safe") == 1
    assert negations("it is not safe, never") == 2


def test_entities_ignore_sentence_starters_and_keep_names() -> None:
    assert entities("What is the capital of France?") == {"france"}
    assert entities("Which city is France's capital?") == {"france"}
    assert entities("How do I use asyncio.gather in Python") == {"asyncio.gather", "python"}
    assert entities('Explain "foo bar" please') == {"foo bar"}


@pytest.mark.parametrize(
    ("a", "b", "reason"),
    [
        ("How many days are in 2 weeks?", "How many days are in 3 weeks?", "numbers"),
        ("Is coffee bad for you?", "Is coffee not bad for you?", "negation"),
        ("What is the population of Paris?", "What is the population of London?", "entities"),
        ("Tell me about the iPhone 15", "Tell me about the iPhone 14", "numbers"),
    ],
)
def test_near_misses_are_rejected(a: str, b: str, reason: str) -> None:
    found = reject_reason(a, b)
    assert found is not None
    assert reason in found


def test_paraphrases_pass() -> None:
    assert reject_reason("What's the capital of France?", "Which city is the capital of France?") is None
    assert reject_reason("how do i reverse a list in python", "Reverse a Python list: how?") is None
