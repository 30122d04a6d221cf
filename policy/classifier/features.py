"""Hashed n-gram features of a text: what the injection classifier's linear head reads.

Two blocks, each L2-normalised: character 3- to 5-grams of the folded text (robust to
inflections, typos and words the training data never had) and word 1- and 2-grams. Every
n-gram is hashed into ``BUCKETS`` buckets per block, so the model is a fixed-size weight
vector and no vocabulary ships with it. The character hash is a polynomial rolling hash
computed with numpy over the whole text at once: the features of a 1 KB text cost well
under a millisecond, and training and serving share this one function.
"""

from __future__ import annotations

import itertools
import re
import zlib

import numpy as np
import numpy.typing as npt

BUCKET_BITS = 18
BUCKETS = 1 << BUCKET_BITS
CHAR_NGRAMS = (3, 4, 5)
_WORD = re.compile(r"\w+")
_SPACES = re.compile(r"\s+")
# Odd 64-bit multipliers: the rolling hash's base and the final mix (Fibonacci hashing).
_BASE = np.uint64(0x100000001B3)
_MIX = np.uint64(0x9E3779B97F4A7C15)
_SHIFT = np.uint64(64 - BUCKET_BITS)
# n * _BASE**n modulo 2**64: where an n-gram's hash starts before its bytes.
_SEED = {n: np.uint64(n * pow(int(_BASE), n, 1 << 64) % (1 << 64)) for n in CHAR_NGRAMS}

Vector = npt.NDArray[np.float32]


def _normalised_counts(buckets: npt.NDArray[np.uint64]) -> tuple[npt.NDArray[np.int64], Vector]:
    """Distinct buckets and their L2-normalised counts."""
    if buckets.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    ids, counts = np.unique(buckets.astype(np.int64), return_counts=True)
    values = counts.astype(np.float32)
    values /= np.float32(np.sqrt(float(np.dot(values, values))))
    return ids, values


def char_buckets(text: str) -> npt.NDArray[np.uint64]:
    """Bucket of every character n-gram of `` text `` (padded with one space each side).

    An n-gram's hash starts from ``n`` and takes its bytes one at a time (``h * _BASE + byte``,
    modulo 2**64): ``n * _BASE**n`` plus the hash of its bytes from zero, and the bytes' hash of
    an (n+1)-gram is its first n bytes' times ``_BASE`` plus its last byte, so each length is
    one step from the one before.
    """
    data = np.frombuffer(f" {text} ".encode("utf-8", "surrogatepass"), dtype=np.uint8).astype(np.uint64)
    out: list[npt.NDArray[np.uint64]] = []
    with np.errstate(over="ignore"):
        # Bytes' hash of every n-gram from zero, for n from 1 up.
        g = data
        for n in range(2, CHAR_NGRAMS[-1] + 1):
            if data.size < n:
                break
            g = g[:-1] * _BASE + data[n - 1 :]
            if n in CHAR_NGRAMS:
                out.append(((g + _SEED[n]) * _MIX) >> _SHIFT)
    return np.concatenate(out) if out else np.zeros(0, dtype=np.uint64)


def word_buckets(text: str) -> npt.NDArray[np.uint64]:
    """Bucket of every word and pair of adjacent words."""
    words = _WORD.findall(text)
    grams = [*words, *(f"{a} {b}" for a, b in itertools.pairwise(words))]
    if not grams:
        return np.zeros(0, dtype=np.uint64)
    hashed = np.fromiter((zlib.crc32(g.encode()) for g in grams), dtype=np.uint64, count=len(grams))
    with np.errstate(over="ignore"):
        return (hashed * _MIX) >> _SHIFT


def features(folded: str) -> tuple[npt.NDArray[np.int64], Vector]:
    """Sparse feature vector of a folded text: (indices into 2 * BUCKETS, values).

    Indices below ``BUCKETS`` are character n-grams, the rest word n-grams.
    """
    text = _SPACES.sub(" ", folded).strip()
    c_ids, c_vals = _normalised_counts(char_buckets(text))
    w_ids, w_vals = _normalised_counts(word_buckets(text))
    return np.concatenate([c_ids, w_ids + BUCKETS]), np.concatenate([c_vals, w_vals])
