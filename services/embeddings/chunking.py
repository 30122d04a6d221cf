"""Splits a document into chunks along paragraph and sentence boundaries.

A chunk holds whole sentences up to a token budget (tokens of the embedding
model's tokenizer, special tokens not counted). Consecutive chunks of one
paragraph share up to ``overlap_tokens`` of whole trailing sentences. A new
paragraph starts a new chunk when the current one is at least half full and the
paragraph would not fit in what is left. A sentence longer than the budget is the
only thing split inside a sentence, and then at word boundaries (a single word
longer than the budget, e.g. a pasted hash, is the only thing cut inside a word).
Chunk text is a slice of the original document, whitespace included.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from services.runtime.errors import InvalidArgument

TokenCounter = Callable[[Sequence[str]], list[int]]

_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n\s*")
# End of a sentence: terminal punctuation, optional closing quotes/brackets, then whitespace
# (or a CJK full stop, which needs none).
_CLOSERS = "\"')]\u201d\u2019"  # quotes and brackets that may follow the final punctuation
_SENTENCE_END = re.compile(
    "(?:[.!?\u2026]+[" + re.escape(_CLOSERS) + "]*(?=\\s)"
    "|[\u3002\uff01\uff1f]+[" + re.escape(_CLOSERS) + "\u300d\u300f]*)"
)
_WORD = re.compile(r"\S+")
# Abbreviations whose period does not end a sentence (compared lowercased, without the period).
_ABBREVIATIONS = frozenset(
    {
        *("e.g", "i.e", "etc", "vs", "cf", "al", "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st"),
        *("no", "fig", "eq", "approx", "dept", "inc", "ltd", "co", "corp"),
        *("jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec"),
    }
)


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk: its position, its text (a slice of the document) and its token count."""

    index: int
    text: str
    start: int
    end: int
    token_count: int


@dataclass(frozen=True, slots=True)
class _Unit:
    """A sentence, or a piece of an over-long sentence, as a span of the document."""

    start: int
    end: int
    tokens: int
    paragraph: int
    paragraph_start: bool


