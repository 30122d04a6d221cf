"""Labeled prompt pairs for the semantic cache, from sources the project did not write.

* ``fow-cache`` 0.1.0 (data CC BY 4.0, code MIT; installed by ``scripts/test-setup.sh`` with
  ``--no-deps``, only its data is read): 600 single-question pairs. Should hit:
  ``near_repeat`` (typos, one-word rewordings) and ``paraphrase``; must not hit:
  ``negation``, ``entity_swap`` (the same names in other roles: "from A to B" vs "from
  B to A"), ``number_date`` and ``scope``. Eight pairs are tagged ``ambiguous``; like the
  package's own default they count by their label (seven as traps).
* ``benchmarks/data/semantic_pairs_multilingual_blind.jsonl``: pairs in eight languages
  and across languages, written blind by a helper that never saw the code, committed
  before any tuning and never edited (the next best to public data where no package
  ships a multilingual paraphrase set).
* ``benchmarks/data/semantic_pairs.jsonl``: the project's own pair set, which the
  guard's word lists were written against (reported as *tuned-on*).
* ``benchmarks/data/semantic_pairs_train_blind.jsonl``: 1,000 English pairs written blind by
  two helpers that saw neither code nor data (paraphrases, near repeats, and traps: negation,
  swapped roles, numbers, scope, related questions), committed before any training and never
  edited. Training only, never evaluation; a pair is left out when either prompt is also a
  prompt of a pair the verifier may not train on (:func:`blind_training_pairs`).
* ``benchmarks/data/semantic_pairs_train_blind_related.jsonl``: 800 more English pairs written
  blind by a helper that saw neither code nor data, frozen before any training: 400
  ``related_different`` (the same topic, another information need: "What is pH?" / "How do I
  test the pH of my garden soil?") and 400 heavily reworded paraphrases. Training only, as
  above.
* ``benchmarks/data/semantic_pairs_train_blind_multilingual.jsonl``: 800 same-language pairs,
  100 in each of German, French, Spanish, Portuguese, Italian, Dutch, Russian and Chinese, written
  blind by two helpers that saw neither code nor data and frozen before any training: per
  language 40 heavily reworded paraphrases, 10 near repeats, and 10 each negation, swapped
  roles, changed number or name, changed scope and related questions. Training only
  (:func:`blind_multilingual_pairs`), as above.

Splits are fixed before tuning: a pair is in the *test* half when the first byte of
``sha256(source + ":" + id)`` is odd, else in the *tune* half. A third of the tune half (second
byte divisible by 3) is the *dev* slice: the verifier never trains on it, and the cache's
thresholds are chosen on it (:mod:`benchmarks.semantic_eval`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

DATA = Path(__file__).parent / "data"
FOW_VERSION = "0.1.0"
BLIND_PATH = DATA / "semantic_pairs_multilingual_blind.jsonl"
OWN_PATH = DATA / "semantic_pairs.jsonl"
TRAIN_BLIND_PATH = DATA / "semantic_pairs_train_blind.jsonl"
TRAIN_RELATED_PATH = DATA / "semantic_pairs_train_blind_related.jsonl"
TRAIN_MULTILINGUAL_PATH = DATA / "semantic_pairs_train_blind_multilingual.jsonl"


@dataclass(frozen=True, slots=True)
class LabeledPair:
    source: str
    id: str
    a: str
    b: str
    same: bool
    kind: str
    lang_a: str = "en"
    lang_b: str = "en"

    @property
    def _digest(self) -> bytes:
        return hashlib.sha256(f"{self.source}:{self.id}".encode()).digest()

    @property
    def test(self) -> bool:
        """In the reported half (decided by a hash, before any tuning)."""
        return self._digest[0] % 2 == 1

    @property
    def dev(self) -> bool:
        """In the tune half's threshold-choosing slice (never a training pair)."""
        return not self.test and self._digest[1] % 3 == 0

    @property
    def cross_language(self) -> bool:
        return self.lang_a != self.lang_b


def _jsonl(path: Path) -> Iterable[dict[str, object]]:
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def fow_cache() -> list[LabeledPair]:
    spec = find_spec("fow_cache")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"fow-cache=={FOW_VERSION} is not installed (scripts/test-setup.sh installs it)")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "pairs.jsonl"
    return [
        LabeledPair(
            "fow-cache", str(r["id"]), str(r["a"]), str(r["b"]), bool(r["same_answer"]), str(r["category"])
        )
        for r in _jsonl(path)
    ]


def multilingual_blind(path: Path = BLIND_PATH) -> list[LabeledPair]:
    return [
        LabeledPair(
            "multilingual-blind",
            str(r["id"]),
            str(r["a"]),
            str(r["b"]),
            bool(r["same_answer"]),
            str(r["category"]),
            str(r["lang_a"]),
            str(r["lang_b"]),
        )
        for r in _jsonl(path)
    ]


def own_pairs(path: Path = OWN_PATH) -> list[LabeledPair]:
    return [
        LabeledPair("own", str(r["id"]), str(r["a"]), str(r["b"]), bool(r["same"]), str(r["kind"]))
        for r in _jsonl(path)
    ]


def training(pairs: Sequence[LabeledPair]) -> list[LabeledPair]:
    """The pairs a model may train on: the tune half less its dev slice."""
    return [p for p in pairs if not p.test and not p.dev]


def _normalized(text: str) -> str:
    return " ".join(text.lower().split())


def blind_training_pairs(
    held_out: Sequence[LabeledPair], path: Path = TRAIN_BLIND_PATH, source: str = "train-blind"
) -> list[LabeledPair]:
    """The blind training pairs, less any pair that shares a prompt (case and spacing aside)
    with ``held_out``: the pairs the verifier may not see (test halves and dev slices)."""
    unseen = {_normalized(t) for p in held_out for t in (p.a, p.b)}
    pairs = [
        LabeledPair(
            source,
            str(r["id"]),
            str(r["a"]),
            str(r["b"]),
            bool(r["same_answer"]),
            str(r["category"]),
            str(r.get("lang", "en")),
            str(r.get("lang", "en")),
        )
        for r in _jsonl(path)
    ]
    return [p for p in pairs if _normalized(p.a) not in unseen and _normalized(p.b) not in unseen]


# The blind training pairs' trap that neither the issue's bar nor fow-cache names: a related but
# different question worded like a paraphrase ("What causes migraines?" / "What can I do to make a
# migraine go away?"). Reported on its own by `llmesh bench cache`; it does not choose thresholds.
RELATED_KINDS = frozenset({"related_different", "hard_paraphrase_negative"})


def blind_related_pairs(held_out: Sequence[LabeledPair]) -> list[LabeledPair]:
    """The 800 blind related-but-different and paraphrase pairs, as :func:`blind_training_pairs`."""
    return blind_training_pairs(held_out, TRAIN_RELATED_PATH, "train-blind-related")


def blind_multilingual_pairs(held_out: Sequence[LabeledPair]) -> list[LabeledPair]:
    """The 800 blind same-language pairs in eight languages, as :func:`blind_training_pairs`."""
    return blind_training_pairs(held_out, TRAIN_MULTILINGUAL_PATH, "train-blind-multilingual")
