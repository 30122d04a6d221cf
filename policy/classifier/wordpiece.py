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


class WordPiece:
    """Token ids of a text; ``unk`` for a word no sequence of pieces covers."""

    def __init__(self, vocab: Sequence[str], unk: str = "[UNK]") -> None:
        self.ids = {token: i for i, token in enumerate(vocab)}
        self.unk = self.ids[unk]
        self._cache: dict[str, tuple[int, ...]] = {}

    def word(self, word: str) -> tuple[int, ...]:
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        out: list[int] = []
        if len(word) > MAX_WORD_CHARS:
            result: tuple[int, ...] = (self.unk,)
        else:
            start = 0
            while start < len(word):
                end = len(word)
                piece = None
                while start < end:
                    candidate = word[start:end] if start == 0 else "##" + word[start:end]
                    piece = self.ids.get(candidate)
                    if piece is not None:
                        break
                    end -= 1
                if piece is None:
                    out = [self.unk]
                    break
                out.append(piece)
                start = end
            result = tuple(out)
        if len(self._cache) < 50_000:
            self._cache[word] = result
        return result

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
