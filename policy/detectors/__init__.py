"""Detectors by the name a rule's ``detector`` field uses."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from policy.detectors.base import Detector, DetectorConfigError, Match, ScanContext
from policy.detectors.classifier import ClassifierDetector
from policy.detectors.injection import InjectionDetector
from policy.detectors.lexical import KeywordDetector, MaxLengthDetector, RegexDetector, TopicDetector
from policy.detectors.pii import PiiDetector

DETECTORS: dict[str, Callable[[Mapping[str, Any]], Detector]] = {
    "regex": RegexDetector,
    "keyword": KeywordDetector,
    "topic": TopicDetector,
    "max_length": MaxLengthDetector,
    "pii": PiiDetector,
    "injection": InjectionDetector,
    "classifier": ClassifierDetector,
}


def build(name: str, options: Mapping[str, Any]) -> Detector:
    """A detector from its name and options; DetectorConfigError if either is wrong."""
    factory = DETECTORS.get(name)
    if factory is None:
        raise DetectorConfigError(f"unknown detector {name!r} (known: {', '.join(sorted(DETECTORS))})")
    return factory(options)


__all__ = ["DETECTORS", "Detector", "DetectorConfigError", "Match", "ScanContext", "build"]
