"""Text normalization: undo the usual obfuscations before detectors match.

:func:`normalized` is what every rule sees besides the text itself (:mod:`policy.engine`,
:mod:`policy.stream`): format characters (zero-width etc.) removed, Unicode NFKC
(full-width forms, ligatures, math letters), confusable Cyrillic and Greek letters
mapped to the Latin letter of the same case, and runs of spaced-out single letters
("i g n o r e", "b.o.m.b") joined, with a map from every normalized character back
to the span of the original it stands for, so that matches on the normalized text
can be redacted in the original. Case is kept, and so is spacing between digits
("4111 1111 1111 1111" must still read as a card number).

:func:`variants` is the injection detector's own, more aggressive folding: the folded
text (invisible characters removed, NFKD with accents dropped, homoglyphs mapped to
Latin, case-folded), and, only when they differ from it, the leetspeak-decoded
form, the form with letter-by-letter spacing closed up, and any base64 payloads
decoded. Each variant says whether it undid an obfuscation, which the injection
detector counts as evidence of intent.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import functools
import re
import unicodedata
from dataclasses import dataclass

import regex

# Zero-width and other invisible format characters (Unicode category Cf), soft hyphen, fillers and
# variation selectors.
_INVISIBLE = regex.compile(r"[\p{Cf}\u00ad\u034f\u115f\u1160\u3164\uffa0\ufe00-\ufe0f\U000e0100-\U000e01ef]")

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


# Texts up to this long keep their variants in a small memo: the rules of one check ask for the same
# text's forms several times (the pattern detector, the classifier at two thresholds).
_VARIANTS_MEMO_CHARS = 4096


def variants(text: str) -> tuple[Variant, ...]:
    """The forms of ``text`` an injection detector should match (see module doc)."""
    if len(text) <= _VARIANTS_MEMO_CHARS:
        return _variants_memo(text)
    return _variants(text)


def _variants(text: str) -> tuple[Variant, ...]:
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
    # The form every other detector sees: spaced-out words closed up one by one ("i g n o r e  a l l"
    # -> "ignore  all"), where the spacing variant above glues them all together.
    norm = normalized(text)
    if norm.joined:
        words = fold(norm.text)
        if words not in (v.text for v in out):
            out.append(Variant(words, "spacing"))
    payloads = decode_base64_payloads(text)
    if norm.changed:  # e.g. a payload with zero-width characters inside, or in full-width letters
        payloads += [p for p in decode_base64_payloads(norm.text) if p not in payloads]
    for decoded in payloads:
        out.append(Variant(fold(decoded), "base64"))
    return tuple(out)


_variants_memo = functools.lru_cache(maxsize=128)(_variants)


# --- Normalized text with an offset map (every detector) ---

# Removed from the normalized text; the BMP characters of it that are not of category Cf.
_REMOVED = _INVISIBLE
_REMOVED_OTHER = frozenset("\u00ad\u034f\u115f\u1160\u3164\uffa0" + "".join(map(chr, range(0xFE00, 0xFE10))))
# What may separate the letters of a spaced-out word ("i g n o r e", "b.o.m.b", "a-d-m-i-n").
_SEPARATORS = " ._-*|/"
# A run of at least three single letters, one separator (1 to 3 characters, the same throughout)
# between each: words spaced out one by one ("i g n o r e  a l l") stay apart. Letters only
# ([^\W\d_]): spaced digits are how card and phone numbers are written.
_RUN = re.compile(r"(?<!\w)[^\W\d_]([ ._\-*|/]{1,3})[^\W\d_](?:\1[^\W\d_])+(?!\w)")
# Cheap test that ASCII text has no run: its second and third letters, each after a separator.
_RUN_HINT_ASCII = re.compile(r"[ ._\-*|/][A-Za-z][ ._\-*|/]{1,3}[A-Za-z](?![A-Za-z0-9_])")


@functools.cache
def _changing() -> re.Pattern[str]:
    """A character that may not fold to itself, or that joins the character before it.

    Built on first use (some 30 ms): every BMP character that NFKC changes, that combines
    (a mark), that is removed or a confusable, listed one by one so that ``re`` compiles the
    class to a bitmap; any character beyond the BMP is taken as a candidate (emoji mostly,
    which fold to themselves).
    """
    skip = ((0x3400, 0x4DC0), (0x4E00, 0xA000), (0xAC00, 0xD7A4), (0xD800, 0xF900))  # CJK, Hangul, surrogates
    chars: list[str] = []
    o = 0x80
    while o < 0x10000:
        gap = next((b for a, b in skip if a == o), None)
        if gap is not None:
            o = gap
            continue
        c = chr(o)
        if (
            not unicodedata.is_normalized("NFKC", c)
            or unicodedata.combining(c)
            or c in _HOMOGLYPH_CHARS
            or unicodedata.category(c) == "Cf"
            or c in _REMOVED_OTHER
        ):
            chars.append(c)
        o += 1
    return re.compile("[" + "".join(re.escape(c) for c in chars) + "\U00010000-\U0010ffff]")


@functools.lru_cache(maxsize=8192)
def _fold_cluster(cluster: str) -> str:
    """One character with its combining marks: removed, NFKC, confusables to Latin (case kept)."""
    if _REMOVED.fullmatch(cluster):
        return ""
    out = unicodedata.normalize("NFKC", _REMOVED.sub("", cluster))
    if not out.isascii():
        out = _REMOVED.sub("", out)
    return out.translate(_HOMOGLYPHS)


def _fold_map(text: str) -> tuple[str, list[int], list[int]] | None:
    """``text`` (not ASCII) folded cluster by cluster with each folded character's original span;
    None when it folds to itself.

    A cluster is a character and the combining marks after it, so NFKC composes what it can
    ("e" + U+0301 -> "é") while every change stays local: the same characters fold the same way
    wherever a text is cut, which the stream moderator relies on.
    """
    out: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    n = len(text)
    done = 0  # text[:done] is mapped
    changed = False

    def keep(a: int, b: int) -> None:
        if b > a:
            out.append(text[a:b])
            starts.extend(range(a, b))
            ends.extend(range(a + 1, b + 1))

    for hit in _changing().finditer(text):
        j = hit.start()
        if j < done:
            continue  # a mark already taken into the cluster before it
        if j > done and unicodedata.combining(text[j]):
            j -= 1  # a mark belongs to the character before it
        k = j + 1
        while k < n and unicodedata.combining(text[k]):
            k += 1
        cluster = text[j:k]
        folded = _fold_cluster(cluster)
        keep(done, j)
        if folded == cluster:
            keep(j, k)
        else:
            changed = True
            out.append(folded)
            starts.extend([j] * len(folded))
            ends.extend([k] * len(folded))
        done = k
    if not changed:
        return None
    keep(done, n)
    return "".join(out), starts, ends


def _letter(ch: str) -> bool:
    """What :data:`_RUN` takes for a letter (``[^\\W\\d_]``)."""
    return ch.isalnum() and not ch.isdecimal()


def _open_tail(text: str) -> int | None:
    """Start of a spaced-letter run that more text could still extend ("... b o m"), if any.

    Deliberately loose (any separators, no length minimum): it only has to start no later
    than any run :data:`_RUN` could find once more text arrives.
    """
    i = len(text)
    gap = 0
    while i > 0 and text[i - 1] in _SEPARATORS and gap <= 3:
        i -= 1
        gap += 1
    if gap > 3:
        return None
    start = None
    # ``_`` aside (it may be a separator), a word character before a letter makes it no single one.
    while i > 0 and _letter(text[i - 1]) and not (i >= 2 and text[i - 2].isalnum()):
        i -= 1
        start = i
        gap = 0
        while i > 0 and text[i - 1] in _SEPARATORS and gap <= 3:
            i -= 1
            gap += 1
        if gap == 0 or gap > 3:
            break
    return start


@dataclass(frozen=True, slots=True)
class Normalized:
    """A text, its normalized form, and where each normalized character came from."""

    original: str
    text: str
    # Original span of each character of ``text``; None when ``text`` is ``original``.
    starts: list[int] | None
    ends: list[int] | None
    # Where a spaced-letter run that more text could extend begins (original offset), if any.
    open_from: int | None
    # A run of spaced-out letters was closed up.
    joined: bool = False

    @property
    def changed(self) -> bool:
        return self.starts is not None

    def original_index(self, i: int) -> int:
        """Original offset of normalized character ``i`` (the original's length past the end)."""
        if self.starts is None:
            return i
        return self.starts[i] if i < len(self.starts) else len(self.original)

    def normalized_index(self, i: int) -> int:
        """The first normalized character that comes from original offset ``i`` or later."""
        if self.starts is None:
            return i
        return bisect.bisect_left(self.starts, i)

    def original_span(self, start: int, end: int) -> tuple[int, int]:
        """The original text a normalized span stands for.

        Removed characters inside the span are in it, and so are those after it when it ends the
        text (a match that ends the normalized text ends the original one: a stream must see that
        more text may still extend it). An expanded character (NFKC "ﬁ" -> "fi") is taken whole.
        """
        if self.starts is None or self.ends is None:
            return start, end
        if end <= start:
            at = self.original_index(start)
            return at, at
        first = self.starts[start]
        last = len(self.original) if end >= len(self.ends) else self.ends[end - 1]
        return first, last


# Texts up to this long are kept (the last few): the engine, the injection detector and the
# classifier each ask for the same message's normalized form.
_CACHED_CHARS = 8192


def normalized(text: str) -> Normalized:
    """``text`` normalized for detectors (see the module doc), with the map back to ``text``.

    ASCII text without spaced-out letters (nearly all of it) comes back as itself at the cost
    of ``str.isascii`` and one scan of a simple regular expression.
    """
    if text.isascii() and _RUN_HINT_ASCII.search(text) is None:
        return Normalized(text, text, None, None, _open_tail(text))
    return _normalized_cached(text) if len(text) <= _CACHED_CHARS else _normalize(text)


@functools.lru_cache(maxsize=16)
def _normalized_cached(text: str) -> Normalized:
    return _normalize(text)


def _normalize(text: str) -> Normalized:
    folding = None if text.isascii() else _fold_map(text)
    if folding is None:
        if _RUN.search(text) is None:
            return Normalized(text, text, None, None, _open_tail(text))
        folded, starts, ends = text, list(range(len(text))), list(range(1, len(text) + 1))
    else:
        folded, starts, ends = folding
    tail = _open_tail(folded)
    open_from = None if tail is None else starts[tail]
    pieces: list[str] = []
    new_starts: list[int] = []
    new_ends: list[int] = []
    pos = 0
    for m in _RUN.finditer(folded):
        a, b = m.span()
        step = 1 + len(m.group(1))  # the letters sit every ``step`` characters
        pieces.append(folded[pos:a])
        pieces.append(folded[a:b:step])
        new_starts += starts[pos:a] + starts[a:b:step]
        new_ends += ends[pos:a] + ends[a:b:step]
        pos = b
    if pos:
        pieces.append(folded[pos:])
        new_starts += starts[pos:]
        new_ends += ends[pos:]
        folded, starts, ends = "".join(pieces), new_starts, new_ends
    if folded == text:
        return Normalized(text, text, None, None, open_from)
    return Normalized(text, folded, starts, ends, open_from, joined=pos > 0)
