"""Precision and recall of the detectors on the labeled corpus (``benchmarks/data/policy_corpus.jsonl``).

Each corpus line is one text with a label. PII positives list the entity types
they contain: a positive counts as found only if every listed type is found; a
negative counts as a false positive if anything at all is found. Injection items
say whether the text is a message or a retrieved document (indirect injection),
and are scanned as such. Used by ``llmesh bench policy`` and by a test that
keeps the figures from regressing.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from policy.detectors.base import DOCUMENT, MESSAGE
from policy.detectors.injection import InjectionDetector
from policy.detectors.pii import PiiDetector

CORPUS = Path(__file__).parent / "data" / "policy_corpus.jsonl"


@dataclass
class Counts:
    tp: int = 0
    fn: int = 0
    fp: int = 0
    tn: int = 0

    def add(self, label: bool, hit: bool) -> None:
        """One item: a positive found or missed, a negative flagged or passed."""
        if label:
            self.tp += hit
            self.fn += not hit
        else:
            self.fp += hit
            self.tn += not hit

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else float("nan")

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else float("nan")

    @property
    def false_positive_rate(self) -> float:
        return self.fp / (self.fp + self.tn) if self.fp + self.tn else float("nan")

    def figures(self, *, precision: bool = False) -> dict[str, Any]:
        """The columns of a result row: counts and rates (rounded)."""
        out: dict[str, Any] = {"positives": self.tp + self.fn, "negatives": self.fp + self.tn}
        out["recall"] = round(self.recall, 4)
        if precision:
            out["precision"] = round(self.precision, 4)
        out["false_positive_rate"] = round(self.false_positive_rate, 4)
        return out


@dataclass
class Evaluation:
    """Counts per detector and per group (entity type or injection category)."""

    detectors: dict[str, Counts] = field(default_factory=lambda: defaultdict(Counts))
    groups: dict[tuple[str, str], Counts] = field(default_factory=lambda: defaultdict(Counts))
    misses: list[str] = field(default_factory=list)
    false_positives: list[str] = field(default_factory=list)
    items: int = 0

    def rows(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for name, c in sorted(self.detectors.items()):
            out.append(_row(name, "all", c))
        for (name, group), c in sorted(self.groups.items()):
            out.append(_row(name, group, c))
        return out


def _row(detector: str, group: str, c: Counts) -> dict[str, Any]:
    return {"detector": detector, "group": group, **c.figures(precision=True)}


def load(path: Path = CORPUS) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def evaluate(items: Iterable[dict[str, Any]] | None = None) -> Evaluation:
    pii = PiiDetector({})
    injection = InjectionDetector({})
    result = Evaluation()
    for item in items if items is not None else load():
        result.items += 1
        text, label, detector = item["text"], bool(item["label"]), item["detector"]
        if detector == "pii":
            found = {m.entity_type for m in pii.scan(text, MESSAGE)}
            expected = set(item.get("entities", []))
            hit = expected <= found if label else bool(found)
            groups = sorted(expected) if label else ["negative"]
        elif detector == "injection":
            ctx = DOCUMENT if item.get("where") == "document" else MESSAGE
            hit = bool(injection.scan(text, ctx))
            groups = [item.get("category", "other")]
        else:
            raise ValueError(f"corpus item {item.get('id')}: unknown detector {detector!r}")
        for counts in [result.detectors[detector], *(result.groups[(detector, g)] for g in groups)]:
            counts.add(label, hit)
        if label and not hit:
            result.misses.append(item["id"])
        elif hit and not label:
            result.false_positives.append(item["id"])
    return result


def main() -> None:  # pragma: no cover - a developer's view of the corpus
    ev = evaluate()
    for row in ev.rows():
        print(row)
    items = {i["id"]: i for i in load()}
    for kind, ids in (("missed", ev.misses), ("false positive", ev.false_positives)):
        for item_id in ids:
            print(kind, item_id, repr(items[item_id]["text"][:100]))


if __name__ == "__main__":
    main()
