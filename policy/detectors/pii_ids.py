"""National identifiers and bank numbers: candidates, then ``python-stdnum``'s checksums.

``NATIONAL_ID``: Chinese resident ids, French NIR, Korean RRN, Brazilian CPF, Spanish
DNI/NIE, Italian codice fiscale, Indian PAN, US ITIN and British National Insurance
numbers are recognised by their shape plus their check digits (the NINO has none: its
letter rules); German tax ids, Polish PESEL, Indian Aadhaar, Swedish personnummer,
NHS numbers, Dutch BSN and Canadian SIN are bare digit strings whose checksum passes
for one random number in ten or eleven, so they also need their name before them
("BSN 111222333"). ``BANK_ACCOUNT``: US routing numbers (checksum, after "routing" or
"ABA") and account numbers or sort codes introduced as such ("account number ...",
"sort code 12-34-56"): there is no checksum to tell, the words are the evidence.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import regex
from stdnum.br import cpf  # type: ignore[import-untyped]
from stdnum.ca import sin  # type: ignore[import-untyped]
from stdnum.cn import ric  # type: ignore[import-untyped]
from stdnum.de import idnr  # type: ignore[import-untyped]
from stdnum.es import dni, nie  # type: ignore[import-untyped]
from stdnum.fr import nir  # type: ignore[import-untyped]
from stdnum.gb import nhs  # type: ignore[import-untyped]
from stdnum.in_ import aadhaar, pan  # type: ignore[import-untyped]
from stdnum.it import codicefiscale  # type: ignore[import-untyped]
from stdnum.kr import rrn  # type: ignore[import-untyped]
from stdnum.nl import bsn  # type: ignore[import-untyped]
from stdnum.pl import pesel  # type: ignore[import-untyped]
from stdnum.se import personnummer  # type: ignore[import-untyped]
from stdnum.us import itin, rtn  # type: ignore[import-untyped]

NATIONAL_ID = "NATIONAL_ID"
BANK_ACCOUNT = "BANK_ACCOUNT"


@dataclass(frozen=True)
class _DigitId:
    entity: str
    length: int
    is_valid: Callable[[str], bool]
    # The candidate's exact written form that needs no context word (None: always needs one).
    shape: re.Pattern[str] | None
    # Words that introduce it, searched in the text just before the candidate.
    context: re.Pattern[str]


# Context patterns are lower case and searched in lowered text: ``re.IGNORECASE`` with non-ASCII
# words in a pattern costs some 20 microseconds per search.
def _words(pattern: str) -> re.Pattern[str]:
    return re.compile(r"(?:" + pattern + r")\W{0,3}(?:(?:is|are|no\.?|number|nr\.?|:|#)\W{0,3}){0,2}$")


_DIGIT_IDS = (
    _DigitId(
        NATIONAL_ID, 18, ric.is_valid, re.compile(r"\d{17}[\dXx]"), _words(r"身份证(?:号码?)?|resident id")
    ),
    _DigitId(
        NATIONAL_ID,
        15,
        nir.is_valid,
        re.compile(r"[12](?: ?\d\d){3} ?\d{3} ?\d{3} ?\d\d"),
        _words(r"nir|insee"),
    ),
    _DigitId(NATIONAL_ID, 13, rrn.is_valid, re.compile(r"\d{6}-\d{7}"), _words(r"rrn|주민등록번호")),
    _DigitId(NATIONAL_ID, 11, cpf.is_valid, re.compile(r"\d{3}\.\d{3}\.\d{3}-\d\d"), _words(r"cpf")),
    _DigitId(
        NATIONAL_ID, 11, idnr.is_valid, None, _words(r"steuer-?id|idnr|steueridentifikationsnummer|tax id")
    ),
    _DigitId(NATIONAL_ID, 11, pesel.is_valid, None, _words(r"pesel")),
    _DigitId(NATIONAL_ID, 12, aadhaar.is_valid, None, _words(r"aadhaa?r|uidai|आधार")),
    _DigitId(NATIONAL_ID, 10, personnummer.is_valid, None, _words(r"personnummer|personal identity number")),
    _DigitId(NATIONAL_ID, 12, personnummer.is_valid, None, _words(r"personnummer|personal identity number")),
    _DigitId(NATIONAL_ID, 10, nhs.is_valid, None, _words(r"nhs")),
    _DigitId(NATIONAL_ID, 9, itin.is_valid, re.compile(r"9\d\d-\d\d-\d{4}"), _words(r"itin")),
    _DigitId(NATIONAL_ID, 9, bsn.is_valid, None, _words(r"bsn|burgerservicenummer")),
    _DigitId(NATIONAL_ID, 9, sin.is_valid, None, _words(r"\bsin|social insurance|nas")),
    _DigitId(BANK_ACCOUNT, 9, rtn.is_valid, None, _words(r"routing|\baba|\brtn|transit")),
)
# "account number 12345678", "acct #", "sort code": no checksum, the words say what the number is.
_ACCOUNT_CONTEXT = re.compile(
    r"(?:\b(?:bank|checking|savings|current|deposit)\s+account|\baccount\s*(?:number|no\.?|num\.?|nr\.?|#)|"
    r"\bacct\.?|\ba/c|\bsort\s*code|kontonummer|numéro de compte|número de cuenta|conto corrente)"
    r"\W{0,3}(?:(?:is|number|no\.?|:|#)\W{0,3}){0,2}$"
)

# Digit groups, optionally ending in X (Chinese ids); the checks try every group prefix.
ID_DIGITS_RE = regex.compile(r"(?<![\w\-.+/])\d(?:[ \-.]?\d){5,17}[Xx]?(?![\w\-]|[.,]\d)")
ID_DIGITS_MAX_SPAN = 40
_NINO_PREFIX_BAD = {"BG", "GB", "NK", "KN", "TN", "NT", "ZZ"}
# The first-character lookahead lets the engine skip most positions at once.
ID_ALNUM_RE = regex.compile(
    r"(?=[A-Z\d])(?<![\w\-])(?:"
    r"(?P<cf>[A-Z]{6}\d\d[A-EHLMPR-T]\d\d[A-Z]\d{3}[A-Z])"
    r"|(?P<dni>\d{8}-?[A-Z])"
    r"|(?P<nie>[XYZ]-?\d{7}-?[A-Z])"
    r"|(?P<pan>[A-Z]{5}\d{4}[A-Z])"
    r"|(?P<nino>[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z] ?\d\d ?\d\d ?\d\d ?[A-D])"
    r")(?![\w\-])"
)
ID_ALNUM_MAX_SPAN = 16


_ALNUM_CHECKS: dict[str, Callable[[str], bool]] = {
    "cf": codicefiscale.is_valid,
    "dni": dni.is_valid,
    "nie": nie.is_valid,
    "pan": pan.is_valid,
    "nino": lambda v: v.replace(" ", "")[:2] not in _NINO_PREFIX_BAD,
}


def _safe(check: Callable[[str], bool], value: str) -> bool:
    try:
        return bool(check(value))
    except Exception:  # a validator that trips on odd input has not validated it
        return False


# Every context word of the ids and accounts above: when none is near, only the shaped ids can match.
_ANY_CONTEXT = re.compile(
    r"身份证|resident|nir|insee|rrn|주민|cpf|steuer|idnr|tax|pesel|aadhaa?r|uidai|आधार|personnummer|"
    r"identity|nhs|itin|bsn|burgerservice|sin\b|insurance|nas\b|routing|aba\b|rtn|transit|account|acct|a/c|"
    r"sort\s*code|konto|compte|cuenta|conto"
)
_SHAPED = tuple(spec for spec in _DIGIT_IDS if spec.shape is not None)


def check_digits(text: str, start: int, raw: str, entity: str) -> tuple[int, str] | None:
    """(end offset in ``raw``, value) of the longest group prefix that is an ``entity``, or None."""
    before = text[max(0, start - 40) : start].lower()
    near = _ANY_CONTEXT.search(before) is not None
    specs = [s for s in (_DIGIT_IDS if near else _SHAPED) if s.entity == entity]
    if not specs and not (near and entity == BANK_ACCOUNT):
        return None
    lengths = {s.length for s in specs}
    # Context words are looked up once per candidate, and only for lengths that need them.
    context: dict[re.Pattern[str], bool] = {}

    def introduced_by(words: re.Pattern[str]) -> bool:
        if words not in context:
            context[words] = words.search(before) is not None
        return context[words]

    # (offset in raw, characters of the id before it) at every separator, then the whole candidate.
    cuts: list[tuple[int, int]] = []
    n = 0
    for i, c in enumerate(raw):
        if c in " -.":
            cuts.append((i, n))
        else:
            n += 1
    cuts.append((len(raw), n))
    compact = "".join(c for c in raw if c not in " -.")
    for cut, n in reversed(cuts):
        value = compact[:n]
        if n in lengths:
            part = raw[:cut]
            for spec in specs:
                if len(value) != spec.length:
                    continue
                shaped = spec.shape is not None and spec.shape.fullmatch(part)
                if not shaped and not introduced_by(spec.context):
                    continue
                if _safe(spec.is_valid, value):
                    return cut, value
        if (
            near
            and entity == BANK_ACCOUNT
            and 6 <= n <= 17
            and value.isdigit()
            and introduced_by(_ACCOUNT_CONTEXT)
        ):
            return cut, value
    return None


def check_alnum(m: regex.Match[str]) -> bool:
    kind = m.lastgroup
    return kind is not None and _safe(_ALNUM_CHECKS[kind], m.group())
