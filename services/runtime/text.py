"""Text facts that more than one service must agree on.

The policy service's stream moderator cuts after any CJK character (those scripts write no
spaces between words, so each character counts as a word of its own) and its keyword rules find
a word inside a run of such characters or of the other scripts written without spaces; the
inference service's stream coalescing must know where the moderator can first release text
(services/inference/coalesce.py): all read the scripts from here.
"""

from __future__ import annotations

import unicodedata

ZWJ = "\u200d"

# Kana, CJK ideographs (extension A, the unified block, compatibility, the supplementary
# planes) and Hangul syllables.
CJK_RANGES: tuple[tuple[int, int], ...] = (
    (0x3040, 0x30FF),
    (0x3400, 0x4DBF),
    (0x4E00, 0x9FFF),
    (0xAC00, 0xD7AF),
    (0xF900, 0xFAFF),
    (0x20000, 0x2FFFF),
)

# Every script that writes no space between words: CJK, Thai, Lao, Myanmar and Khmer (the
# policy's keyword rules find a word inside a run of them).
UNSPACED_RANGES: tuple[tuple[int, int], ...] = (
    (0x0E00, 0x0E7F),
    (0x0E80, 0x0EFF),
    (0x1000, 0x109F),
    (0x1780, 0x17FF),
    *CJK_RANGES,
)

# The same ranges as the body of a regular-expression character class (``[...]``).
UNSPACED_CLASS = "".join(f"\\U{low:08x}-\\U{high:08x}" for low, high in UNSPACED_RANGES)


def is_cjk(ch: str) -> bool:
    """Whether ``ch`` is in :data:`CJK_RANGES` (spelled out: the moderator asks this per character)."""
    o = ord(ch)
    return o >= 0x3040 and (
        o <= 0x30FF
        or 0x3400 <= o <= 0x4DBF
        or 0x4E00 <= o <= 0x9FFF
        or 0xAC00 <= o <= 0xD7AF
        or 0xF900 <= o <= 0xFAFF
        or 0x20000 <= o <= 0x2FFFF
    )


def extends_grapheme(ch: str) -> bool:
    """True if ``ch`` belongs to the grapheme before it (combining mark, ZWJ, variation selector,
    skin tone): no cut may fall before it."""
    o = ord(ch)
    return (
        unicodedata.combining(ch) != 0
        or ch == ZWJ
        or 0xFE00 <= o <= 0xFE0F
        or 0xE0100 <= o <= 0xE01EF
        or 0x1F3FB <= o <= 0x1F3FF  # skin tone modifiers
        or unicodedata.category(ch) in ("Mn", "Me", "Mc")
    )


def writes_no_spaces(ch: str) -> bool:
    """Whether ``ch`` is in :data:`UNSPACED_RANGES`."""
    o = ord(ch)
    return any(low <= o <= high for low, high in UNSPACED_RANGES)
