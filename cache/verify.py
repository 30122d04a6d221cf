"""The second stage of the semantic cache: does this candidate ask the *same question*?

The vector index proposes candidates at a recall-oriented similarity and the guard
vetoes what it can prove differs; a verifier then scores the survivors of one lookup as
a single batch and only a candidate at or above its threshold may answer. The verifier
is the same-question cross-encoder (:mod:`services.embeddings.verifier`): remote through
``EmbeddingService.ScorePairs`` (:class:`cache.clients.GrpcVerifier`, the default) or in
this process (:class:`LocalVerifier`, with ``LLMESH_CACHE_EMBEDDINGS_LOCAL``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

from cache import defaults

DEFAULT_THRESHOLD = defaults.SEMANTIC_VERIFIER_THRESHOLD
DEFAULT_MODEL = defaults.SEMANTIC_VERIFIER


class Verifier(Protocol):
    """Scores candidate prompts against a query: the probability they ask the same thing."""

    name: str
    threshold: float

    async def scores(self, query: str, candidates: Sequence[str]) -> list[float]:
        """One score in [0, 1] per candidate, in order."""
        ...


_SCORERS: dict[str, Any] = {}


def _shared_scorer(model: str) -> Any:
    """One loaded cross-encoder per model in this process (it is read-only once loaded)."""
    scorer = _SCORERS.get(model)
    if scorer is None:
        from services.embeddings.verifier import PairScorer

        scorer = _SCORERS[model] = PairScorer(model)
    return scorer


class LocalVerifier:
    """The cross-encoder in this process (needs the embeddings extra: torch, transformers)."""

    def __init__(
        self, threshold: float = DEFAULT_THRESHOLD, model: str = DEFAULT_MODEL, scorer: Any = None
    ) -> None:
        self._scorer = scorer if scorer is not None else _shared_scorer(model)
        self._lock = asyncio.Lock()
        self.name = model
        self.threshold = threshold

    async def scores(self, query: str, candidates: Sequence[str]) -> list[float]:
        async with self._lock:
            result: list[float] = await asyncio.to_thread(self._scorer.score, query, list(candidates))
            return result
