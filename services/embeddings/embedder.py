"""Embed: validation, truncation policy and the dynamic batcher in front of the model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from services.embeddings.batcher import DynamicBatcher
from services.embeddings.encoder import Encoder, ModelInfo, Vectors
from services.runtime.errors import InvalidArgument, NotFound


@dataclass(frozen=True, slots=True)
class Embeddings:
    """Unit vectors of a request's texts, in order, with what the model did to each."""

    vectors: Vectors
    token_counts: list[int]
    truncated: list[bool]
    model: ModelInfo

    @property
    def total_tokens(self) -> int:
        return sum(self.token_counts)


class Embedder:
    """Embeds texts for callers; concurrent calls share model batches."""

    def __init__(
        self,
        encoder: Encoder,
        *,
        max_batch: int = 64,
        max_wait_s: float = 0.004,
        max_queued: int = 16384,
        max_texts: int = 2048,
    ) -> None:
        self._encoder = encoder
        self._max_texts = max_texts
        self.batcher = DynamicBatcher(
            encoder.encode, max_batch=max_batch, max_wait_s=max_wait_s, max_queued=max_queued
        )

    @property
    def model(self) -> ModelInfo:
        return self._encoder.info

    @property
    def encoder(self) -> Encoder:
        return self._encoder

    def check_model(self, name: str) -> None:
        """NOT_FOUND unless ``name`` is empty or the model this service runs."""
        if name and name != self.model.name:
            raise NotFound(
                f"embedding model {name!r} is not served here; this service runs {self.model.name!r}"
            )

    async def embed(
        self, texts: Sequence[str], *, model: str = "", reject_oversized: bool = False
    ) -> Embeddings:
        """Vectors of ``texts``. Texts over the model's limit are truncated (and flagged), or
        rejected with ``reject_oversized``."""
        self.check_model(model)
        if not texts:
            raise InvalidArgument("texts must not be empty")
        if len(texts) > self._max_texts:
            raise InvalidArgument(f"at most {self._max_texts} texts per request, got {len(texts)}")
        for i, text in enumerate(texts):
            if not text.strip():
                raise InvalidArgument(f"texts[{i}] is empty")
        if reject_oversized:
            counts = await self.batcher.run(self._encoder.count_tokens, list(texts))
            limit = self.model.max_tokens - self.model.special_tokens
            over = [i for i, n in enumerate(counts) if n > limit]
            if over:
                shown = ", ".join(f"texts[{i}] has {counts[i]}" for i in over[:5])
                raise InvalidArgument(
                    f"{len(over)} text(s) exceed the model limit of {limit} tokens ({shown}); "
                    "unset reject_oversized to truncate them instead"
                )
        encoded = await self.batcher.embed(texts)
        limit = self.model.max_tokens
        return Embeddings(
            vectors=encoded.vectors,
            token_counts=[min(n, limit) for n in encoded.token_counts],
            truncated=[n > limit for n in encoded.token_counts],
            model=self.model,
        )

    async def embed_many(self, texts: Sequence[str], *, slice_size: int = 512) -> Embeddings:
        """Vectors of any number of already-validated texts (document chunks), submitted a slice at
        a time so that a large ingest neither fills the queue nor holds off other callers for long."""
        parts = [
            await self.batcher.embed(texts[i : i + slice_size]) for i in range(0, len(texts), slice_size)
        ]
        counts = [n for part in parts for n in part.token_counts]
        vectors = (
            np.concatenate([part.vectors for part in parts])
            if parts
            else np.zeros((0, self.model.dimension), dtype=np.float32)
        )
        limit = self.model.max_tokens
        return Embeddings(
            vectors=vectors,
            token_counts=[min(n, limit) for n in counts],
            truncated=[n > limit for n in counts],
            model=self.model,
        )

    async def start(self) -> None:
        self.batcher.start()

    async def close(self) -> None:
        await self.batcher.close()