def paragraph_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each non-blank paragraph, whitespace trimmed."""
    spans: list[tuple[int, int]] = []
    pos = 0
    for match in [*_PARAGRAPH_BREAK.finditer(text), None]:
        end = match.start() if match else len(text)
        spans.extend(_trimmed(text, pos, end))
        if match:
            pos = match.end()
    return spans


def sentence_spans(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """(start, end) of each sentence of ``text[start:end]``, whitespace trimmed."""
    spans: list[tuple[int, int]] = []
    pos = start
    for match in _SENTENCE_END.finditer(text, start, end):
        if _continues(text, match.end(), end) or _is_abbreviation(text, pos, match.start(), match.group()):
            continue
        spans.extend(_trimmed(text, pos, match.end()))
        pos = match.end()
    spans.extend(_trimmed(text, pos, end))
    return spans


def _continues(text: str, after: int, end: int) -> bool:
    """True when the next word starts in lower case ("p.m. today", "e.g. this"): no new sentence."""
    nxt = after
    while nxt < end and text[nxt].isspace():
        nxt += 1
    return nxt < end and text[nxt].islower()


def _is_abbreviation(text: str, sentence_start: int, at: int, mark: str) -> bool:
    if not mark.startswith("."):
        return False
    word_start = at
    while word_start > sentence_start and not text[word_start - 1].isspace():
        word_start -= 1
    word = text[word_start:at].lstrip("(\"'[\u201c\u2018").lower()
    if word in _ABBREVIATIONS:
        return True
    # An initial ("J. Smith") or a list marker ("3. Step").
    return len(word) == 1 and (word.isalpha() or word.isdigit())


def _trimmed(text: str, start: int, end: int) -> list[tuple[int, int]]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return [(start, end)] if end > start else []


def chunk_text(
    text: str,
    count_tokens: TokenCounter,
    *,
    max_tokens: int,
    overlap_tokens: int,
    reject_oversized: bool = False,
    label: str = "document",
) -> list[Chunk]:
    """Chunks of ``text``; with ``reject_oversized`` a sentence over the budget is an error instead."""
    if max_tokens < 1:
        raise InvalidArgument(f"chunk max_tokens must be at least 1, got {max_tokens}")
    if not 0 <= overlap_tokens < max_tokens:
        raise InvalidArgument(
            f"chunk overlap_tokens must be between 0 and max_tokens - 1 ({max_tokens - 1}), "
            f"got {overlap_tokens}"
        )
    sentences: list[tuple[int, int, int, bool]] = []
    for paragraph, (p_start, p_end) in enumerate(paragraph_spans(text)):
        for i, (s_start, s_end) in enumerate(sentence_spans(text, p_start, p_end)):
            sentences.append((s_start, s_end, paragraph, i == 0))
    counts = count_tokens([text[s:e] for s, e, _, _ in sentences])
    units: list[_Unit] = []
    for (s_start, s_end, paragraph, first), tokens in zip(sentences, counts, strict=True):
        if tokens <= max_tokens:
            units.append(_Unit(s_start, s_end, tokens, paragraph, first))
            continue
        if reject_oversized:
            raise InvalidArgument(
                f"{label}: the sentence at characters {s_start}-{s_end} has {tokens} tokens, over the "
                f"chunk budget of {max_tokens} (reject_oversized is set)"
            )
        pieces = _split_long_sentence(text, s_start, s_end, count_tokens, max_tokens)
        units.extend(
            _Unit(start, end, n, paragraph, first and k == 0) for k, (start, end, n) in enumerate(pieces)
        )
    return _pack(text, units, max_tokens, overlap_tokens)


def _paragraph_tokens(units: Sequence[_Unit]) -> dict[int, int]:
    totals: dict[int, int] = {}
    for unit in units:
        totals[unit.paragraph] = totals.get(unit.paragraph, 0) + unit.tokens
    return totals


def _pack(text: str, units: Sequence[_Unit], max_tokens: int, overlap_tokens: int) -> list[Chunk]:
    paragraph_tokens = _paragraph_tokens(units)
    chunks: list[Chunk] = []
    current: list[_Unit] = []
    used = 0

    def emit() -> None:
        start, end = current[0].start, current[-1].end
        chunks.append(Chunk(len(chunks), text[start:end], start, end, used))

    for unit in units:
        if current and unit.paragraph_start:
            fits = used + paragraph_tokens[unit.paragraph] <= max_tokens
            if not fits and used * 2 >= max_tokens:
                emit()
                current, used = [], 0
        if current and used + unit.tokens > max_tokens:
            emit()
            current = _overlap(current, unit, overlap_tokens, max_tokens)
            used = sum(u.tokens for u in current)
        current.append(unit)
        used += unit.tokens
    if current:
        emit()
    return chunks


def _overlap(
    previous: Sequence[_Unit], following: _Unit, overlap_tokens: int, max_tokens: int
) -> list[_Unit]:
    """Trailing whole units of ``previous`` (same paragraph as ``following``) within the overlap."""
    tail: list[_Unit] = []
    budget = min(overlap_tokens, max_tokens - following.tokens)
    total = 0
    for unit in reversed(previous[1:]):
        if unit.paragraph != following.paragraph or total + unit.tokens > budget:
            break
        tail.insert(0, unit)
        total += unit.tokens
    return tail


def _split_long_sentence(
    text: str, start: int, end: int, count_tokens: TokenCounter, max_tokens: int
) -> list[tuple[int, int, int]]:
    """Pieces of one over-long sentence at word boundaries, each within ``max_tokens``."""
    words = [(m.start() + start, m.end() + start) for m in _WORD.finditer(text[start:end])]
    counts = count_tokens([text[s:e] for s, e in words])
    spans: list[tuple[int, int, int]] = []
    for (w_start, w_end), tokens in zip(words, counts, strict=True):
        if tokens <= max_tokens:
            spans.append((w_start, w_end, tokens))
        else:
            spans.extend(_split_long_word(text, w_start, w_end, count_tokens, max_tokens))
    pieces: list[tuple[int, int, int]] = []
    piece_start, piece_end, used = spans[0]
    for w_start, w_end, tokens in spans[1:]:
        if used + tokens > max_tokens:
            pieces.append((piece_start, piece_end, used))
            piece_start, used = w_start, 0
        piece_end = w_end
        used += tokens
    pieces.append((piece_start, piece_end, used))
    return pieces


def _split_long_word(
    text: str, start: int, end: int, count_tokens: TokenCounter, max_tokens: int
) -> list[tuple[int, int, int]]:
    """Character pieces of one word longer than the budget (the only cut inside a word)."""
    pieces: list[tuple[int, int, int]] = []
    pos = start
    while pos < end:
        size = min(end - pos, max_tokens)  # a token covers at least one character
        while True:
            cut = pos + size
            tokens = count_tokens([text[pos:cut]])[0]
            if tokens <= max_tokens or size == 1:
                break
            size = max(1, size * max_tokens // tokens)
        # Grow while it still fits, so pieces are not needlessly small.
        while cut < end:
            bigger = min(end, cut + max(1, (cut - pos) // 4))
            grown = count_tokens([text[pos:bigger]])[0]
            if grown > max_tokens:
                break
            cut, tokens = bigger, grown
        pieces.append((pos, cut, tokens))
        pos = cut
    return pieces
