from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from benchmarks.semantic_datasets import (
    LabeledPair,
    blind_multilingual_pairs,
    blind_related_pairs,
    blind_training_pairs,
)


def _pair(pair_id: str, a: str, b: str, *, same: bool = True) -> LabeledPair:
    return LabeledPair("t", pair_id, a, b, same, "paraphrase")


def test_the_blind_training_set_is_whole_and_labeled() -> None:
    pairs = blind_training_pairs([])
    assert len(pairs) == 1000
    assert len({p.id for p in pairs}) == len(pairs)
    kinds = Counter((p.kind, p.same) for p in pairs)
    # Both answers, and every trap kind the cache is measured on.
    assert kinds[("paraphrase", True)] >= 300
    for trap in ("negation", "role_swap", "number_date", "scope"):
        assert kinds[(trap, False)] >= 100


def test_the_blind_related_set_is_whole_and_labeled() -> None:
    pairs = blind_related_pairs([])
    assert len(pairs) == 800
    assert len({p.id for p in pairs}) == len(pairs)
    assert {p.source for p in pairs} == {"train-blind-related"}
    kinds = Counter((p.kind, p.same) for p in pairs)
    assert kinds == {("related_different", False): 400, ("paraphrase", True): 400}


def test_the_blind_multilingual_set_is_whole_labeled_and_in_one_language_a_pair() -> None:
    pairs = blind_multilingual_pairs([])
    assert len(pairs) == 800
    assert len({p.id for p in pairs}) == len(pairs)
    assert not any(p.cross_language for p in pairs)
    languages = Counter(p.lang_a for p in pairs)
    assert languages == dict.fromkeys(("de", "fr", "es", "pt", "it", "nl", "ru", "zh"), 100)
    kinds = Counter((p.kind, p.same) for p in pairs)
    assert kinds[("paraphrase", True)] == 320
    for trap in ("negation", "role_swap", "number_entity", "scope", "related"):
        assert kinds[(trap, False)] == 80


def test_a_training_pair_sharing_a_prompt_with_a_held_out_pair_is_left_out(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    rows = [
        {
            "id": "1",
            "category": "paraphrase",
            "a": "How do I boil an egg?",
            "b": "Egg boiling?",
            "same_answer": True,
        },
        {
            "id": "2",
            "category": "scope",
            "a": "Capital of Austria?",
            "b": "Capital of Australia?",
            "same_answer": False,
        },
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    held_out = [_pair("x", "capital of  AUSTRALIA?", "Where is Sydney?")]
    kept = blind_training_pairs(held_out, path)
    assert [p.id for p in kept] == ["1"]
    assert kept[0].same and kept[0].source == "train-blind"
    assert [p.id for p in blind_training_pairs([], path)] == ["1", "2"]
