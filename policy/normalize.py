"""Text normalization before injection matching: undo the usual obfuscations.

:func:`variants` returns the forms of a text worth matching: the folded text
(invisible characters removed, NFKD with accents dropped, homoglyphs mapped to
Latin, case-folded), and, only when they differ from it, the leetspeak-decoded
form, the form with letter-by-letter spacing closed up, and any base64 payloads
decoded. Each variant says whether it undid an obfuscation, which the injection
detector counts as evidence of intent.
"""

from __future__ import annotations

import base64
import binascii
import re
import unicodedata
from dataclasses import dataclass

import regex

# Zero-width and other invisible format characters (Unicode category Cf) plus soft hyphen.
_INVISIBLE = regex.compile(r"[\p{Cf}\u00ad\u034f\u115f\u1160\u3164\uffa0]")

# Cyrillic, Greek and other letters that look like Latin ones, and the Latin letter each imitates.
_HOMOGLYPHS = str.maketrans(
    (
        "\u0430\u0432\u0435\u0451\u043a\u043c\u043d\u043e"
        "\u0440\u0441\u0442\u0443\u0445\u0456\u0457\u0458"
        "\u0455\u0501\u051b\u051d\u04cf\u0261\u0578\u057d"
        "\u0410\u0412\u0415\u041a\u041c\u041d\u041e\u0420"
        "\u0421\u0422\u0425\u0406\u0408\u0405\u0423\u03b1"
        "\u03b2\u03b5\u03b7\u03b9\u03ba\u03bd\u03bf\u03c1"
        "\u03c4\u03c5\u03c7\u03b3\u03c9\u0391\u0392\u0395"
        "\u0396\u0397\u0399\u039a\u039c\u039d\u039f\u03a1"
        "\u03a4\u03a5\u03a7\u0131\u0237\u2113\u2170\uab75"
    ),
    ("abeekmhopctyxiijsdqwlgnuABEKMHOPCTXIJSYabenikvoptuxywABEZHIKMNOPTYXijlii"),
)
_HOMOGLYPH_CHARS = frozenset(chr(c) for c in _HOMOGLYPHS)

# Leetspeak digits and symbols ("@", "|" and "+" stay: e-mail addresses, tables and phone numbers use them).
_LEET = str.maketrans(
    {"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "8": "b", "$": "s", "!": "i"}
)
# A token that mixes letters with leetspeak digits or symbols ("1gn0r3", "pr3v!0us"). The stdlib ``re``
# is used for the helpers below: on these simple classes it is several times faster than ``regex``.
_LEET_HINT = re.compile(r"[a-z][0-9$!]|[0-9$!][a-z]")
_LEET_TOKEN = re.compile(r"[a-z0-9$!]*(?:[a-z][0-9$!]|[0-9$!][a-z])[a-z0-9$!]*")
# Letter-by-letter spacing: "i g n o r e", "i.g.n.o.r.e", "i-g-n-o-r-e".
_SPACED = re.compile(r"(?<![\w])(?:\w[ .\-_*|/]{1,3}){3,}\w(?![\w])")
_SPACING_CHARS = re.compile(r"[ .\-_*|/]")
_WHITESPACE = re.compile(r"[^\S\n]+")
_BASE64 = re.compile(r"(?<![A-Za-z0-9+/=_\-])[A-Za-z0-9+/_\-]{16,}={0,2}(?![A-Za-z0-9+/=_\-])")
_MAX_DECODED = 8


@dataclass(frozen=True, slots=True)
class Variant:
    """One normalized form of a text."""

    text: str
    # What was undone to get it ("" for the plain folded text).
    obfuscation: str


def strip_invisible(text: str) -> str:
    return text if text.isascii() else _INVISIBLE.sub("", text)


def fold(text: str) -> str:
    """Invisible characters removed, accents dropped, homoglyphs to Latin, case-folded, spaces collapsed.

    Newlines stay: role and delimiter blocks are recognized at the start of a line.
    """
    text = strip_invisible(text)
    if not text.isascii():
        text = text.translate(_HOMOGLYPHS)
        decomposed = unicodedata.normalize("NFKD", text)
        text = "".join(c for c in decomposed if not unicodedata.combining(c))
    return _WHITESPACE.sub(" ", text.casefold())


def _has_mixed_script_word(text: str) -> bool:
    for word in text.split():
        if any(c in _HOMOGLYPH_CHARS for c in word) and any("a" <= c.lower() <= "z" for c in word):
            return True
    return False


def _invisible_inside_word(text: str) -> bool:
    if text.isascii():
        return False
    for m in _INVISIBLE.finditer(text):
        i = m.start()
        if 0 < i < len(text) - 1 and text[i - 1].isalnum() and text[i + 1].isalnum():
            return True
    return False


def decode_base64_payloads(text: str) -> list[str]:
    """Printable text hidden in base64 runs of ``text`` (at most a few)."""
    out: list[str] = []
    for m in _BASE64.finditer(text):
        token = m.group()
        if token.isdigit() or (token.isalpha() and (token.islower() or token.isupper())):
            continue
        padded = token + "=" * (-len(token) % 4)
        try:
            raw = base64.b64decode(padded, altchars=b"-_" if ("-" in token or "_" in token) else None)
            decoded = raw.decode("utf-8")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            continue
        printable = sum(1 for c in decoded if c.isprintable() or c in "\n\t")
        if decoded and printable / len(decoded) >= 0.95 and " " in decoded:
            out.append(decoded)
            if len(out) >= _MAX_DECODED:
                break
    return out


def _one_as_l(token: str) -> str:
    """Reads "1" as "l" inside a word, as "i" at its start ("1gn0re" -> "ign0re", "ru1es" -> "rules")."""
    return token[:1] + token[1:].replace("1", "l")


def variants(text: str) -> list[Variant]:
    """The forms of ``text`` an injection detector should match (see module doc)."""
    folded = fold(text)
    hidden = ""
    if _invisible_inside_word(text):
        hidden = "invisible characters"
    elif not text.isascii() and _has_mixed_script_word(text):
        hidden = "homoglyphs"
    out = [Variant(folded, hidden)]
    leet = folded
    if _LEET_HINT.search(folded):
        leet = _LEET_TOKEN.sub(lambda m: m.group().translate(_LEET), folded)
    if leet != folded:
        out.append(Variant(leet, "leetspeak"))
        if "1" in folded:  # "1" stands for "l" as often as for "i" ("ru1es")
            other = _LEET_TOKEN.sub(lambda m: _one_as_l(m.group()).translate(_LEET), folded)
            if other != leet:
                out.append(Variant(other, "leetspeak"))
    spaced = _SPACED.sub(lambda m: _SPACING_CHARS.sub("", m.group()), leet)
    if spaced != leet:
        out.append(Variant(spaced, "spacing"))
    for decoded in decode_base64_payloads(text):
        out.append(Variant(fold(decoded), "base64"))
    return out
