"""The labeled pair set of the semantic cache and its evaluation (true- and false-hit rates).

``benchmarks/data/semantic_pairs.jsonl`` holds prompt pairs: paraphrases (``same``: a
cached answer to one is a right answer to the other) and near-misses (``same`` false:
a different number, negation, named entity, or a small change of meaning such as
"encrypt"/"decrypt"). A pair is a *hit* when the cosine similarity of the two
embeddings reaches the threshold and the guard does not reject it. True-hit rate =
hits among paraphrases; false-hit rate = hits among near-misses. Pairs with an even
id are the tuning half, odd ids the held-out half.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cache.guard import reject_reason
from cache.vectors import Vector

PAIRS_PATH = Path(__file__).parent / "data" / "semantic_pairs.jsonl"


@dataclass(frozen=True, slots=True)
class Pair:
    id: int
    a: str
    b: str
    same: bool
    kind: str


@dataclass(frozen=True, slots=True)
class Rates:
    threshold: float
    guarded: bool
    true_hit_rate: float
    false_hit_rate: float
    paraphrases: int
    near_misses: int
    false_hits: tuple[int, ...]


def load_pairs(path: Path = PAIRS_PATH) -> list[Pair]:
    with path.open(encoding="utf-8") as fh:
        return [Pair(**json.loads(line)) for line in fh if line.strip()]


def similarities(pairs: Sequence[Pair], vectors_a: Vector, vectors_b: Vector) -> Vector:
    """Cosine similarity of each pair (vectors are L2-normalized rows)."""
    return np.asarray(np.sum(vectors_a * vectors_b, axis=1), dtype=np.float32)


def rates(pairs: Sequence[Pair], sims: Vector, threshold: float, *, guarded: bool = True) -> Rates:
    true_hits = false_hits = paraphrases = near = 0
    false_ids: list[int] = []
    for pair, sim in zip(pairs, sims, strict=True):
        hit = float(sim) >= threshold and (not guarded or reject_reason(pair.a, pair.b) is None)
        if pair.same:
            paraphrases += 1
            true_hits += hit
        else:
            near += 1
            false_hits += hit
            if hit:
                false_ids.append(pair.id)
    return Rates(
        threshold=threshold,
        guarded=guarded,
        true_hit_rate=true_hits / max(1, paraphrases),
        false_hit_rate=false_hits / max(1, near),
        paraphrases=paraphrases,
        near_misses=near,
        false_hits=tuple(false_ids),
    )


def tune(pairs: Sequence[Pair], sims: Vector, max_false_hit_rate: float = 0.01) -> float:
    """The lowest threshold (step 0.01) whose guarded false-hit rate stays within the bound."""
    for step in range(50, 100):
        threshold = step / 100
        if rates(pairs, sims, threshold).false_hit_rate <= max_false_hit_rate:
            return threshold
    return 0.99


def split(pairs: Sequence[Pair], sims: Vector, held_out: bool) -> tuple[list[Pair], Vector]:
    keep = [i for i, p in enumerate(pairs) if (p.id % 2 == 1) == held_out]
    return [pairs[i] for i in keep], sims[keep]
