"""Prompt-injection and jailbreak detector: weighted phrase patterns over normalized text.

Every pattern belongs to a category (the finding's entity type) and carries a
weight; a text's score is ``1 - prod(1 - w)`` over the patterns that matched
(so two weak signals, e.g. "the instructions you were given" and "at the start of
this chat", add up to a finding), plus a bonus when the match only appeared after undoing
an obfuscation (zero-width characters, homoglyphs, leetspeak, spacing, base64).
The patterns live in :mod:`policy.detectors.injection_patterns`; a pattern is
only run when some word of the text starts with one of its anchors.

Retrieved documents (indirect injection) get extra patterns for text that
addresses the model instead of the reader. A phrase quoted inside a question about
prompt injection ("what does 'ignore previous instructions' mean?") is damped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import regex

from policy.detectors.base import (
    Match,
    ScanContext,
    option_number,
    reject_unknown,
)
from policy.detectors.injection_patterns import PATTERNS, Words
from policy.normalize import variants

OBFUSCATION_BONUS = 0.15
QUOTED_DAMPING = 0.3


_QUOTED = regex.compile(r"\"[^\"\n]{3,300}\"|“[^”\n]{3,300}”|«[^»\n]{3,300}»|`[^`\n]{3,300}`|'[^'\n]{8,300}'")
_META = regex.compile(
    r"prompt injection|injection attack|jailbreak(?:ing)? (?:attack|prompt|attempt)s?|what does|what do|"
    r"\bmeans?\b|explain|example|classif|detect|defend|protect|red team|research|\bpaper\b|article|"
    r"security training|phishing|awareness|quiz|what is the meaning"
)
_DOCUMENT_CUE_IN_MESSAGE = 0.6


@dataclass(frozen=True, slots=True)
class _Hit:
    category: str
    weight: float
    obfuscation: str


class InjectionDetector:
    """Scores a text for prompt injection; one finding (the whole text) when over ``threshold``."""

    # It matches the forms of ``variants`` (which include ``normalized``): the engine need not.
    normalizes_text = True

    def __init__(self, options: Mapping[str, Any]) -> None:
        reject_unknown(options, {"threshold", "document_threshold"})
        self.threshold = option_number(options, "threshold", 0.5, low=0.01, high=1.0)
        self.document_threshold = option_number(
            options, "document_threshold", self.threshold, low=0.01, high=1.0
        )

    @property
    def max_span(self) -> int:
        return 0

    def score(self, text: str, ctx: ScanContext) -> tuple[float, str, str]:
        """(score, strongest category, the obfuscation that hid it or "")."""
        # The strongest hit of each pattern (over the variants); distinct patterns add up.
        best: dict[int, _Hit] = {}
        for variant in variants(text):
            quoted_only = not ctx.document and _META.search(variant.text) is not None
            quotes = [m.span() for m in _QUOTED.finditer(variant.text)] if quoted_only else []
            # Closed-up spacing glues words together: anchors would miss, so run every pattern.
            indices = (
                range(len(PATTERNS)) if variant.obfuscation == "spacing" else Words(variant.text).candidates()
            )
            for index in indices:
                pattern = PATTERNS[index]
                m = pattern.regex.search(variant.text)
                if m is None:
                    continue
                weight = pattern.weight
                if pattern.document_cue and not ctx.document:
                    weight *= _DOCUMENT_CUE_IN_MESSAGE
                if quoted_only and any(a <= m.start() and m.end() <= b for a, b in quotes):
                    weight *= QUOTED_DAMPING
                hit = _Hit(pattern.category, weight, variant.obfuscation)
                current = best.get(index)
                if current is None or hit.weight > current.weight:
                    best[index] = hit
        if not best:
            return 0.0, "", ""
        remaining = 1.0
        for hit in best.values():
            remaining *= 1.0 - hit.weight
        score = 1.0 - remaining
        top = max(best.values(), key=lambda h: h.weight)
        obfuscation = next((h.obfuscation for h in best.values() if h.obfuscation), "")
        if obfuscation:
            score = min(1.0, score + OBFUSCATION_BONUS)
        return score, top.category, obfuscation

    def scan(self, text: str, ctx: ScanContext, start: int = 0) -> list[Match]:
        """Scores the whole text (context included); the finding covers the text from ``start``."""
        score, category, obfuscation = self.score(text, ctx)
        threshold = self.document_threshold if ctx.document else self.threshold
        if score < threshold or start >= len(text) > 0:
            return []
        return [Match(start, len(text), category, round(score, 4), obfuscation)]

    def pending_start(self, text: str, start: int = 0) -> int | None:
        return None
