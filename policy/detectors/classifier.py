"""The learned stage of injection detection: a rule's view of :mod:`policy.classifier`.

Runs the shipped classifier on every normalised variant of the text (folded, leetspeak decoded,
spacing closed up, base64 payloads decoded; :func:`policy.normalize.variants`) and reports one
finding over the whole text when the highest probability reaches ``threshold`` (messages, tool
definitions) or ``document_threshold`` (retrieved documents and tool results, scored by windows).
Both default to the values the training picked on validation data (the weights file's metadata).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import regex

from policy.classifier.model import InjectionClassifier, default
from policy.detectors.base import MESSAGE, Match, ScanContext, option_number, reject_unknown
from policy.normalize import variants

ENTITY = "injection_classifier"
# An answer's sentence: up to a sentence mark followed by white space, or a line break; a longer run
# is judged in pieces of this many characters (so a stream never holds back more).
SENTENCE_CHARS = 400
_BOUNDARY = regex.compile(r"[.!?\u3002\uff01\uff1f]+(?=\s)|\n")


def sentences(text: str, start: int = 0) -> list[tuple[int, int]]:
    """(start, end) of every sentence of ``text`` that begins at or after ``start``; the last may be
    open (it ends where the text does). White space between sentences belongs to none."""
    out: list[tuple[int, int]] = []
    pos = start
    n = len(text)
    while pos < n:
        while pos < n and text[pos].isspace():
            pos += 1
        if pos >= n:
            break
        m = _BOUNDARY.search(text, pos, min(n, pos + SENTENCE_CHARS))
        end = m.end() if m is not None else min(n, pos + SENTENCE_CHARS)
        out.append((pos, end))
        pos = end
    return out


class ClassifierDetector:
    """One finding over the whole text when the classifier's probability reaches the threshold."""

    # It scores the forms of ``variants`` (which include ``normalized``): the engine need not.
    normalizes_text = True

    def __init__(self, options: Mapping[str, Any], classifier: InjectionClassifier | None = None) -> None:
        reject_unknown(options, {"threshold", "document_threshold"})
        self.classifier = classifier or default()
        meta = self.classifier.meta
        self.threshold = option_number(options, "threshold", float(meta["threshold"]), low=0.01, high=1.0)
        self.document_threshold = option_number(
            options, "document_threshold", float(meta["document_threshold"]), low=0.01, high=1.0
        )

    @property
    def max_span(self) -> int:
        # On output a finding covers one sentence of at most SENTENCE_CHARS (see ``sentences``).
        return SENTENCE_CHARS

    def score(self, text: str, ctx: ScanContext) -> tuple[float, str]:
        """(highest probability over the variants, the obfuscation that variant undid or "")."""
        best, how = 0.0, ""
        for variant in variants(text):
            p = self.classifier.score(variant.text, windowed=ctx.document)
            if p > best:
                best, how = p, variant.obfuscation
        return best, how

    def scan(self, text: str, ctx: ScanContext, start: int = 0) -> list[Match]:
        if not text.strip() or start >= len(text):
            return []
        if ctx.output:
            return self._scan_sentences(text, start)
        score, obfuscation = self.score(text, ctx)
        if score < (self.document_threshold if ctx.document else self.threshold):
            return []
        return [Match(start, len(text), ENTITY, round(score, 4), obfuscation)]

    def _scan_sentences(self, text: str, start: int) -> list[Match]:
        """An answer is judged sentence by sentence, so a stream can decide at each sentence end
        exactly what a check of the whole answer decides."""
        out: list[Match] = []
        for a, b in sentences(text, start):
            score, obfuscation = self.score(text[a:b], MESSAGE)
            if score >= self.threshold:
                out.append(Match(a, b, ENTITY, round(score, 4), obfuscation))
        return out

    def pending_start(self, text: str, start: int = 0) -> int | None:
        """On output: the start of the sentence still open at the end of ``text`` (held back until
        it ends, at most SENTENCE_CHARS); None when the text ends at a sentence end."""
        found = sentences(text, start)
        if not found:
            return None
        a, b = found[-1]
        closed = b < len(text) or text[b - 1] == "\n" or b - a >= SENTENCE_CHARS
        return None if closed else a
