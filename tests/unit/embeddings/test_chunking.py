"""Chunking along paragraph and sentence boundaries with a token budget and overlap."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.embeddings.chunking import chunk_text, paragraph_spans, sentence_spans
from services.runtime.errors import InvalidArgument

_TOKEN = re.compile(r"\w+|[^\w\s]")


def count(texts: Sequence[str]) -> list[int]:
    """A BERT-like count: one token per word and per punctuation mark."""
    return [len(_TOKEN.findall(t)) for t in texts]


def sentences_of(text: str) -> list[str]:
    return [text[s:e] for p0, p1 in paragraph_spans(text) for s, e in sentence_spans(text, p0, p1)]


def test_sentences_split_on_terminal_punctuation_but_not_abbreviations() -> None:
    text = 'Dr. Smith arrived at 3.15 p.m. today. He said "hello!" Then he left, e.g. quickly? Yes.'
    assert sentences_of(text) == [
        "Dr. Smith arrived at 3.15 p.m. today.",
        'He said "hello!"',
        "Then he left, e.g. quickly?",
        "Yes.",
    ]


def test_paragraphs_split_on_blank_lines() -> None:
    text = "First para line one.\nStill first.\n\n  \nSecond para.\n\nThird"
    paragraphs = [text[s:e] for s, e in paragraph_spans(text)]
    assert paragraphs == ["First para line one.\nStill first.", "Second para.", "Third"]


def test_short_document_is_one_chunk_with_original_text() -> None:
    text = "  One sentence.  Two sentences.\n"
    chunks = chunk_text(text, count, max_tokens=50, overlap_tokens=5)
    assert [c.text for c in chunks] == ["One sentence.  Two sentences."]
    assert chunks[0].token_count == 6
    assert text[chunks[0].start : chunks[0].end] == chunks[0].text


def test_chunks_hold_whole_sentences_within_budget_with_overlap() -> None:
    sentences = [f"Sentence number {i} has exactly seven tokens." for i in range(20)]
    text = " ".join(sentences)
    chunks = chunk_text(text, count, max_tokens=30, overlap_tokens=8)
    assert len(chunks) > 1
    for chunk in chunks:
        assert chunk.token_count <= 30
        parts = sentences_of(chunk.text)
        assert all(p in sentences for p in parts), "a chunk cut a sentence"
    # Consecutive chunks share exactly one whole 8-token sentence (the overlap budget).
    for before, after in itertools.pairwise(chunks):
        assert sentences_of(before.text)[-1] == sentences_of(after.text)[0]
    covered = {s for c in chunks for s in sentences_of(c.text)}
    assert covered == set(sentences)


def test_no_overlap_when_zero() -> None:
    text = " ".join(f"Item {i} is here." for i in range(10))
    chunks = chunk_text(text, count, max_tokens=10, overlap_tokens=0)
    joined = [s for c in chunks for s in sentences_of(c.text)]
    assert joined == sentences_of(text)


def test_new_paragraph_starts_a_new_chunk_when_half_full() -> None:
    first = "Alpha one two three four five six. Beta one two three four five six."
    second = "Gamma one two three four five six. Delta one two three four five six."
    chunks = chunk_text(first + "\n\n" + second, count, max_tokens=24, overlap_tokens=8)
    assert [c.text for c in chunks] == [first, second]


def test_small_paragraphs_share_a_chunk() -> None:
    text = "Short one.\n\nShort two.\n\nShort three."
    chunks = chunk_text(text, count, max_tokens=100, overlap_tokens=10)
    assert [c.text for c in chunks] == [text]


def test_overlap_does_not_cross_paragraphs() -> None:
    first = " ".join(f"First {i} here." for i in range(6))
    second = " ".join(f"Second {i} here." for i in range(6))
    chunks = chunk_text(first + "\n\n" + second, count, max_tokens=16, overlap_tokens=4)
    for chunk in chunks:
        assert not ("First" in chunk.text and "Second" in chunk.text)


def test_oversized_sentence_splits_at_word_boundaries() -> None:
    words = [f"word{i}" for i in range(50)]
    text = "Intro. " + " ".join(words) + ". Outro."
    chunks = chunk_text(text, count, max_tokens=12, overlap_tokens=0)
    assert all(c.token_count <= 12 for c in chunks)
    pieces = " ".join(c.text for c in chunks).split()
    # Every word survives whole (none cut in the middle).
    assert [w for w in pieces if w.startswith("word")] == [*words[:-1], words[-1] + "."]


def test_oversized_sentence_rejected_on_request() -> None:
    text = "Fine. Long " + " ".join(["long"] * 39) + "."
    with pytest.raises(InvalidArgument, match=r"characters 6-206 has 41 tokens, over the chunk budget of 20"):
        chunk_text(text, count, max_tokens=20, overlap_tokens=0, reject_oversized=True)


def test_single_word_longer_than_budget_is_cut_inside_the_word() -> None:
    def per_char(texts: Sequence[str]) -> list[int]:
        return [len(t.replace(" ", "")) for t in texts]

    text = "ab " + "x" * 25 + " cd"
    chunks = chunk_text(text, per_char, max_tokens=10, overlap_tokens=0)
    assert all(c.token_count <= 10 for c in chunks)
    assert "".join(c.text.replace(" ", "") for c in chunks) == "ab" + "x" * 25 + "cd"


@pytest.mark.parametrize(("max_tokens", "overlap"), [(0, 0), (10, 10), (10, -1)])
def test_bad_budgets_are_invalid(max_tokens: int, overlap: int) -> None:
    with pytest.raises(InvalidArgument):
        chunk_text("Some text.", count, max_tokens=max_tokens, overlap_tokens=overlap)


_sentence = st.lists(st.sampled_from(["alpha", "beta", "gamma,", "delta", "x"]), min_size=1, max_size=12).map(
    lambda ws: " ".join(ws).capitalize() + "."
)
_paragraph = st.lists(_sentence, min_size=1, max_size=8).map(" ".join)
_document = st.lists(_paragraph, min_size=1, max_size=5).map("\n\n".join)


@settings(max_examples=150, deadline=None)
@given(text=_document, budget=st.integers(4, 40), overlap_fraction=st.floats(0, 0.9))
def test_chunking_invariants(text: str, budget: int, overlap_fraction: float) -> None:
    overlap = min(budget - 1, int(budget * overlap_fraction))
    chunks = chunk_text(text, count, max_tokens=budget, overlap_tokens=overlap)
    sentences = sentences_of(text)
    for i, chunk in enumerate(chunks):
        assert chunk.index == i
        assert chunk.text == text[chunk.start : chunk.end]
        assert 0 < chunk.token_count <= budget
        assert chunk.token_count == count([chunk.text])[0]
        assert not chunk.text[0].isspace() and not chunk.text[-1].isspace()
        # Boundaries fall between words: never inside one.
        assert chunk.start == 0 or not text[chunk.start - 1].isalnum()
        assert chunk.end == len(text) or not text[chunk.end].isalnum()
    # Chunks move forward and cover the whole document.
    assert chunks[0].start == 0 and chunks[-1].end == len(text.rstrip())
    for before, after in itertools.pairwise(chunks):
        assert before.start < after.start and before.end < after.end
        assert after.start <= before.end or text[before.end : after.start].strip() == ""
    # A sentence that fits the budget is never split.
    for sentence in sentences:
        if count([sentence])[0] <= budget:
            assert any(sentence in c.text for c in chunks)
