"""One collection's chunks in memory: vectors, payloads, metadata postings and search.

Vectors are unit length, so inner product is cosine similarity. Small
collections are searched exactly (one matrix-vector product); beyond
``hnsw_threshold`` live chunks an HNSW graph (FAISS) answers unfiltered and
broadly filtered queries, and a filter that matches at most
``exact_filter_limit`` chunks is answered exactly over those chunks (a graph
walk restricted to a small subset loses recall). Replaced and deleted chunks
are tombstoned and skipped; the store compacts itself when a quarter of its
slots are dead.

Not thread-safe: the owner serializes calls (one writer or one reader at a time).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import faiss
import numpy as np

from services.embeddings.encoder import Vectors

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ChunkRecord:
    """What a search hit returns about a chunk."""

    document_id: str
    index: int
    text: str
    metadata: Mapping[str, str]

    @property
    def chunk_id(self) -> str:
        return chunk_id(self.document_id, self.index)


@dataclass(frozen=True, slots=True)
class Hit:
    record: ChunkRecord
    score: float


@dataclass(frozen=True, slots=True)
class IndexParams:
    hnsw_threshold: int = 20_000
    hnsw_m: int = 32
    ef_construction: int = 80
    ef_search: int = 128
    exact_filter_limit: int = 20_000


def chunk_id(document_id: str, index: int) -> str:
    return f"{document_id}#{index}"


class VectorIndex:
    """The searchable chunks of one collection."""

    def __init__(self, dimension: int, params: IndexParams | None = None) -> None:
        self.dimension = dimension
        self.params = params or IndexParams()
        self._vectors = np.zeros((0, dimension), dtype=np.float32)
        self._alive = np.zeros(0, dtype=bool)
        self._records: list[ChunkRecord | None] = []
        self._size = 0  # slots used (live and dead)
        self._live = 0
        self._documents: dict[str, list[int]] = {}
        self._postings: dict[tuple[str, str], set[int]] = {}
        self._hnsw: faiss.IndexHNSWFlat | None = None

    @property
    def chunk_count(self) -> int:
        return self._live

    @property
    def document_count(self) -> int:
        return len(self._documents)

    @property
    def uses_hnsw(self) -> bool:
        return self._hnsw is not None

    def upsert(self, document_id: str, records: Sequence[ChunkRecord], vectors: Vectors) -> None:
        """Replaces the document's chunks with ``records`` (one vector row each)."""
        self._upsert(document_id, records, vectors)
        self._after_change()

    def apply(self, changes: Sequence[tuple[str, Sequence[ChunkRecord] | None, Vectors | None]]) -> None:
        """Many upserts (records and vectors) and deletes (None) at once: the graph takes the new
        vectors in one parallel insertion instead of one by one."""
        for document_id, records, vectors in changes:
            if records is None or vectors is None:
                self._remove(document_id)
            else:
                self._upsert(document_id, records, vectors)
        self._after_change()

    def _upsert(self, document_id: str, records: Sequence[ChunkRecord], vectors: Vectors) -> None:
        if vectors.shape != (len(records), self.dimension):
            raise ValueError(
                f"document {document_id!r}: vectors of shape {vectors.shape}, expected "
                f"({len(records)}, {self.dimension})"
            )
        self._remove(document_id)
        if not records:
            return
        start = self._size
        self._reserve(start + len(records))
        self._vectors[start : start + len(records)] = vectors
        self._alive[start : start + len(records)] = True
        labels = list(range(start, start + len(records)))
        self._records.extend(records)
        self._size += len(records)
        self._live += len(records)
        self._documents[document_id] = labels
        for key, value in records[0].metadata.items():
            self._postings.setdefault((key, value), set()).update(labels)

    def delete(self, document_id: str) -> bool:
        """Removes the document's chunks; False when it was not there."""
        found = self._remove(document_id)
        self._after_change()
        return found

    def search(
        self, query: Vectors, k: int, *, filters: Mapping[str, str] | None = None, min_score: float = -1.0
    ) -> list[Hit]:
        """Top ``k`` live chunks by cosine similarity that match every filter and score ≥ ``min_score``."""
        if self._live == 0 or k < 1:
            return []
        q = np.ascontiguousarray(query, dtype=np.float32).reshape(1, self.dimension)
        if filters:
            subset = self._matching(filters)
            if not subset:
                return []
            if self._hnsw is None or len(subset) <= self.params.exact_filter_limit:
                labels = np.fromiter(subset, dtype=np.int64, count=len(subset))
                return self._exact(q, k, labels, min_score)
            mask = np.zeros(self._size, dtype=bool)
            mask[np.fromiter(subset, dtype=np.int64, count=len(subset))] = True
            return self._graph(q, k, mask, min_score)
        if self._hnsw is None:
            return self._exact(q, k, None, min_score)
        return self._graph(q, k, None if self._live == self._size else self._alive[: self._size], min_score)

    def _exact(self, q: Vectors, k: int, labels: np.ndarray | None, min_score: float) -> list[Hit]:
        if labels is None:
            scores = self._vectors[: self._size] @ q[0]
            scores[~self._alive[: self._size]] = -np.inf
            candidates = np.arange(self._size)
        else:
            scores = self._vectors[labels] @ q[0]
            candidates = labels
        top = min(k, len(candidates))
        best = np.argpartition(-scores, top - 1)[:top]
        best = best[np.argsort(-scores[best], kind="stable")]
        return self._hits(candidates[best], scores[best], min_score)

    def _graph(self, q: Vectors, k: int, mask: np.ndarray | None, min_score: float) -> list[Hit]:
        assert self._hnsw is not None
        params = faiss.SearchParametersHNSW()  # type: ignore[attr-defined]
        params.efSearch = max(self.params.ef_search, k)
        bits = None
        if mask is not None:
            bits = np.packbits(mask, bitorder="little")
            params.sel = faiss.IDSelectorBitmap(len(mask), faiss.swig_ptr(bits))
        scores, labels = self._hnsw.search(q, k, params=params)
        del bits  # the selector reads it during search only
        found = labels[0] >= 0
        return self._hits(labels[0][found], scores[0][found], min_score)

    def _hits(self, labels: np.ndarray, scores: np.ndarray, min_score: float) -> list[Hit]:
        hits: list[Hit] = []
        for label, score in zip(labels.tolist(), scores.tolist(), strict=True):
            record = self._records[label]
            if record is None or score < min_score:
                continue
            hits.append(Hit(record, float(score)))
        return hits

    def _matching(self, filters: Mapping[str, str]) -> set[int]:
        sets = []
        for item in filters.items():
            labels = self._postings.get(item)
            if not labels:
                return set()
            sets.append(labels)
        sets.sort(key=len)
        return set(sets[0]).intersection(*sets[1:])

    def _remove(self, document_id: str) -> bool:
        labels = self._documents.pop(document_id, None)
        if labels is None:
            return False
        record = self._records[labels[0]]
        if record is not None:
            for item in record.metadata.items():
                posting = self._postings.get(item)
                if posting is not None:
                    posting.difference_update(labels)
                    if not posting:
                        del self._postings[item]
        for label in labels:
            self._records[label] = None
        self._alive[labels] = False
        self._live -= len(labels)
        return True

    def _reserve(self, size: int) -> None:
        if size <= len(self._vectors):
            return
        capacity = max(size, 2 * len(self._vectors), 1024)
        vectors = np.zeros((capacity, self.dimension), dtype=np.float32)
        vectors[: self._size] = self._vectors[: self._size]
        alive = np.zeros(capacity, dtype=bool)
        alive[: self._size] = self._alive[: self._size]
        self._vectors, self._alive = vectors, alive

    def _after_change(self) -> None:
        dead = self._size - self._live
        if self._size >= 1024 and dead * 4 > self._size:
            self._compact()
        if self._hnsw is None:
            if self._live > self.params.hnsw_threshold:
                self._build_graph()
        elif self._live * 2 < self.params.hnsw_threshold:
            # Shrunk well below the threshold (hysteresis): exact search is cheaper again.
            self._hnsw = None
        elif self._hnsw.ntotal < self._size:
            self._hnsw.add(self._vectors[self._hnsw.ntotal : self._size])

    def _compact(self) -> None:
        keep = np.flatnonzero(self._alive[: self._size])
        remap = np.full(self._size, -1, dtype=np.int64)
        remap[keep] = np.arange(len(keep))
        self._vectors = np.ascontiguousarray(self._vectors[keep])
        self._alive = np.ones(len(keep), dtype=bool)
        self._records = [self._records[i] for i in keep.tolist()]
        self._size = self._live = len(keep)
        self._documents = {doc: remap[labels].tolist() for doc, labels in self._documents.items()}
        self._postings = {item: set(remap[list(labels)].tolist()) for item, labels in self._postings.items()}
        if self._hnsw is not None:
            self._build_graph()

    def _build_graph(self) -> None:
        log.info("building an HNSW index over %d chunks", self._size)
        graph = faiss.IndexHNSWFlat(self.dimension, self.params.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        graph.hnsw.efConstruction = self.params.ef_construction
        graph.add(self._vectors[: self._size])
        self._hnsw = graph
