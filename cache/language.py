"""Which language a prompt is in, so the semantic cache compares prompts of one language only.

The semantic index is partitioned by language: a prompt is only ever compared with
cached prompts of its own language, so a question in one language can never be
answered from a near-miss in another (cross-language paraphrases are out of scope
and never hit). Identification is ``py3langid`` (BSD-3-Clause; naive Bayes over
byte n-grams, model shipped in the package, ~25 µs a prompt) restricted to
:data:`LANGUAGES`. A short prompt it is unsure of (top probability below
``min_confidence``) goes to ``default``: a misread language only ever costs a hit.
"""

from __future__ import annotations

import threading
from typing import Any

LANGUAGES = (
    "en", "de", "fr", "es", "pt", "it", "nl", "ru", "uk", "pl", "cs", "sv", "da", "no", "fi",
    "tr", "ar", "he", "hi", "zh", "ja", "ko", "vi", "id",
)  # fmt: skip


_LOCK = threading.Lock()
_IDENTIFIER: Any = None


def _identifier() -> Any:
    """py3langid's identifier restricted to :data:`LANGUAGES`, loaded once per process."""
    global _IDENTIFIER
    with _LOCK:
        if _IDENTIFIER is None:
            from py3langid.langid import MODEL_FILE, LanguageIdentifier

            ident = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
            ident.set_languages(list(LANGUAGES))
            _IDENTIFIER = ident
        return _IDENTIFIER


class LanguageId:
    """A prompt's language, or ``default`` when unsure."""

    def __init__(self, default: str = "en", min_confidence: float = 0.6) -> None:
        self.default = default
        self.min_confidence = min_confidence

    def detect(self, text: str) -> str:
        ident = _IDENTIFIER or _identifier()
        language, probability = ident.classify(text)
        return str(language) if probability >= self.min_confidence else self.default
