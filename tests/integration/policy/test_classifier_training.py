"""The shipped classifier weights are what ``python -m benchmarks.injection_classifier_train`` builds from the
third-party data packages, not something tuned by hand (about a minute: MiniLM over the vocabulary,
then the logistic head)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks import injection_classifier_train as train
from policy.classifier.model import DEFAULT_PATH, load


def test_training_from_the_packages_reproduces_the_shipped_weights(tmp_path: Path) -> None:
    meta = train.train(tmp_path / "retrained.npz")
    shipped, again = load(DEFAULT_PATH), load(tmp_path / "retrained.npz")
    assert again.vocab == shipped.vocab
    # torch's float sums differ in the last bits between machines, so the int8 token vectors may
    # differ by one step here and there; everything downstream agrees to well within that.
    assert np.abs(again.token_vectors.astype(int) - shipped.token_vectors.astype(int)).max() <= 1
    assert np.corrcoef(again.ngram, shipped.ngram)[0, 1] > 0.999
    assert np.corrcoef(again.embedding, shipped.embedding)[0, 1] > 0.999
    for key in ("threshold", "document_threshold"):
        assert abs(meta[key] - shipped.meta[key]) <= 0.01, (key, meta[key], shipped.meta[key])
    assert {k: v for k, v in meta.items() if k not in ("threshold", "document_threshold", "validation")} == {
        k: v for k, v in shipped.meta.items() if k not in ("threshold", "document_threshold", "validation")
    }
