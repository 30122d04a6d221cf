"""The injection classifier: a logistic head over hashed n-grams and static MiniLM token vectors.

Scoring a text: fold it (:func:`policy.normalize.fold`); a retrieved document or tool result longer
than ``WINDOW_CHARS`` is cut into overlapping windows (an instruction buried in a long document is
judged on its own neighbourhood, not diluted by the rest; a message is judged whole, as the attacks
it was trained on are), and for each window add

- the head's weights of its character 3-5-gram and word 1-2-gram buckets
  (:mod:`policy.classifier.features`), and
- the head's weights times the mean of its WordPiece tokens' static vectors
  (all-MiniLM-L6-v2 run on each vocabulary token alone, centred, reduced to 128 dimensions
  and stored as int8; this is what lets a paraphrase with words the training data never had
  still land near the attacks it resembles),

then a sigmoid. A document's score is its highest window's; windows see less context, so
documents have their own threshold (``document_threshold``), picked the same way.
``benchmarks/injection_classifier_train.py`` builds the weights file from third-party data (see
:mod:`benchmarks.injection_datasets`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from policy.classifier.features import BUCKETS, features
from policy.classifier.wordpiece import WordPiece

DEFAULT_PATH = Path(__file__).with_name("injection-v1.npz")
WINDOW_CHARS = 400
WINDOW_STEP = 200
# Fewer words than this and the classifier abstains (score 0; the patterns still run): every text
# of one or two words in its training data is an attack, so on "ok" or "see above" it would only
# repeat that artifact of the data.
MIN_WORDS = 3
_MEMO_SIZE = 64
FORMAT = 1
# A word, or one CJK ideograph (those languages do not separate words with spaces).
_WORDS = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]|[^\W_\u3400-\u9fff\uf900-\ufaff]+")


@dataclass(frozen=True)
class Weights:
    ngram: npt.NDArray[np.float32]  # (2 * BUCKETS,)
    token_vectors: npt.NDArray[np.int8]  # (vocab, dims), row / 127 is a unit vector
    embedding: npt.NDArray[np.float32]  # (dims,)
    bias: float
    vocab: tuple[str, ...]
    meta: dict[str, Any]


def save(path: Path, weights: Weights) -> None:
    np.savez_compressed(
        path,
        ngram=weights.ngram.astype(np.float16),
        token_vectors=weights.token_vectors,
        embedding=weights.embedding.astype(np.float32),
        bias=np.array([weights.bias], dtype=np.float64),
        vocab=np.frombuffer("\n".join(weights.vocab).encode("utf-8"), dtype=np.uint8),
        meta=np.frombuffer(json.dumps(weights.meta, sort_keys=True).encode("utf-8"), dtype=np.uint8),
    )


def load(path: Path = DEFAULT_PATH) -> Weights:
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(z["meta"].tobytes().decode("utf-8"))
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path}: classifier format {meta.get('format')!r}, this code reads {FORMAT}")
        return Weights(
            ngram=z["ngram"].astype(np.float32),
            token_vectors=z["token_vectors"],
            embedding=z["embedding"].astype(np.float32),
            bias=float(z["bias"][0]),
            vocab=tuple(z["vocab"].tobytes().decode("utf-8").split("\n")),
            meta=meta,
        )


def windows(text: str) -> list[str]:
    """``text`` whole when short, else overlapping windows cut at whitespace."""
    if len(text) <= WINDOW_CHARS:
        return [text]
    out: list[str] = []
    start = 0
    while True:
        end = min(len(text), start + WINDOW_CHARS)
        if end < len(text):
            cut = text.rfind(" ", start + WINDOW_STEP, end)
            end = cut if cut > 0 else end
        out.append(text[start:end])
        if end >= len(text):
            return out
        nxt = text.find(" ", start + WINDOW_STEP, end)
        start = nxt + 1 if nxt > 0 else start + WINDOW_STEP


class InjectionClassifier:
    """Probability that a folded text is an injection or jailbreak attempt. Thread-safe."""

    def __init__(self, weights: Weights) -> None:
        self.weights = weights
        self.tokenizer = WordPiece(weights.vocab)
        # Every token's vector dotted with the head once, so a window costs a gather and a sum.
        vectors = weights.token_vectors.astype(np.float32) / np.float32(127.0)
        self._token_scores = vectors @ weights.embedding
        self._vectors = vectors
        self.meta = weights.meta
        self._memo: dict[tuple[str, bool], float] = {}

    def token_part(self, folded: str) -> float:
        ids = self.tokenizer.tokenize(folded)
        if not ids:
            return 0.0
        index = np.array(ids, dtype=np.intp)
        count = np.intp(len(ids))
        # The mean of the tokens' vectors, computed as ``ndarray.mean`` does (a float32 sum, then a
        # division by the count), without its Python-level wrapper: this runs on every text.
        mean = np.add.reduce(self._vectors[index], axis=0)
        np.true_divide(mean, count, out=mean, casting="unsafe")
        norm = float(np.sqrt(np.dot(mean, mean)))
        if norm == 0.0:
            return 0.0
        return float(np.float32(np.add.reduce(self._token_scores[index]) / count)) / norm

    def logit(self, folded: str) -> float:
        ids, values = features(folded)
        return float(np.dot(self.weights.ngram[ids], values)) + self.token_part(folded) + self.weights.bias

    def score(self, folded: str, *, windowed: bool = False) -> float:
        """Probability of the whole text, or of its highest window (``windowed``)."""
        key = (folded, windowed)
        cached = self._memo.get(key)
        if cached is not None:
            return cached
        if len(_WORDS.findall(folded, 0, 4096)) < MIN_WORDS:
            probability = 0.0
        else:
            best = max(self.logit(w) for w in windows(folded)) if windowed else self.logit(folded)
            probability = float(1.0 / (1.0 + np.exp(-best)))
        # Two rules of one ruleset (block and flag at two thresholds) score the same text: once.
        if len(self._memo) >= _MEMO_SIZE:
            with contextlib.suppress(RuntimeError, StopIteration):  # another thread evicted it
                self._memo.pop(next(iter(self._memo)), None)
        self._memo[key] = probability
        return probability


@functools.cache
def default() -> InjectionClassifier:
    """The shipped classifier, loaded once per process."""
    return InjectionClassifier(load(DEFAULT_PATH))


__all__ = ["BUCKETS", "DEFAULT_PATH", "InjectionClassifier", "Weights", "default", "load", "save", "windows"]
