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
import math
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


def _unit(values: Vector) -> None:
    """Scales ``values`` (one block's counts) to unit length, in place."""
    if values.size:
        values /= np.float32(math.sqrt(float(np.dot(values, values))))


def _distinct_counts(buckets: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], Vector]:
    """Distinct buckets in ascending order and how often each occurs (as float32): what
    ``np.unique(..., return_counts=True)`` gives, in a third of its numpy calls."""
    s = np.sort(buckets)
    first = np.empty(s.size + 1, dtype=bool)
    first[0] = first[-1] = True
    np.not_equal(s[1:], s[:-1], out=first[1:-1])
    starts = first.nonzero()[0]
    counts = starts[1:] - starts[:-1]
    return s[starts[:-1]], counts.astype(np.float32)


def char_buckets(text: str) -> npt.NDArray[np.uint64]:
    """Bucket of every character n-gram of `` text `` (padded with one space each side).

    An n-gram's hash starts from ``n`` and takes its bytes one at a time (``h * _BASE + byte``,
    modulo 2**64): ``n * _BASE**n`` plus the hash of its bytes from zero, and the bytes' hash of
    an (n+1)-gram is its first n bytes' times ``_BASE`` plus its last byte, so each length is
    one step from the one before.
    """
    data = np.frombuffer(f" {text} ".encode("utf-8", "surrogatepass"), dtype=np.uint8).astype(np.uint64)
    size = data.size
    out = np.empty(sum(max(0, size - n + 1) for n in CHAR_NGRAMS), dtype=np.uint64)
    at = 0
    with np.errstate(over="ignore"):
        # Bytes' hash of every n-gram from zero, for n from 1 up; each wanted length's, with its
        # start, goes into ``out`` (3-grams first), and all of them are mixed at once.
        g = data
        for n in range(2, CHAR_NGRAMS[-1] + 1):
            if size < n:
                break
            g = g[:-1] * _BASE
            g += data[n - 1 :]
            if n in CHAR_NGRAMS:
                np.add(g, _SEED[n], out=out[at : at + g.size])
                at += g.size
        out *= _MIX
        out >>= _SHIFT
    return out


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
    chars = char_buckets(text)
    words = word_buckets(text)
    # One sort for both blocks: word buckets are offset past the character ones.
    words += np.uint64(BUCKETS)
    ids, values = _distinct_counts(np.concatenate((chars, words)).view(np.int64))
    split = int(np.searchsorted(ids, BUCKETS))
    _unit(values[:split])
    _unit(values[split:])
    return ids, values
