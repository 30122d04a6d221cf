"""WordPiece tokenization of folded text over a BERT vocabulary, without a tokenizer library.

The classifier's token table is indexed by the vocabulary of all-MiniLM-L6-v2 (BERT uncased).
Its input is already case-folded with accents stripped (:func:`policy.normalize.fold`), so
this is the rest of BERT's pipeline: split on whitespace, punctuation and CJK characters, then
greedy longest-match-first word pieces (``##`` marks a continuation). Training and serving both
tokenize with this module, so the two always agree.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

MAX_WORD_CHARS = 100
# Words whose pieces are kept; when full, the cache starts again.
CACHE_WORDS = 50_000
# A run of word characters, or any single other visible character (punctuation, a CJK ideograph).
_PIECES = re.compile(r"[^\W_]+|\S", re.UNICODE)


def _is_cjk(char: str) -> bool:
    cp = ord(char)
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


def _prefixes(pieces: dict[str, int]) -> frozenset[str]:
    return frozenset(piece[:k] for piece in pieces for k in range(1, len(piece) + 1))


class WordPiece:
    """Token ids of a text; ``unk`` for a word no sequence of pieces covers."""

    def __init__(self, vocab: Sequence[str], unk: str = "[UNK]") -> None:
        self.ids = {token: i for i, token in enumerate(vocab)}
        self.unk = self.ids[unk]
        # Pieces that begin a word, pieces that continue one (without their ``##``), and every
        # prefix of each: the longest-match search walks forward while what it has read is still
        # the start of some piece, so a piece costs its own length in lookups, not the word's
        # (a long word of short pieces, an ID or a hash, cost its length squared).
        self._initial = self.ids
        self._continuing = {token[2:]: i for token, i in self.ids.items() if token.startswith("##")}
        self._initial_prefixes = _prefixes(self._initial)
        self._continuing_prefixes = _prefixes(self._continuing)
        self._cache: dict[str, tuple[int, ...]] = {}

    def word(self, word: str) -> tuple[int, ...]:
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        result = self._pieces(word)
        if len(self._cache) >= CACHE_WORDS:
            # Full (new IDs and hashes come with every request): start again, so the words that
            # keep coming back are cached again at once instead of never.
            self._cache.clear()
        self._cache[word] = result
        return result

    def _pieces(self, word: str) -> tuple[int, ...]:
        """Greedy longest-match-first pieces of ``word``; ``(unk,)`` if some part has none."""
        n = len(word)
        if n > MAX_WORD_CHARS:
            return (self.unk,)
        out: list[int] = []
        start = 0
        pieces, prefixes = self._initial, self._initial_prefixes
        while start < n:
            found = -1
            end = start
            piece = 0
            while end < n:
                end += 1
                read = word[start:end]
                if read not in prefixes:
                    break
                hit = pieces.get(read)
                if hit is not None:
                    found, piece = end, hit
            if found < 0:
                return (self.unk,)
            out.append(piece)
            start = found
            pieces, prefixes = self._continuing, self._continuing_prefixes
        return tuple(out)

    def tokenize(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in _PIECES.findall(text):
            if not piece.isascii() and any(_is_cjk(c) for c in piece):
                # BERT splits every CJK ideograph into a word of its own.
                for chunk in re.findall(
                    r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]|[^\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+",
                    piece,
                ):
                    ids.extend(self.word(chunk))
            elif unicodedata.category(piece[0]).startswith("C"):
                continue
            else:
                ids.extend(self.word(piece))
        return ids
