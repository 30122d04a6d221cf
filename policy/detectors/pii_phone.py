"""Phone numbers: a candidate pattern, then ``phonenumbers`` (libphonenumber's metadata) decides.

The pattern only finds digit groups shaped like a phone number (so that a stream
knows where one may start, and ``phonenumbers`` runs on candidates only, never on
every text). A candidate is accepted when:

* it is international (``+86 138 0013 8000``, ``0044 20 7946 0958``, ``(+49) 30 1234567``)
  and a possible number of its country;
* it has the North American shape with separators (``(415) 555-2671``, ``1 (415) 555-2671``,
  ``415.555.2671x123``): the shape is the evidence, area codes are not checked;
* it is bare digits (``13800138000``, ``phone 4155552671``): a valid Chinese mobile number,
  a valid number of a hinted region written with its trunk ``0``, or, after a word such as
  "phone" or "call", a valid number of any hinted region or ten digits of the North American
  plan's shape;
* it is another grouping (``138 0013 8000``, ``020 7946 0958``, ``01 42 68 53 00``): valid in a
  hinted region, or possible there and written with its trunk ``0`` or after a phone word.

Numbers introduced as order, invoice or tracking ids, and the tail of a longer digit
sequence, are skipped.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

import phonenumbers
import regex

DEFAULT_REGIONS = ("US", "GB", "DE", "FR", "ES", "IT", "CN", "IN", "JP")

_ID_WORDS = (
    r"order|invoice|tracking|shipment|ticket|ref(?:erence)?|case|id|sku|isbn|serial|account|acct|transaction|"
    r"txn|confirmation|booking|pnr|licen[cs]e|passport|permit|policy|member(?:ship)?|customer|employee|"
    r"patient|student|badge"
)
# "order 4155552671", "license number is 0492225553", "no. 601-234-5678": an id. A bare "number is"
# is not ("her number is ...").
ID_CONTEXT = re.compile(
    r"(?:(?:" + _ID_WORDS + r")\W{0,3}(?:(?:number|no\.?|num|#)\W{0,3})?(?:(?:is|was|:)\W{0,3})?"
    r"|(?:no\.?|number|#)\W{0,4})$",
    re.IGNORECASE,
)
# An id named as such ("order", "invoice no.", "account #"): never a phone number without a phone word.
_NAMED_ID_CONTEXT = re.compile(
    r"(?:" + _ID_WORDS + r")\W{0,3}(?:(?:number|no\.?|num|#)\W{0,3})?(?:(?:is|was|:)\W{0,3})?$",
    re.IGNORECASE,
)
# Lower case, searched in lowered text (``re.IGNORECASE`` with non-ASCII words is slow).
PHONE_CONTEXT = re.compile(
    r"phone|tel\b|tel\.|telephone|call|mobile|cell|whats\s*app|sms|text me|fax|contact|reach|dial|"
    r"(?:my|your|his|her|our|their|home|work|office|emergency|direct|support|\w's) (?:phone )?number|"
    r"landline|hotline|helpline|voicemail|whatsapp|wechat|signal|telegram|viber|text(?:s|ed|ing)?\b|messages?\b|"
    r"ring\b|phoned|dialed|\bext\b|desk\b|answering|\bmob\b|\bph\b|\bph\.|"
    r"numéro|numero|teléfono|telefono|telefon|handy|portable|电话|手机|號碼|号码|联系"
)
_DIGIT_GROUP_BEFORE = re.compile(r"\d[ .\-]?$")

_B = r"(?<![\w.+\-/])"
_SEP = r"[ .\-]?"
# "x123", " ext. 123", " extension 123" after the number.
_EXT = r"(?:[ ]?(?:x|ext\.?|extension)[ ]?\d{1,6})?"
# The first-character lookahead lets the engine skip most positions at once (about 8x faster).
PHONE_RE = regex.compile(
    r"(?=[\d(+])" + _B + r"(?:"
    r"\(?\+[1-9]\d{0,2}\)?" + _SEP + r"(?:\(\d{1,4}\)" + _SEP + r")?\d{1,5}(?:" + _SEP + r"\d{2,5}){1,4}"
    r"|00[1-9]\d{0,2}[ .\-]\d{1,5}(?:" + _SEP + r"\d{2,5}){1,4}"
    r"|(?:1" + _SEP + r")?\(\d{2,5}\)" + _SEP + r"\d{3,4}" + _SEP + r"\d{3,4}"
    r"|\(0\d{1,4}\)" + _SEP + r"\d{4,8}"  # German style: (07365) 35054
    r"|(?:1[\-. ])?\d{3}[\-. ]\d{3}[\-. ]\d{4}"
    r"|1[3-9]\d[\- ]\d{4}[\- ]\d{4}"  # Chinese mobile: 138 0013 8000
    r"|0\d{1,4}[ \-/]\d{3,4}[ \-]?\d{3,4}"
    r"|0\d{1,4}[ /]\d{4,8}"  # 01756 604806 (not a hyphen: 04465-9009 is a ZIP+4 code)
    r"|0[1-9](?:[ .\-]\d{2}){4}"  # French style: 01 42 68 53 00
    r"|[6-9]\d{4}[ \-]\d{5}"  # Indian mobile: 98765 43210
    r"|\d{10,11}|0\d{8}"
    r")" + _EXT + r"(?![\w\-]|[.,]\d)"
)
PHONE_MAX_SPAN = 48
_EXT_TAIL = re.compile(r"[ ]?(?:x|ext\.?|extension)[ ]?\d{1,6}$")
# North American with separators or parentheses: "(415) 555-2671", "1-415-555-2671", "415.555.2671".
_NANP = re.compile(r"(?:\+?1[ .\-]?)?(?:\(\d{3}\)[ .\-]?|\d{3}[ .\-])\d{3}[ .\-]\d{4}")
# Ten bare digits in the North American plan's shape: area code and exchange start with 2-9 and
# are not N11. After a phone word, whether the area code is assigned is not asked (made-up and new
# ones are common); without one, ten digits are as often an id, so the number must be valid.
_NANP_BARE = re.compile(r"1?[2-9](?!11)\d\d[2-9](?!11)\d{6}")


def _parse(number: str, region: str | None) -> phonenumbers.PhoneNumber | None:
    try:
        return phonenumbers.parse(number, region)
    except phonenumbers.NumberParseException:
        return None


# A stream scans the text it holds again after every delta: remember the library's answers.
@lru_cache(maxsize=4096)
def _possible_international(number: str) -> bool:
    parsed = _parse(number, None)
    return parsed is not None and phonenumbers.is_possible_number(parsed)


@lru_cache(maxsize=4096)
def _valid_in(number: str, regions: tuple[str, ...]) -> bool:
    """Valid in one of ``regions`` *and written as that region writes it at home*.

    ``1700000000`` is a valid German mobile number to libphonenumber, but a German writes it
    ``0170 0000000``: the digits must be those of the national format (US: with or without 1).
    """
    raw = "".join(c for c in number if c.isdigit())
    for region in regions:
        parsed = _parse(number, region)
        if parsed is None or not phonenumbers.is_valid_number(parsed):
            continue
        national = phonenumbers.format_number(parsed, phonenumbers.PhoneNumberFormat.NATIONAL)
        digits = "".join(c for c in national if c.isdigit())
        if raw == digits or (parsed.country_code == 1 and raw == "1" + digits):
            return True
        # Indian mobile numbers are written without their trunk 0 ("98765 43210").
        if region == "IN" and raw == str(parsed.national_number) and raw[0] in "6789":
            return True
    return False


@lru_cache(maxsize=4096)
def _possible_in(number: str, regions: tuple[str, ...]) -> bool:
    for region in regions:
        parsed = _parse(number, region)
        if parsed is not None and phonenumbers.is_possible_number(parsed):
            return True
    return False


def phone_ok(text: str, start: int, raw: str, regions: tuple[str, ...]) -> bool:
    """Whether the candidate ``raw`` found at ``start`` of ``text`` is a phone number."""
    main = _EXT_TAIL.sub("", raw)
    digits = "".join(c for c in main if c.isdigit())
    if not 7 <= len(digits) <= 15:
        return False
    before = text[max(0, start - 32) : start]
    # The tail of a longer number ("3704 0044 0532 ..."), not a phone number; "(415)" or "+1"
    # after a digit starts a number of its own ("CA 94105 (415) 555-2671").
    if main[0] not in "(+" and _DIGIT_GROUP_BEFORE.search(before):
        return False
    if main.lstrip("(").startswith("+"):
        # "+48 601 234 567" is a phone number whatever precedes it.
        return _possible_international(main.replace("(", "").replace(")", ""))
    has_context = bool(PHONE_CONTEXT.search(before.lower()))
    # "order 601-234-5678" is an id; "(415) 555-2671" is written as a phone. A bare "number", "no."
    # or "#" before the North American shape with separators ("Number: 415-555-2671") is how a
    # phone number is labelled as often as an id: the shape decides.
    if (
        not has_context
        and main[0] != "("
        and ID_CONTEXT.search(before)
        and (not _NANP.fullmatch(main) or _NAMED_ID_CONTEXT.search(before))
    ):
        return False
    if main.startswith("00"):
        return _possible_international("+" + main[2:])
    if _NANP.fullmatch(main):
        return True
    trunk = main.lstrip("(").startswith("0")
    if main.isdigit():
        nanp = "US" in regions or "CA" in regions
        if has_context and nanp and _NANP_BARE.fullmatch(main):
            return True
        if has_context or trunk:
            return _valid_in(main, regions)
        # Without a phone word, ten bare digits are as often an id as a phone number (half of all
        # such numbers are valid in North America); eleven starting 13-19 are a Chinese mobile.
        return (
            len(main) == 11
            and main[1] in "3456789"
            and _valid_in(main, tuple(r for r in regions if r == "CN"))
        )
    if _valid_in(main, regions):
        return True
    return (trunk or has_context) and _possible_in(main, regions)


def check_regions(regions: Sequence[str]) -> list[str]:
    """The region codes ``phonenumbers`` does not know."""
    return [r for r in regions if r not in phonenumbers.SUPPORTED_REGIONS]
