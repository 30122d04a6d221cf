"""The same-question verifiers as one traced graph: the eager model's scores, or the eager model."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from services.embeddings.verifier import PairScorer

MULTILINGUAL = "same-question-multilingual-v1"
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


def test_the_multilingual_verifier_keeps_its_feed_forward_outputs_in_float() -> None:
    """int8 everywhere but multilingual-e5-small's feed-forward output layers, whose inputs
    have outlier channels; the traced graph still scores what the eager model scores."""
    import torch

    from services.embeddings.verifier import MULTILINGUAL_E5, MULTILINGUAL_MODEL, _int8, load_base

    _, model = load_base(base=MULTILINGUAL_E5)
    layer = _int8(model, MULTILINGUAL_E5).bert.encoder.layer[0]
    assert type(layer.output.dense) is torch.nn.Linear
    assert type(layer.intermediate.dense) is not torch.nn.Linear
    assert type(layer.attention.output.dense) is not torch.nn.Linear
    query, candidates = (
        "Wie lösche ich einen Git-Branch?",
        ["Wie entferne ich einen Branch in Git?", "Qué es Git?"],
    )
    graph = PairScorer(MULTILINGUAL_MODEL, threads=1).score(query, candidates)
    eager = PairScorer(MULTILINGUAL_MODEL, threads=1, graph=False).score(query, candidates)
    assert graph == pytest.approx(eager, abs=1e-6)


@pytest.mark.parametrize(
    ("models", "phrase"),
    [([], "at least one"), (["same-question-v2"], "unknown verifier"), (["same-question-v1"] * 2, "twice")],
)
def test_the_service_serves_only_verifiers_it_knows(models: list[str], phrase: str) -> None:
    from pydantic import ValidationError

    from services.embeddings.config import EmbeddingsSettings

    with pytest.raises(ValidationError, match=phrase):
        EmbeddingsSettings(verifier_models=models)
    served = EmbeddingsSettings().verifier_models
    assert served == ["same-question-v1", "same-question-multilingual-v1"]


def test_a_verifier_of_fewer_layers_than_its_base_loads_only_those(tmp_path: Path) -> None:
    """A distilled verifier ships every parameter of its layers; the base's other layers go, and
    a file that lacks part of a layer it keeps is refused."""
    import torch
    from safetensors.torch import save_file

    from services.embeddings.verifier import MINILM, _fit_layers, load_base

    _, model = load_base(base=MINILM)
    kept = {
        name: p.detach().clone().contiguous()
        for name, p in model.named_parameters()
        if name.startswith(("bert.encoder.layer.0.", "bert.encoder.layer.1.", "bert.pooler.", "classifier."))
    }
    _fit_layers(model, kept)
    assert len(model.bert.encoder.layer) == 2 and model.config.num_hidden_layers == 2
    save_file(kept, str(tmp_path / "two.safetensors"))
    scores = PairScorer(threads=1, weights=tmp_path / "two.safetensors").score(QUERY, CANDIDATES[:2])
    assert len(scores) == 2 and all(0.0 <= s <= 1.0 for s in scores)

    _, model = load_base(base=MINILM)
    partial = {k: v for k, v in kept.items() if not k.startswith("bert.encoder.layer.1.output.")}
    with pytest.raises(ValueError, match="must ship all of them"):
        _fit_layers(model, partial)
    _, model = load_base(base=MINILM)
    _fit_layers(model, {"classifier.weight": torch.zeros(3, 384)})  # no layers: the base's stay
    assert len(model.bert.encoder.layer) == 6


class _SlowScorer:
    """A PairScorer's face: loads when told to (``release``), fails its first load if asked."""

    def __init__(self, name: str, *, loaded: bool = False, fail_first: bool = False) -> None:
        import threading

        self.name = name
        self.loaded = loaded
        self.loads = 0
        self.release = threading.Event()
        self._fail = fail_first

    def load(self) -> None:
        self.loads += 1
        assert self.release.wait(10)
        if self._fail:
            self._fail = False
            raise RuntimeError("weights unreadable")
        self.loaded = True

    def score(self, query: str, candidates: list[str]) -> list[float]:
        assert self.loaded
        return [0.5] * len(candidates)


async def test_a_verifier_loads_once_on_first_use_and_others_do_not_wait_for_it() -> None:
    import asyncio

    from services.embeddings.verifier import Verification

    english, other = _SlowScorer("en", loaded=True), _SlowScorer("ml")
    verification = Verification(english, other)  # type: ignore[arg-type]
    waiting = [asyncio.ensure_future(verification.score("q", ["c"], "ml")) for _ in range(3)]
    assert await verification.score("q", ["c"]) == ([0.5], "en")  # not behind the load
    assert not any(w.done() for w in waiting)
    waiting[0].cancel()  # a caller that gives up does not stop the load for the others
    other.release.set()
    assert [await w for w in waiting[1:]] == [([0.5], "ml")] * 2
    assert other.loads == 1


async def test_a_verifier_whose_load_failed_loads_again_on_the_next_call() -> None:
    from services.embeddings.verifier import Verification

    other = _SlowScorer("ml", fail_first=True)
    other.release.set()
    verification = Verification(_SlowScorer("en", loaded=True), other)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="weights unreadable"):
        await verification.score("q", ["c"], "ml")
    assert await verification.score("q", ["c"], "ml") == ([0.5], "ml")
    assert other.loads == 2


@pytest.mark.parametrize(
    ("warm_up", "loaded"),
    [
        ([], ["same-question-v1"]),
        (True, ["same-question-v1", "same-question-multilingual-v1"]),
        (False, []),
        (["same-question-multilingual-v1"], ["same-question-multilingual-v1"]),
    ],
)
def test_the_verifiers_warmed_at_start(warm_up: list[str] | bool, loaded: list[str]) -> None:
    from pydantic import ValidationError

    from services.embeddings.config import EmbeddingsSettings

    assert EmbeddingsSettings(verifier_warm_up=warm_up).warm_up_verifiers() == loaded
    with pytest.raises(ValidationError, match="not in verifier_models"):
        EmbeddingsSettings(verifier_models=["same-question-v1"], verifier_warm_up=[MULTILINGUAL])
