"""Real English sentences for the embeddings benchmark, and their vectors, cached on disk.

The sentences are the docstrings of the Python packages installed next to llmesh
(pinned versions, so the corpus is the same on every machine with the same
install): technical prose with many near-duplicates, which is a harder case for
approximate search than random vectors are easy. Both the sentences and their
all-MiniLM-L6-v2 vectors are cached under ``<data dir>/bench/embeddings/``
because embedding 100k sentences takes minutes on two cores.
"""

from __future__ import annotations

import ast
import hashlib
import logging
import re
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from services.embeddings.encoder import Vectors
from services.runtime.settings import data_dir

log = logging.getLogger(__name__)

_SPLIT = re.compile(r"(?<=[.!?])\s+")
MIN_CHARS, MAX_CHARS = 40, 300


def cache_dir() -> Path:
    path = data_dir() / "bench" / "embeddings"
    path.mkdir(parents=True, exist_ok=True)
    return path


def sentences(count: int) -> list[str]:
    """``count`` distinct docstring sentences, in a fixed order (cached)."""
    cached = cache_dir() / "sentences.txt"
    if cached.exists():
        lines = cached.read_text(encoding="utf-8").splitlines()
        if len(lines) >= count:
            return lines[:count]
    found: dict[str, None] = {}
    roots = [Path(sysconfig.get_paths()["purelib"]), Path(sysconfig.get_paths()["stdlib"])]
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            _collect(path, found)
            if len(found) >= count:
                break
        if len(found) >= count:
            break
    lines = list(found)
    if len(lines) < count:
        raise RuntimeError(f"only {len(lines)} docstring sentences found, {count} needed")
    # A fixed shuffle, so that a prefix of the corpus is not one package's vocabulary.
    order = np.random.default_rng(0).permutation(len(lines))
    lines = [lines[i] for i in order]
    cached.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return lines[:count]


def _collect(path: Path, found: dict[str, None]) -> None:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="ignore"))
    except (SyntaxError, ValueError, RecursionError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node)
            if not doc:
                continue
            for sentence in _SPLIT.split(" ".join(doc.split())):
                if MIN_CHARS <= len(sentence) <= MAX_CHARS and sentence[0].isupper():
                    found.setdefault(sentence, None)


PART = 5000


def _part_file(piece: Sequence[str]) -> Path:
    digest = hashlib.sha256("\n".join(piece).encode()).hexdigest()[:16]
    return cache_dir() / f"vectors-{digest}.npy"


def vectors_cached(texts: Sequence[str]) -> bool:
    """Whether :func:`vectors` of ``texts`` needs no model time."""
    return all(_part_file(texts[i : i + PART]).exists() for i in range(0, len(texts), PART))


def static_vectors(texts: Sequence[str], model_path: str) -> Vectors:
    """Static sentence vectors: the mean of the model's input token embeddings, centred and
    normalised. Seconds for 100k sentences instead of the transformer's minutes to hours; same
    dimension and the neighbourhood structure of real text, used where the transformer's vectors
    of the whole corpus are not cached (the report says which)."""
    from safetensors.numpy import load_file
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    weights = load_file(str(Path(model_path) / "model.safetensors"))
    table = next(v for k, v in weights.items() if k.endswith("word_embeddings.weight")).astype(np.float32)
    ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    out = np.zeros((len(texts), table.shape[1]), dtype=np.float32)
    for i, row in enumerate(ids):
        if row:
            out[i] = table[row].mean(axis=0)
    out -= out.mean(axis=0)
    out /= np.linalg.norm(out, axis=1, keepdims=True) + 1e-9
    return out


def vectors(texts: Sequence[str], encode: Callable[[list[str]], Vectors], part: int = PART) -> Vectors:
    """Vectors of ``texts``, cached in parts of ``part`` sentences (keyed by their hash), so an
    interrupted first run keeps what it embedded."""
    parts = []
    for start in range(0, len(texts), part):
        piece = list(texts[start : start + part])
        cached = _part_file(piece)
        if cached.exists():
            parts.append(np.load(cached))
            continue
        log.info(
            "embedding corpus sentences %d-%d of %d (cached in %s)",
            start,
            start + len(piece),
            len(texts),
            cached,
        )
        matrix = np.ascontiguousarray(encode(piece), dtype=np.float32)
        np.save(cached, matrix)
        parts.append(matrix)
    out: Vectors = np.ascontiguousarray(np.concatenate(parts), dtype=np.float32)
    return out
