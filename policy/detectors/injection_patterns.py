"""How the injection detector's phrase patterns are compiled and prefiltered.

The phrases themselves are in :mod:`policy.detectors.injection_phrases` and
:mod:`policy.detectors.injection_more`. In a phrase, a space stands for any run of
separators (including none, so letter-by-letter spacing closed up still matches)
and ``{gN}`` for up to N filler words. Each pattern also yields its *anchors*:
literals one of which starts every match. A text none of whose words starts with
an anchor cannot match, which lets the detector skip most patterns on most texts.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import regex

from policy.detectors import injection_more, injection_phrases

# Filler words: alphanumeric runs, each followed by at least one separator (unambiguous, so cheap).
_GAP = r"(?:[^\W_]+[\W_]+){0,%d}?"


@dataclass(frozen=True)
class Pattern:
    category: str
    weight: float
    regex: regex.Pattern[str]
    # Only in retrieved documents at full weight; in messages it counts for less.
    document_cue: bool = False
    anchors: tuple[str, ...] | None = None


def _compile(source: str) -> regex.Pattern[str]:
    # "{g3}" = up to 3 filler words; " " = any separators (or none).
    source = source.replace(" ", r"[\W_]*")
    source = regex.sub(r"\{g(\d)\}", lambda m: _GAP % int(m.group(1)), source)
    return regex.compile(source, regex.VERSION0)


_TABLE = injection_phrases.TABLE + injection_more.TABLE


_LITERAL = regex.compile(r"[a-z\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]+")


def _split_top(s: str) -> tuple[list[str], int]:
    """Splits ``s`` at its depth-0 ``|`` up to an unmatched ``)``; returns the parts and where it stopped."""
    parts: list[str] = []
    depth, i, start = 0, 0, 0
    while i < len(s):
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            i = s.index("]", i + 2) + 1
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:
                break
            depth -= 1
        elif c == "|" and depth == 0:
            parts.append(s[start:i])
            start = i + 1
        i += 1
    parts.append(s[start:i])
    return parts, i


def _literal_prefix(alt: str) -> str | None:
    m = _LITERAL.match(alt)
    if m is None:
        return None
    literal = m.group()
    if alt[len(literal) : len(literal) + 1] in ("?", "*", "{"):
        literal = literal[:-1]  # the last letter is optional
    return literal or None


def _branch_anchors(branch: str) -> list[str] | None:
    s = branch.removeprefix(r"\b")
    if not s.startswith("(?:"):
        literal = _literal_prefix(s)
        return None if literal is None else [literal]
    alternatives, end = _split_top(s[3:])
    if s[3 + end + 1 : 3 + end + 2] in ("?", "*", "{"):
        return None  # an optional first group: the text may start with what follows it
    out: list[str] = []
    for alt in alternatives:
        literal = _literal_prefix(alt)
        if literal is None:
            return None
        out.append(literal)
    return out


def anchors_of(source: str) -> tuple[str, ...] | None:
    """Literals one of which starts every match (a word prefix, or a CJK substring); None if unknown."""
    out: list[str] = []
    for branch in _split_top(source)[0]:
        anchors = _branch_anchors(branch)
        if anchors is None:
            return None
        out.extend(anchors)
    return tuple(out)


_WORD = regex.compile(r"[^\W_]+")


class Words:
    """The words of a text, for "does any word start with this anchor" questions."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.sorted = sorted(set(_WORD.findall(text)))

    def has_prefix(self, prefix: str) -> bool:
        if not prefix.isascii():
            return prefix in self.text  # CJK text has no spaces: a substring test
        i = bisect.bisect_left(self.sorted, prefix)
        return i < len(self.sorted) and self.sorted[i].startswith(prefix)

    def may_match(self, pattern: Pattern) -> bool:
        return pattern.anchors is None or any(self.has_prefix(a) for a in pattern.anchors)

    def candidates(self) -> list[int]:
        """Indices into :data:`PATTERNS` of the patterns that may match, in order: the same
        answer as :meth:`may_match` on each, from one look-up per word prefix."""
        return _INDEX.candidates(self)


class AnchorIndex:
    """Which patterns each anchor admits: a text's words are looked up by their prefixes
    (a few dozen dict look-ups) instead of every pattern's anchors bisected into them."""

    def __init__(self, patterns: tuple[Pattern, ...]) -> None:
        self.always: set[int] = set()
        self.by_prefix: dict[str, set[int]] = {}
        # CJK anchors: a substring test each (CJK text has no spaces to find words by).
        self.substrings: dict[str, set[int]] = {}
        for i, pattern in enumerate(patterns):
            if pattern.anchors is None:
                self.always.add(i)
                continue
            for anchor in pattern.anchors:
                table = self.by_prefix if anchor.isascii() else self.substrings
                table.setdefault(anchor, set()).add(i)
        self.longest = max(map(len, self.by_prefix), default=0)

    def candidates(self, words: Words) -> list[int]:
        found = set(self.always)
        by_prefix, longest = self.by_prefix, self.longest
        for word in words.sorted:
            for k in range(1, min(len(word), longest) + 1):
                hit = by_prefix.get(word[:k])
                if hit is not None:
                    found |= hit
        for anchor, indices in self.substrings.items():
            if anchor in words.text:
                found |= indices
        return sorted(found)


PATTERNS = tuple(Pattern(cat, w, _compile(src), doc, anchors_of(src)) for cat, w, src, doc in _TABLE)
_INDEX = AnchorIndex(PATTERNS)
