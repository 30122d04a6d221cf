"""The in-process vector index: flat then HNSW, replacement, tombstones, the global cap."""

from __future__ import annotations

import numpy as np

from cache.vectors import VectorIndex, normalize


def _vectors(n: int, d: int = 16, seed: int = 0) -> np.ndarray:
    return normalize(np.random.default_rng(seed).normal(size=(n, d)))


def test_search_finds_the_same_vector_flat_and_hnsw() -> None:
    vectors = _vectors(300)
    index = VectorIndex(hnsw_min=100)
    for i in range(50):
        index.add("p", f"d{i}", f"t{i}", vectors[i])
    assert index.partition("p").kind == "flat"  # type: ignore[union-attr]
    assert index.search("p", vectors[7], 1)[0].digest == "d7"
    for i in range(50, 300):
        index.add("p", f"d{i}", f"t{i}", vectors[i])
    assert index.partition("p").kind == "hnsw"  # type: ignore[union-attr]
    hits = index.search("p", vectors[250], 2)
    assert hits[0].digest == "d250"
    assert hits[0].similarity > 0.99
    assert index.search("other", vectors[0], 1) == []


def test_replace_remove_and_cap() -> None:
    vectors = _vectors(10)
    index = VectorIndex(max_entries=5)
    index.add("p", "a", "old", vectors[0])
    index.add("p", "a", "new", vectors[1])
    assert len(index) == 1
    assert index.search("p", vectors[1], 1)[0].text == "new"
    index.remove("p", "a")
    assert index.search("p", vectors[1], 1) == []
    for i in range(10):
        index.add("q", f"d{i}", "", vectors[i])
    assert len(index) == 5
    assert {h.digest for h in index.search("q", vectors[0], 5)} == {f"d{i}" for i in range(5, 10)}
