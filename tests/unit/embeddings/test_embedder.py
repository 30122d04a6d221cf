"""Embed's request rules in front of the batcher (a fake model behind the Encoder protocol)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from services.embeddings.embedder import Embedder
from services.embeddings.encoder import Encoded, ModelInfo
from services.runtime.errors import InvalidArgument, NotFound


class WordModel:
    """One token per word plus two special tokens; 10 tokens at most."""

    info = ModelInfo("words", "abc", 3, 10, 2)

    def __init__(self) -> None:
        self.calls: list[int] = []

    def encode(self, texts: Sequence[str]) -> Encoded:
        self.calls.append(len(texts))
        vectors = np.array([[len(t), 1.0, 0.0] for t in texts], dtype=np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        return Encoded(vectors, [n + 2 for n in self.count_tokens(texts)])

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return [len(t.split()) for t in texts]


async def test_truncation_is_reported_per_text() -> None:
    embedder = Embedder(WordModel())
    result = await embedder.embed(["one two", " ".join(["w"] * 20)])
    assert result.truncated == [False, True]
    assert result.token_counts == [4, 10] and result.total_tokens == 14
    assert result.vectors.shape == (2, 3)
    await embedder.close()


async def test_reject_oversized_names_the_texts_and_the_limit() -> None:
    embedder = Embedder(WordModel())
    with pytest.raises(
        InvalidArgument, match=r"1 text\(s\) exceed the model limit of 8 tokens \(texts\[1\] has 9\)"
    ):
        await embedder.embed(["fine", " ".join(["w"] * 9)], reject_oversized=True)
    await embedder.close()


@pytest.mark.parametrize(
    ("texts", "model", "error", "message"),
    [
        ([], "", InvalidArgument, "texts must not be empty"),
        (["a", ""], "", InvalidArgument, r"texts\[1\] is empty"),
        (["a"] * 5, "", InvalidArgument, "at most 4 texts per request, got 5"),
        (["a"], "other", NotFound, "embedding model 'other' is not served here"),
    ],
)
async def test_bad_requests(texts: list[str], model: str, error: type[Exception], message: str) -> None:
    embedder = Embedder(WordModel(), max_texts=4)
    with pytest.raises(error, match=message):
        await embedder.embed(texts, model=model)
    await embedder.close()


async def test_embed_many_submits_slices_in_order() -> None:
    model = WordModel()
    embedder = Embedder(model, max_batch=8, max_texts=4)
    texts = [" ".join(["w"] * (i % 5 + 1)) for i in range(30)]
    result = await embedder.embed_many(texts, slice_size=12)
    assert result.vectors.shape == (30, 3)
    assert result.token_counts == [i % 5 + 3 for i in range(30)]
    assert max(model.calls) <= 8
    await embedder.close()
