"""Rule-author detectors: regular expressions, keyword lists, topic denylists, maximum length.

Patterns use the ``regex`` module (a superset of ``re``) because it can tell when a
match could still complete if more text arrived (``partial=True``), which is what
lets the stream moderator hold back only the text a rule could still match.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import regex

from policy.detectors.base import (
    DetectorConfigError,
    Match,
    ScanContext,
    option_bool,
    option_number,
    option_str_list,
    pending_start_of,
    reject_unknown,
)
from services.runtime.text import UNSPACED_CLASS, writes_no_spaces

log = logging.getLogger(__name__)

# A user-written pattern gets this long per scan before it is abandoned (catastrophic backtracking).
PATTERN_TIMEOUT_S = 0.05


def _entity(options: Mapping[str, Any], default: str) -> str:
    value = options.get("entity_type", default)
    if not isinstance(value, str) or not value or not value.replace("_", "").isalnum():
        raise DetectorConfigError(
            "option 'entity_type' must be letters, digits and underscores", "entity_type"
        )
    return value.upper()


class RegexDetector:
    """Matches any of a list of regular expressions."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        reject_unknown(options, {"patterns", "ignore_case", "entity_type", "max_span"})
        flags = regex.IGNORECASE if option_bool(options, "ignore_case", True) else 0
        self.entity_type = _entity(options, "PATTERN")
        self.patterns: list[regex.Pattern[str]] = []
        for source in option_str_list(options, "patterns", required=True):
            try:
                self.patterns.append(regex.compile(source, flags | regex.VERSION0))
            except regex.error as exc:
                raise DetectorConfigError(f"invalid pattern {source!r}: {exc}", "patterns") from exc
        self._max_span = int(option_number(options, "max_span", 256, low=1, high=65536))

    @property
    def max_span(self) -> int:
        return self._max_span

    def scan(self, text: str, ctx: ScanContext, start: int = 0) -> list[Match]:
        out: list[Match] = []
        for pattern in self.patterns:
            try:
                for m in pattern.finditer(text, pos=start, timeout=PATTERN_TIMEOUT_S):
                    if m.end() > m.start():
                        out.append(Match(m.start(), m.end(), self.entity_type, 1.0, m.group()))
            except TimeoutError:
                log.warning("pattern %r timed out on %d characters; skipped", pattern.pattern, len(text))
        return out

    def pending_start(self, text: str, start: int = 0) -> int | None:
        try:
            return pending_start_of(self.patterns, text, start)
        except TimeoutError:
            return None


# A word character of a script that puts spaces between words. Chinese, Japanese, Korean, Thai,
# Lao, Myanmar and Khmer characters are word characters to ``\w`` but mark no word's end (the text
# runs on without spaces, or a Korean particle follows the word), so a whole-word keyword's end
# that is such a character needs no boundary (a substring, as the injection patterns read CJK
# anchors), and a keyword next to them is a whole word ("我用iPhone拍照" names "iPhone").
_SPACED_WORD = rf"[^\W{UNSPACED_CLASS}]"


def _whole_word(word: str) -> str:
    body = regex.escape(word).replace("\\ ", r"\s+")
    left = "" if writes_no_spaces(word[0]) else rf"(?<!{_SPACED_WORD})"
    right = "" if writes_no_spaces(word[-1]) else rf"(?!{_SPACED_WORD})"
    return left + body + right


def _keyword_pattern(words: list[str], *, whole_word: bool, case_sensitive: bool) -> regex.Pattern[str]:
    ordered = sorted(set(words), key=len, reverse=True)
    if whole_word:
        source = "(?:" + "|".join(_whole_word(w) for w in ordered) + ")"
    else:
        source = "(?:" + "|".join(regex.escape(w).replace("\\ ", r"\s+") for w in ordered) + ")"
    return regex.compile(source, 0 if case_sensitive else regex.IGNORECASE)


class KeywordDetector:
    """Matches words or phrases from a list (whole words, case-insensitive by default)."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        reject_unknown(options, {"keywords", "whole_word", "case_sensitive", "entity_type"})
        words = option_str_list(options, "keywords", required=True)
        self.entity_type = _entity(options, "KEYWORD")
        self.pattern = _keyword_pattern(
            words,
            whole_word=option_bool(options, "whole_word", True),
            case_sensitive=option_bool(options, "case_sensitive", False),
        )
        # Whitespace inside a phrase may stretch; allow some slack.
        self._max_span = max(len(w) for w in words) * 2 + 2

    @property
    def max_span(self) -> int:
        return self._max_span

    def scan(self, text: str, ctx: ScanContext, start: int = 0) -> list[Match]:
        return [
            Match(m.start(), m.end(), self.entity_type, 1.0, m.group())
            for m in self.pattern.finditer(text, pos=start)
        ]

    def pending_start(self, text: str, start: int = 0) -> int | None:
        return pending_start_of([self.pattern], text, start)


class TopicDetector:
    """A denylist of topics, each a list of keywords; ``min_hits`` distinct keywords name a topic."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        reject_unknown(options, {"topics", "min_hits"})
        topics = options.get("topics")
        if not isinstance(topics, Mapping) or not topics:
            raise DetectorConfigError("option 'topics' must map topic names to keyword lists", "topics")
        self.min_hits = int(option_number(options, "min_hits", 1, low=1, high=100))
        self.topics: list[tuple[str, regex.Pattern[str]]] = []
        longest = 1
        for name, words in topics.items():
            if not isinstance(name, str) or not name:
                raise DetectorConfigError("topic names must be non-empty strings", "topics")
            keywords = option_str_list({"topics": words}, "topics", required=True)
            longest = max(longest, *(len(w) for w in keywords))
            pattern = _keyword_pattern(keywords, whole_word=True, case_sensitive=False)
            self.topics.append((name.upper().replace(" ", "_").replace("-", "_"), pattern))
        self._max_span = longest * 2 + 2

    @property
    def max_span(self) -> int:
        return self._max_span

    def scan(self, text: str, ctx: ScanContext, start: int = 0) -> list[Match]:
        out: list[Match] = []
        for name, pattern in self.topics:
            hits = list(pattern.finditer(text, pos=start))
            if len({m.group().casefold() for m in hits}) >= self.min_hits:
                out.extend(Match(m.start(), m.end(), f"TOPIC_{name}", 1.0, m.group()) for m in hits)
        return out

    def pending_start(self, text: str, start: int = 0) -> int | None:
        return pending_start_of([p for _, p in self.topics], text, start)


class MaxLengthDetector:
    """Fires when the text is longer than ``max_chars`` (a stream counts the whole answer)."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        reject_unknown(options, {"max_chars"})
        if "max_chars" not in options:
            raise DetectorConfigError("option 'max_chars' is required", "max_chars")
        self.max_chars = int(option_number(options, "max_chars", 0, low=1, high=100_000_000))

    @property
    def max_span(self) -> int:
        return 0

    def scan(self, text: str, ctx: ScanContext, start: int = 0) -> list[Match]:
        if len(text) > self.max_chars:
            return [Match(self.max_chars, len(text), "MAX_LENGTH", 1.0, "")]
        return []

    def pending_start(self, text: str, start: int = 0) -> int | None:
        return None
