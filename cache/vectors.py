"""In-process vector indexes of the semantic cache, one per partition.

A partition (tenant + model + exact conversation context) starts on an exact flat
inner-product index; once it holds ``hnsw_min`` vectors it is rebuilt as an HNSW
graph (FAISS ``IndexHNSWFlat``), whose search stays well under a millisecond at
100k vectors where a flat scan takes several. Vectors are L2-normalized, so inner
product is cosine similarity. Replaced or evicted rows become tombstones and the
partition is rebuilt when they pile up.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import faiss
import numpy as np
import numpy.typing as npt

from cache import defaults

Vector = npt.NDArray[np.float32]

HNSW_M = 32
HNSW_EF_CONSTRUCTION = 64
HNSW_EF_SEARCH = 64


@dataclass(frozen=True, slots=True)
class Hit:
    digest: str
    text: str
    similarity: float


def set_search_threads(threads: int) -> None:
    """FAISS's OpenMP threads for this process (the cache searches one query at a time)."""
    faiss.omp_set_num_threads(max(1, threads))


def normalize(vectors: npt.ArrayLike) -> Vector:
    array = np.ascontiguousarray(np.asarray(vectors, dtype=np.float32))
    if array.ndim == 1:
        array = array.reshape(1, -1)
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return np.ascontiguousarray(array / norms, dtype=np.float32)


class Partition:
    """The vectors of one partition: digest -> row, with tombstones for replaced rows."""

    def __init__(self, dimension: int, hnsw_min: int) -> None:
        self.dimension = dimension
        self.hnsw_min = hnsw_min
        self._index: faiss.Index = faiss.IndexFlatIP(dimension)
        self._hnsw = False
        self._rows: list[tuple[str, str] | None] = []
        self._vectors: list[Vector] = []
        self._row_of: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._row_of)

    @property
    def kind(self) -> str:
        return "hnsw" if self._hnsw else "flat"

    def _new_index(self, hnsw: bool) -> faiss.Index:
        if not hnsw:
            return faiss.IndexFlatIP(self.dimension)
        index = faiss.IndexHNSWFlat(self.dimension, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        index.hnsw.efSearch = HNSW_EF_SEARCH
        return index

    def add(self, digest: str, text: str, vector: Vector) -> None:
        self.remove(digest)
        row = len(self._rows)
        self._rows.append((digest, text))
        self._vectors.append(vector.reshape(-1))
        self._row_of[digest] = row
        if not self._hnsw and len(self._row_of) >= self.hnsw_min:
            self._rebuild(hnsw=True)
        else:
            self._index.add(vector.reshape(1, -1))

    def add_many(self, items: list[tuple[str, str, Vector]]) -> None:
        """Bulk load (a replica catching up, a benchmark): one index build instead of many adds."""
        for digest, text, vector in items:
            self.remove(digest)
            self._row_of[digest] = len(self._rows)
            self._rows.append((digest, text))
            self._vectors.append(vector.reshape(-1))
        self._rebuild(hnsw=self._hnsw or len(self._row_of) >= self.hnsw_min)

    def remove(self, digest: str) -> None:
        row = self._row_of.pop(digest, None)
        if row is None:
            return
        self._rows[row] = None
        dead = len(self._rows) - len(self._row_of)
        if dead > 1024 and dead > len(self._rows) // 2:
            self._rebuild(hnsw=self._hnsw)

    def _rebuild(self, hnsw: bool) -> None:
        live = [(row, r) for row, r in enumerate(self._rows) if r is not None]
        vectors = [self._vectors[row] for row, _ in live]
        self._rows = [r for _, r in live]
        self._vectors = vectors
        self._row_of = {r[0]: i for i, (_, r) in enumerate(live)}
        self._hnsw = hnsw
        self._index = self._new_index(hnsw)
        if vectors:
            self._index.add(np.ascontiguousarray(np.stack(vectors), dtype=np.float32))

    def search(self, query: Vector, k: int) -> list[Hit]:
        if not self._row_of:
            return []
        # Ask for extra neighbours so tombstones do not crowd out live rows.
        want = min(len(self._rows), k + min(32, len(self._rows) - len(self._row_of)))
        scores, rows = self._index.search(query.reshape(1, -1), want)
        hits: list[Hit] = []
        for score, row in zip(scores[0], rows[0], strict=True):
            if row < 0:
                continue
            entry = self._rows[int(row)]
            if entry is not None:
                hits.append(Hit(digest=entry[0], text=entry[1], similarity=float(score)))
            if len(hits) == k:
                break
        return hits


class VectorIndex:
    """All partitions of this process, with a global cap (oldest entries go first)."""

    def __init__(
        self,
        dimension: int | None = None,
        *,
        max_entries: int = defaults.SEMANTIC_MAX_ENTRIES,
        hnsw_min: int = defaults.SEMANTIC_HNSW_MIN,
    ) -> None:
        self.dimension = dimension
        self.max_entries = max_entries
        self.hnsw_min = hnsw_min
        self._partitions: dict[str, Partition] = {}
        self._order: OrderedDict[tuple[str, str], None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._order)

    def partition(self, name: str) -> Partition | None:
        return self._partitions.get(name)

    def _partition_for(self, name: str, dimension: int) -> Partition:
        if self.dimension is None:
            self.dimension = dimension
        if dimension != self.dimension:
            raise ValueError(f"vector dimension {dimension} does not match the index's {self.dimension}")
        part = self._partitions.get(name)
        if part is None:
            part = self._partitions[name] = Partition(dimension, self.hnsw_min)
        return part

    def add(self, partition: str, digest: str, text: str, vector: Vector) -> None:
        part = self._partition_for(partition, vector.size)
        part.add(digest, text, vector)
        self._order.pop((partition, digest), None)
        self._order[(partition, digest)] = None
        self._evict()

    def add_many(self, partition: str, items: list[tuple[str, str, Vector]]) -> None:
        if not items:
            return
        part = self._partition_for(partition, items[0][2].size)
        part.add_many(items)
        for digest, _, _ in items:
            self._order.pop((partition, digest), None)
            self._order[(partition, digest)] = None
        self._evict()

    def _evict(self) -> None:
        while len(self._order) > self.max_entries:
            (partition, digest), _ = self._order.popitem(last=False)
            self.remove(partition, digest)

    def remove(self, partition: str, digest: str) -> None:
        self._order.pop((partition, digest), None)
        part = self._partitions.get(partition)
        if part is not None:
            part.remove(digest)
            if not len(part):
                del self._partitions[partition]

    def search(self, partition: str, query: Vector, k: int) -> list[Hit]:
        part = self._partitions.get(partition)
        if part is None or self.dimension is None or query.size != self.dimension:
            return []
        return part.search(query, k)

    def clear(self) -> None:
        self._partitions.clear()
        self._order.clear()
