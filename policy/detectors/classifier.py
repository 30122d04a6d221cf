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

from policy.classifier.model import InjectionClassifier, default
from policy.detectors.base import Match, ScanContext, option_number, reject_unknown
from policy.normalize import variants

ENTITY = "injection_classifier"


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
        return 0

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
        score, obfuscation = self.score(text, ctx)
        if score < (self.document_threshold if ctx.document else self.threshold):
            return []
        return [Match(start, len(text), ENTITY, round(score, 4), obfuscation)]

    def pending_start(self, text: str, start: int = 0) -> int | None:
        return None
