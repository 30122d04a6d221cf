"""What every detector is: text in, matches out, plus what streaming needs to know.

A detector never decides an action; the rule that uses it does. Detectors are
built from a rule's ``options`` mapping and are immutable afterwards, so one
instance is shared by every request that uses the ruleset.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import regex


class DetectorConfigError(ValueError):
    """A rule's options are wrong; ``key`` names the option (for the line number)."""

    def __init__(self, reason: str, key: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.key = key


@dataclass(frozen=True, slots=True)
class Match:
    """One hit: a span of the scanned text (``end`` exclusive)."""

    start: int
    end: int
    entity_type: str
    score: float = 1.0
    # The matched value as redaction should see it (e.g. a card number without spaces).
    value: str = ""


@dataclass(frozen=True, slots=True)
class ScanContext:
    """Where the text comes from: a chat message, a retrieved document, or an answer (output)."""

    document: bool = False
    output: bool = False


MESSAGE = ScanContext(document=False)
DOCUMENT = ScanContext(document=True)
# An answer, whole (CheckOutput) or streamed (CheckOutputStream).
OUTPUT = ScanContext(output=True)


class Detector(Protocol):
    """A detector as the engine and the stream moderator use it."""

    # Longest span one match can cover, in characters: what a stream must hold back
    # at most for this detector (0 = it does not need to see text across chunks).
    @property
    def max_span(self) -> int: ...

    def scan(self, text: str, ctx: ScanContext, start: int = 0) -> list[Match]:
        """Every match in ``text`` that begins at or after ``start``.

        Text before ``start`` is context only (look-behinds, context words): the stream
        moderator passes some already released text that way.
        """
        ...

    def pending_start(self, text: str, start: int = 0) -> int | None:
        """Earliest index (>= ``start``) from which a match could still form or grow with more text.

        ``None`` when no match can start in what has been seen so far. The stream
        moderator holds back text from this index on.
        """
        ...


def pending_start_of(patterns: Sequence[regex.Pattern[str]], text: str, start: int = 0) -> int | None:
    """Earliest start of a match that is not final yet: partial, touching the end, or extendable."""
    best: int | None = None
    end = len(text)
    for pattern in patterns:
        for m in pattern.finditer(text, pos=start, partial=True):
            found = m.start()
            if best is not None and found >= best:
                break
            # A complete match that more text could still extend ("4111 1111 1111 " + "1111")
            # is pending too: the text from its start is a prefix of a longer match.
            if m.partial or m.end() == end or pattern.fullmatch(text, pos=found, partial=True):
                best = found
                break
    return best


def option_str_list(options: Mapping[str, Any], key: str, *, required: bool = False) -> list[str]:
    value = options.get(key)
    if value is None:
        if required:
            raise DetectorConfigError(f"option {key!r} is required", key)
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise DetectorConfigError(f"option {key!r} must be a list of non-empty strings", key)
    return list(value)


def option_number(options: Mapping[str, Any], key: str, default: float, *, low: float, high: float) -> float:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DetectorConfigError(f"option {key!r} must be a number", key)
    if not low <= value <= high:
        raise DetectorConfigError(f"option {key!r} must be between {low:g} and {high:g}", key)
    return float(value)


def option_bool(options: Mapping[str, Any], key: str, default: bool) -> bool:
    value = options.get(key, default)
    if not isinstance(value, bool):
        raise DetectorConfigError(f"option {key!r} must be true or false", key)
    return value


def reject_unknown(options: Mapping[str, Any], known: set[str]) -> None:
    for key in options:
        if key not in known:
            allowed = ", ".join(sorted(known)) or "none"
            raise DetectorConfigError(f"unknown option {key!r} (allowed: {allowed})", key)
