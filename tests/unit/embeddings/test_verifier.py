"""The same-question verifier as one traced graph: the eager model's scores, or the eager model."""

from __future__ import annotations

import logging

import pytest

from services.embeddings.verifier import PairScorer

QUERY = "How can I remove a Git branch?"
CANDIDATES = [
    "How do I delete a branch in Git?",
    "How do I create a branch in Git?",
    "Is Java faster than Python?",
    "git branch delete remote and local, which command does each, and what if it was never merged? " * 4,
]


@pytest.fixture(scope="module")
def eager() -> PairScorer:
    return PairScorer(threads=1, graph=False)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_the_graph_scores_what_the_eager_model_scores(eager: PairScorer, k: int) -> None:
    graph = PairScorer(threads=1)
    # Batch sizes and lengths other than the traced batch's (the last candidate is truncated).
    for candidates in (CANDIDATES[:k], CANDIDATES[-k:]):
        assert graph.score(QUERY, candidates) == pytest.approx(eager.score(QUERY, candidates), abs=1e-6)


def test_a_graph_that_cannot_be_traced_leaves_the_eager_model(
    eager: PairScorer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import torch

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("no tracing here")

    monkeypatch.setattr(torch.jit, "trace", refuse)
    scorer = PairScorer(threads=1)
    with caplog.at_level(logging.WARNING, logger="services.embeddings.verifier"):
        scores = scorer.score(QUERY, CANDIDATES[:3])
    assert scores == pytest.approx(eager.score(QUERY, CANDIDATES[:3]), abs=1e-6)
    assert "tracing it failed (no tracing here)" in caplog.text
