from __future__ import annotations

from collections import Counter

from benchmarks.policy_eval import evaluate, load


def test_corpus_is_large_and_labeled() -> None:
    items = load()
    assert len(items) >= 300
    assert len({i["id"] for i in items}) == len(items)
    kinds = Counter((i["detector"], i["label"]) for i in items)
    assert min(kinds.values()) >= 100
    langs = {i.get("lang") for i in items if i["detector"] == "injection" and i["label"]}
    assert {"zh", "es", "de", "fr"} <= langs
    assert any(i.get("where") == "document" and i["label"] for i in items)


def test_detectors_do_not_regress_on_the_whole_corpus() -> None:
    # Guards against regressions; the blind holdout figures are reported by `llmesh bench policy`.
    ev = evaluate()
    pii, injection = ev.detectors["pii"], ev.detectors["injection"]
    assert pii.recall >= 0.97 and pii.false_positive_rate <= 0.02
    assert injection.recall >= 0.8 and injection.false_positive_rate <= 0.03
