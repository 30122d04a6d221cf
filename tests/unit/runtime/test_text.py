"""The script facts the policy's stream moderator and the inference service's coalescing share
(services/runtime/text.py)."""

from __future__ import annotations

from services.runtime.text import CJK_RANGES, ZWJ, extends_grapheme, is_cjk, writes_no_spaces


def test_is_cjk_is_exactly_the_ranges() -> None:
    for o in range(0x30000):
        assert is_cjk(chr(o)) == any(low <= o <= high for low, high in CJK_RANGES), hex(o)


def test_marks_that_attach_to_the_character_before() -> None:
    for ch in ("\u0301", "\u3099", ZWJ, "\ufe0f", "\U000e0100", "\U0001f3fb"):
        assert extends_grapheme(ch), hex(ord(ch))
    for ch in ("a", " ", "你", "\uff0c", "\U0001f469"):
        assert not extends_grapheme(ch), hex(ord(ch))


def test_scripts_without_spaces_are_cjk_thai_lao_myanmar_and_khmer() -> None:
    for ch in ("你", "か", "한", "ร", "ລ", "က", "ក"):
        assert writes_no_spaces(ch), ch
    for ch in ("a", "я", "\u03b2", "\u0628", "अ", " "):  # Latin, Cyrillic, Greek, Arabic, Devanagari
        assert not writes_no_spaces(ch), ch
