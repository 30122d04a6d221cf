"""The semantic guard: numbers, negation and named entities."""

from __future__ import annotations

import pytest

from cache.guard import core_question, entities, negations, numbers, reject_reason, roles_swapped


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


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Is Python faster than Java?", "Is Java faster than Python?"),
        ("How do I move money from savings to checking?", "How do I move money from checking to savings?"),
        (
            "How do I transfer my ISA from Hargreaves Lansdown to Vanguard?",
            "I want to move my Vanguard ISA over to Hargreaves Lansdown, what do I do?",
        ),
        ("Translate this from French into German", "Translate this from German into French"),
    ],
)
def test_swapped_roles_are_rejected(a: str, b: str) -> None:
    reason = reject_reason(a, b)
    assert reason is not None, (a, b)
    assert reject_reason(b, a) is not None


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Is Python faster than Java?", "Is Python quicker than Java?"),
        (
            "How do I get from the airport to the hotel?",
            "What is the best way to reach the hotel from the airport?",
        ),
        ("Send the report to finance", "Please send finance the report"),
    ],
)
def test_same_roles_in_other_words_pass_the_role_check(a: str, b: str) -> None:
    assert roles_swapped(a, b) is None


@pytest.mark.parametrize(
    ("text", "core"),
    [
        (
            "Hi! What is the notice period to end my tenancy? Cheers",
            "What is the notice period to end my tenancy?",
        ),
        ("Sorry, silly question, but how do I bleed a radiator?", "How do I bleed a radiator?"),
        ("Quick question, how do I transfer my number? Many thanks", "How do I transfer my number?"),
        ("How do I say thank you in French?", "How do I say thank you in French?"),
        ("Thanks", "Thanks"),
    ],
)
def test_core_question_drops_greetings_and_thanks(text: str, core: str) -> None:
    assert core_question(text) == core


def test_entities_tolerate_plurals_and_one_letter_typos_of_long_words() -> None:
    assert reject_reason("When do you open on Mondays?", "When do you open on Mondys?") is None
    assert reject_reason("Is the clinic open on Sundays?", "Is the clinic open on a Sunday?") is None
    assert reject_reason("Is Java fast?", "Is Jana fast?") is not None
