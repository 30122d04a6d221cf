"""The in-memory vector index: exact and HNSW search, filters, replacement, deletion."""

from __future__ import annotations

import numpy as np
import pytest

from services.embeddings.index import ChunkRecord, IndexParams, VectorIndex

DIM = 32


def unit(rows: np.ndarray) -> np.ndarray:
    rows = rows.astype(np.float32)
    out: np.ndarray = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    return out


def records(doc: str, n: int, **metadata: str) -> list[ChunkRecord]:
    return [ChunkRecord(doc, i, f"{doc} chunk {i}", metadata) for i in range(n)]


def clustered(n: int, seed: int = 0) -> np.ndarray:
    """Vectors around a few hundred centres: low intrinsic dimension, like sentence embeddings."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((max(1, n // 50), DIM))
    return unit(centres[rng.integers(0, len(centres), n)] + 0.15 * rng.standard_normal((n, DIM)))


@pytest.mark.parametrize("threshold", [10**9, 10])
def test_search_ranks_by_cosine_and_respects_top_k(threshold: int) -> None:
    index = VectorIndex(DIM, IndexParams(hnsw_threshold=threshold))
    vectors = clustered(200)
    for d in range(50):
        index.upsert(f"d{d}", records(f"d{d}", 4), vectors[4 * d : 4 * d + 4])
    assert index.uses_hnsw is (threshold == 10)
    hits = index.search(vectors[17], 5)
    assert len(hits) == 5
    assert hits[0].record.chunk_id == "d4#1" and hits[0].score == pytest.approx(1.0, abs=1e-5)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


@pytest.mark.parametrize("threshold", [10**9, 10])
def test_upsert_replaces_and_delete_removes(threshold: int) -> None:
    index = VectorIndex(DIM, IndexParams(hnsw_threshold=threshold))
    vectors = clustered(60, seed=1)
    for d in range(20):
        index.upsert(f"d{d}", records(f"d{d}", 3), vectors[3 * d : 3 * d + 3])
    index.upsert("d0", records("d0", 1), vectors[59:60])
    assert index.chunk_count == 58
    hits = index.search(vectors[0], 60)
    assert all(h.record.chunk_id not in {"d0#1", "d0#2"} for h in hits)
    assert not any(h.record.document_id == "d0" and h.score > 0.999 and h.record.index == 0 for h in hits[1:])
    assert index.delete("d1") and not index.delete("d1")
    assert all(h.record.document_id != "d1" for h in index.search(vectors[3], 60))
    assert index.chunk_count == 55 and index.document_count == 19


@pytest.mark.parametrize("threshold", [10**9, 10])
def test_filters_and_min_score(threshold: int) -> None:
    index = VectorIndex(DIM, IndexParams(hnsw_threshold=threshold, exact_filter_limit=5))
    vectors = clustered(100, seed=2)
    for d in range(50):
        meta = {"lang": "en" if d % 2 else "de", "team": str(d % 5)}
        index.upsert(f"d{d}", records(f"d{d}", 2, **meta), vectors[2 * d : 2 * d + 2])
    hits = index.search(vectors[0], 10, filters={"lang": "en"})
    assert len(hits) == 10 and all(h.record.metadata["lang"] == "en" for h in hits)
    hits = index.search(vectors[0], 10, filters={"lang": "en", "team": "1"})
    assert hits and all(h.record.metadata == {"lang": "en", "team": "1"} for h in hits)
    assert index.search(vectors[0], 10, filters={"lang": "fr"}) == []
    assert index.search(vectors[0], 10, filters={"lang": "en", "nope": "x"}) == []
    strong = index.search(vectors[0], 100, min_score=0.9)
    assert strong and all(h.score >= 0.9 for h in strong)


def test_graph_is_used_above_threshold_and_dropped_well_below_it() -> None:
    index = VectorIndex(DIM, IndexParams(hnsw_threshold=100))
    vectors = clustered(150, seed=3)
    for d in range(150):
        index.upsert(f"d{d}", records(f"d{d}", 1), vectors[d : d + 1])
    assert index.uses_hnsw
    for d in range(110):
        index.delete(f"d{d}")
    assert not index.uses_hnsw
    assert index.search(vectors[120], 1)[0].record.document_id == "d120"


def test_compaction_keeps_results() -> None:
    index = VectorIndex(DIM, IndexParams(hnsw_threshold=500))
    vectors = clustered(2000, seed=4)
    for d in range(2000):
        index.upsert(f"d{d}", records(f"d{d}", 1, parity=str(d % 2)), vectors[d : d + 1])
    for d in range(0, 2000, 2):
        index.delete(f"d{d}")
    assert index.chunk_count == 1000
    hit = index.search(vectors[1001], 1, filters={"parity": "1"})[0]
    assert hit.record.document_id == "d1001"
    assert all(h.record.document_id != "d1000" for h in index.search(vectors[1000], 20))


def test_hnsw_recall_against_exact_search() -> None:
    vectors = clustered(20_000, seed=5)
    exact = VectorIndex(DIM, IndexParams(hnsw_threshold=10**9))
    graph = VectorIndex(DIM, IndexParams(hnsw_threshold=1000))
    for start in range(0, len(vectors), 1000):
        recs = [ChunkRecord(f"d{i}", 0, "", {}) for i in range(start, start + 1000)]
        for index in (exact, graph):
            for j, rec in enumerate(recs):
                index.upsert(rec.document_id, [rec], vectors[start + j : start + j + 1])
    assert graph.uses_hnsw and not exact.uses_hnsw
    rng = np.random.default_rng(6)
    queries = unit(vectors[rng.integers(0, len(vectors), 100)] + 0.1 * rng.standard_normal((100, DIM)))
    found = 0
    for q in queries:
        want = {h.record.document_id for h in exact.search(q, 10)}
        found += len(want & {h.record.document_id for h in graph.search(q, 10)})
    assert found / 1000 >= 0.95


def test_wrong_shape_is_refused() -> None:
    index = VectorIndex(DIM)
    with pytest.raises(ValueError, match="expected"):
        index.upsert("d", records("d", 2), clustered(3))


@pytest.mark.parametrize("threshold", [10**9, 50])
def test_apply_matches_one_by_one_changes(threshold: int) -> None:
    vectors = clustered(300, seed=7)
    one_by_one = VectorIndex(DIM, IndexParams(hnsw_threshold=threshold))
    batched = VectorIndex(DIM, IndexParams(hnsw_threshold=threshold))
    changes: list[tuple[str, list[ChunkRecord] | None, np.ndarray | None]] = []
    for d in range(100):
        changes.append((f"d{d}", records(f"d{d}", 3), vectors[3 * d : 3 * d + 3]))
        if d % 7 == 0:
            changes.append((f"d{d // 2}", None, None))
    for doc, recs, vecs in changes:
        if recs is None or vecs is None:
            one_by_one.delete(doc)
        else:
            one_by_one.upsert(doc, recs, vecs)
    batched.apply(changes)
    assert batched.chunk_count == one_by_one.chunk_count and batched.uses_hnsw == one_by_one.uses_hnsw
    for q in vectors[::37]:
        assert [h.record.chunk_id for h in batched.search(q, 5)] == [
            h.record.chunk_id for h in one_by_one.search(q, 5)
        ]
