"""PII recognizers: a candidate pattern per entity, then the check that makes it real.

Presidio is not used: offline it only offers pattern recognizers, and these are
the same checks without the spaCy dependency (Presidio's NLP recognizers need a spaCy
model that cannot be installed offline). Each recognizer finds candidates with a
regular expression (which also tells a stream where a match may start) and keeps only
those that pass a validation: Luhn and issuer prefixes for cards, ISO 13616 mod-97 and
the country length for IBANs, the SSA's valid ranges for US SSNs, ``ipaddress`` for
IPs (not after "version", "build", "v"...), token prefixes plus Shannon entropy for
secrets, ``phonenumbers`` with the rule's region hints for phone numbers
(:mod:`policy.detectors.pii_phone`), ``python-stdnum``'s checksums for national ids
and bank numbers (:mod:`policy.detectors.pii_ids`). Numbers introduced as order,
invoice or tracking ids are skipped unless a word such as "card" or "phone" says otherwise.
"""

from __future__ import annotations

import bisect
import ipaddress
import math
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import regex

from policy.detectors import pii_ids, pii_phone
from policy.detectors.base import (
    DetectorConfigError,
    Match,
    ScanContext,
    option_str_list,
    pending_start_of,
    reject_unknown,
)
from policy.detectors.pii_phone import DEFAULT_REGIONS, ID_CONTEXT, PHONE_MAX_SPAN, PHONE_RE

ENTITIES = (
    "SECRET", "EMAIL", "IBAN", "CREDIT_CARD", "US_SSN", "NATIONAL_ID", "BANK_ACCOUNT", "IP_ADDRESS", "PHONE",
)  # fmt: skip
# When two candidates overlap, the entity earlier in ENTITIES wins.
_PRIORITY = {name: i for i, name in enumerate(ENTITIES)}

_ID_CONTEXT = ID_CONTEXT
_CARD_CONTEXT = re.compile(
    r"card|visa|master\s*card|amex|american express|discover|credit|debit|cc\b|pan\b", re.IGNORECASE
)
_SSN_CONTEXT = re.compile(r"ssn|social security|soc\.? sec", re.IGNORECASE)
# A dotted quad after one of these words (in the same clause) is a version, not an address ...
_VERSION_WORDS = re.compile(
    r"\b(?:v|versions?|ver|rel|release[sd]?|build|firmware|fw|update[sd]?|upgraded?|upgrading|downgraded?|"
    r"patch(?:ed)?|hotfix|sdk|api|rev|revision|kernel|driver|package|pkg|library|lib|plugin|app|client|"
    r"python|node|java|jdk|chrome|firefox|windows|ios|android|macos|agent|runtime|engine|tag|bump(?:ed)?)\b"
    r"|[A-Za-z]/$|(?:==|>=|<=|~=|!=|\^)\s*$",
    re.IGNORECASE,
)
# ... unless an address word is nearer.
_IP_WORDS = re.compile(
    r"\b(?:ip|ips|ipv4|ip address|host|hostname|server|address|addr|connect(?:ed|ing|s)?|ping|"
    r"subnet|gateway|dns|proxy|router|firewall|remote|source|destination|src|dst|listen(?:s|ing)?|bind|"
    r"peer|node ip)\b"
    r"|://$",
    re.IGNORECASE,
)
_CLAUSE_END = re.compile(r"[.;!?\n]\s")


def _before(text: str, start: int, width: int = 32) -> str:
    return text[max(0, start - width) : start]


def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def card_prefix_ok(digits: str) -> bool:
    """Issuer ranges of the major networks.

    Visa, Mastercard, Amex, Discover, JCB (all of 35xx), Diners, UnionPay, Maestro, Mir.
    """
    n = len(digits)
    two, four = int(digits[:2]), int(digits[:4])
    if digits[0] == "4":
        return n in (13, 16, 19)
    if 51 <= two <= 55 or 2221 <= four <= 2720:
        return n == 16
    if two in (34, 37):
        return n == 15
    if 2200 <= four <= 2204:
        return n == 16
    if digits[0] == "6" or two in (50, 56, 57, 58):
        return 12 <= n <= 19
    if two in (30, 36, 38, 39) or two == 35:
        return 14 <= n <= 19
    if four in (1800, 2131):  # JCB's older 15-digit ranges
        return n == 15
    return False


IBAN_LENGTHS = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22, "BR": 29,
    "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DK": 18, "DO": 28, "EE": 20, "EG": 29,
    "ES": 24, "FI": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28,
    "HR": 21, "HU": 28, "IE": 22, "IL": 23, "IQ": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20,
    "LB": 28, "LC": 32, "LI": 21, "LT": 20, "LU": 20, "LV": 21, "MC": 27, "MD": 24, "ME": 22, "MK": 19,
    "MR": 27, "MT": 31, "MU": 30, "NL": 18, "NO": 15, "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29,
    "RO": 24, "RS": 22, "SA": 24, "SC": 31, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "ST": 25, "SV": 28,
    "TL": 23, "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20,
}  # fmt: skip


def iban_ok(compact: str) -> bool:
    if IBAN_LENGTHS.get(compact[:2]) != len(compact):
        return False
    rearranged = compact[4:] + compact[:4]
    number = "".join(str(int(ch, 36)) for ch in rearranged)
    return int(number) % 97 == 1


def ssn_ok(area: str, group: str, serial: str) -> bool:
    a = int(area)
    if a in {0, 666} or a >= 900 or group == "00" or serial == "0000":
        return False
    whole = area + group + serial
    # Publicly used numbers the SSA invalidated, and repeated digits.
    return whole not in {"078051120", "219099999"} and len(set(whole)) > 1


def shannon_entropy(value: str) -> float:
    counts = Counter(value)
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


_PLACEHOLDER = re.compile(
    r"^(?:x+|\*+|\.+|<[^>]*>|\$\{[^}]*\}|\{\{[^}]*\}\}|your[_-]?\w*|changeme|password|secret|token|"
    r"example\w*|dummy\w*|placeholder|redacted|null|none|test|xxx\w*)$",
    re.IGNORECASE,
)


def _not_placeholder(body: str) -> bool:
    if _PLACEHOLDER.match(body):
        return False
    # "sk-XXXXXXXXXXXXXXXX", "AKIA0000000000000000": one repeated character is a placeholder.
    return len(set(body.replace("-", "").replace("_", ""))) > 3


@dataclass(frozen=True)
class _Recognizer:
    entity: str
    pattern: regex.Pattern[str]
    # Returns (start, end, value) of the accepted part of a candidate, or None.
    check: Callable[[str, regex.Match[str]], tuple[int, int, str] | None]
    max_span: int
    # A cheap test every candidate passes; the pattern is skipped on texts that fail it.
    hint: Callable[[str], bool] | None = None


def _whole(m: regex.Match[str]) -> tuple[int, int, str]:
    return m.start(), m.end(), m.group()


def _check_email(text: str, m: regex.Match[str]) -> tuple[int, int, str] | None:
    return _whole(m)


def _check_card(text: str, m: regex.Match[str]) -> tuple[int, int, str] | None:
    raw = m.group()
    separators = {c for c in raw if not c.isdigit()}
    if len(separators) > 1:
        return None
    groups = raw.split(separators.pop()) if separators else [raw]
    # A card followed by another number ("4111 1111 1111 1111 2027"): try shorter group prefixes.
    before = _before(text, m.start())
    card_context = bool(_CARD_CONTEXT.search(before))
    # 12 and 13 digits (short Maestro, old Visa numbers) are also EAN-13 product codes and other
    # ids: only after a card word.
    shortest = 12 if card_context else 14
    for k in range(len(groups), 0, -1):
        digits = "".join(groups[:k])
        if shortest <= len(digits) <= 19 and luhn_ok(digits) and card_prefix_ok(digits):
            break
    else:
        return None
    if _ID_CONTEXT.search(before) and not card_context:
        return None
    end = m.start() + len(groups[0]) + sum(len(g) + 1 for g in groups[1:k])
    return m.start(), end, digits


def _check_iban(text: str, m: regex.Match[str]) -> tuple[int, int, str] | None:
    raw = m.group()
    expected = IBAN_LENGTHS.get(raw[:2])
    if expected is None:
        return None
    taken = 0
    end = m.start()
    for i, ch in enumerate(raw):
        if ch != " ":
            taken += 1
        if taken == expected:
            end = m.start() + i + 1
            break
    else:
        return None
    # The IBAN must end at a group boundary, not inside a word.
    if end < len(text) and text[end].isalnum():
        return None
    compact = text[m.start() : end].replace(" ", "")
    if not iban_ok(compact):
        return None
    return m.start(), end, compact


def _check_ssn(text: str, m: regex.Match[str]) -> tuple[int, int, str] | None:
    digits = "".join(c for c in m.group() if c.isdigit())
    if len(digits) != 9 or not ssn_ok(digits[:3], digits[3:5], digits[5:]):
        return None
    if m.group().isdigit() and not _SSN_CONTEXT.search(_before(text, m.start(), 48)):
        return None
    return m.start(), m.end(), digits


def _check_ip(text: str, m: regex.Match[str]) -> tuple[int, int, str] | None:
    raw = m.group()
    try:
        address = ipaddress.ip_address(raw)
    except ValueError:
        return None
    if address.version == 4:
        if _is_version(text, m.start()):
            return None
    elif sum(1 for part in raw.split(":") if part) < 2 or sum(c.isalnum() for c in raw) < 4:
        return None  # "a::b" in C++ code is a valid IPv6 address, but not one anybody means
    return _whole(m)


def _is_version(text: str, start: int) -> bool:
    """A dotted quad written as a version: "version 10.2.0.1", "Chrome/1.2.3.4", "pkg==1.2.3.4".

    Only the text before it decides: a stream has released the address before what follows arrives.
    """
    before = _before(text, start, 40)
    clause = _CLAUSE_END.split(before)[-1]
    version = [w.end() for w in _VERSION_WORDS.finditer(clause)]
    if not version:
        return False
    address = [w.end() for w in _IP_WORDS.finditer(clause)]
    return not address or max(version) > max(address)


def _phone_check(regions: tuple[str, ...]) -> Callable[[str, regex.Match[str]], tuple[int, int, str] | None]:
    def check(text: str, m: regex.Match[str]) -> tuple[int, int, str] | None:
        if not pii_phone.phone_ok(text, m.start(), m.group(), regions):
            return None
        return _whole(m)

    return check


def _id_digits_check(entity: str) -> Callable[[str, regex.Match[str]], tuple[int, int, str] | None]:
    def check(text: str, m: regex.Match[str]) -> tuple[int, int, str] | None:
        found = pii_ids.check_digits(text, m.start(), m.group(), entity)
        return None if found is None else (m.start(), m.start() + found[0], found[1])

    return check


def _check_id_alnum(text: str, m: regex.Match[str]) -> tuple[int, int, str] | None:
    return _whole(m) if pii_ids.check_alnum(m) else None


def _check_aws_secret(text: str, m: regex.Match[str]) -> tuple[int, int, str] | None:
    """A bare AWS secret access key: 40 base64 characters after its key id or a "secret" word."""
    body = m.group()
    if not (
        any(c.isupper() for c in body) and any(c.islower() for c in body) and any(c.isdigit() for c in body)
    ):
        return None  # a hex digest (a git commit) or a word, not a key
    if shannon_entropy(body) < 4.0:
        return None
    if not _AWS_SECRET_CONTEXT.search(_before(text, m.start(), 60)):
        return None
    return _whole(m)


def _check_secret_token(text: str, m: regex.Match[str]) -> tuple[int, int, str] | None:
    body = m.group("body")
    if not _not_placeholder(body) or shannon_entropy(body) < 3.0:
        return None
    return _whole(m)


def _check_secret_block(text: str, m: regex.Match[str]) -> tuple[int, int, str] | None:
    return _whole(m)


def _check_secret_assign(text: str, m: regex.Match[str]) -> tuple[int, int, str] | None:
    body = m.group("body")
    if not _not_placeholder(body):
        return None
    key = m.group("key").lower()
    if "pass" in key or "pwd" in key:
        if len(body) < 6:
            return None
    elif len(body) < 12 or shannon_entropy(body) < 3.0:
        return None
    return m.start("body"), m.end("body"), body


_B = r"(?<![\w.+\-/])"

EMAIL_RE = regex.compile(
    r"(?<![\w.+\-%])[A-Za-z0-9][A-Za-z0-9._%+\-]{0,63}@(?:[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?\.)+"
    r"[A-Za-z]{2,24}(?![\w\-]|\.[A-Za-z0-9])"
)
CARD_RE = regex.compile(r"(?<![\w\-.])\d(?:[ \-]?\d){11,18}(?![\w\-]|\.\d)")
IBAN_RE = regex.compile(r"(?<![\w])[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,32}")
SSN_RE = regex.compile(r"(?<![\w\-.])(?:\d{3}-\d{2}-\d{4}|\d{3} \d{2} \d{4}|\d{9})(?![\w\-]|\.\d)")
IPV4_RE = regex.compile(
    r"(?<![\w.])(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?!\.?\d|\w)"
)
IPV6_RE = regex.compile(
    r"(?<![\w:.])(?=[0-9A-Fa-f:.]*::?[0-9A-Fa-f]*:)[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}"
    r"(?::(?:\d{1,3}\.){3}\d{1,3})?(?![\w:])"
)
# Provider tokens: case-sensitive prefixes, as the providers issue them.
SECRET_TOKEN_RE = regex.compile(
    r"(?<![\w\-])(?:"
    r"sk-(?:proj-|ant-(?:api\d\d-)?|live-)?(?P<body>[A-Za-z0-9_\-]{20,})"
    r"|(?:sk|pk|rk)_(?:live|test)_(?P<body>[A-Za-z0-9]{16,})"
    r"|gh[pousr]_(?P<body>[A-Za-z0-9]{30,})"
    r"|github_pat_(?P<body>[A-Za-z0-9_]{30,})"
    r"|glpat-(?P<body>[A-Za-z0-9_\-]{20,})"
    r"|xox[abposr]-(?P<body>[A-Za-z0-9\-]{10,})"
    r"|(?:AKIA|ASIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|APKA|ABIA|ACCA)(?P<body>[0-9A-Z]{16})"
    r"|AIza(?P<body>[0-9A-Za-z_\-]{35})"
    r"|ya29\.(?P<body>[0-9A-Za-z_\-]{20,})"
    r"|GOCSPX-(?P<body>[0-9A-Za-z_\-]{20,})"
    r"|hf_(?P<body>[A-Za-z0-9]{30,})"
    r"|npm_(?P<body>[A-Za-z0-9]{30,})"
    r"|pypi-(?P<body>AgE[A-Za-z0-9_\-]{50,})"
    r"|(?:sk|rk|pk)_(?:prod|dev)_(?P<body>[A-Za-z0-9]{24,})"
    r"|whsec_(?P<body>[A-Za-z0-9]{24,})"
    r"|do[opr]_v1_(?P<body>[a-f0-9]{64})"
    r"|shp(?:at|ss|ca|pa)_(?P<body>[a-fA-F0-9]{32})"
    r"|dapi(?P<body>[a-f0-9]{32})"
    r"|hv[sb]\.(?P<body>[A-Za-z0-9_\-]{24,})"
    r"|lin_api_(?P<body>[A-Za-z0-9]{40})"
    r"|SK(?P<body>[0-9a-f]{32})"
    r"|[A-Za-z0-9_\-]{3}\dQ~(?P<body>[A-Za-z0-9_~.\-]{31,34})"
    r"|\d{8,10}:(?P<body>AA[0-9A-Za-z_\-]{33})"
    r"|hooks\.slack\.com/services/(?P<body>T[A-Z0-9]{8,}/B[A-Z0-9]{8,}/[A-Za-z0-9]{20,})"
    r"|SG\.(?P<body>[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,})"
    r"|eyJ[A-Za-z0-9_\-]{8,}\.(?P<body>eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,})"
    r")(?![\w\-])"
)
# The body may not contain the footer (rather than a lazy ``[\s\S]*?``): once the footer has
# arrived no more text can change the match, so a stream releases what follows it at once.
_PEM_WORDS = r"(?:[A-Z]{1,16} ){0,4}"
_PEM_FOOTER = r"-----END " + _PEM_WORDS + r"PRIVATE KEY-----"
PEM_MAX_BODY = 8192
SECRET_BLOCK_RE = regex.compile(
    r"-----BEGIN " + _PEM_WORDS + r"PRIVATE KEY-----"
    r"(?P<body>(?:(?!" + _PEM_FOOTER + r")[\s\S]){16," + str(PEM_MAX_BODY) + r"})" + _PEM_FOOTER
)
# Header and footer at most 11 + 4 * 17 + 16 characters each, plus the body.
PEM_MAX_SPAN = 2 * (11 + 4 * 17 + 16) + PEM_MAX_BODY
# "password: ...", "aws_secret_access_key=...": a key name is any identifier containing one of these words.
SECRET_ASSIGN_RE = regex.compile(
    r"(?P<key>(?<![A-Za-z0-9_\-])(?:[A-Za-z0-9]{1,32}[_\-]){0,4}?(?:api[_\-\s]?key|apikey|secret|access[_\-]?key|"
    r"access[_\-]?token|auth[_\-]?token|private[_\-]?key|token|password|passwd|pwd|passphrase|"
    r"account[_\-]?key|shared[_\-]?access[_\-]?key|signing[_\-]?key|master[_\-]?key)"
    r"(?:[_\-][A-Za-z0-9]{1,32}){0,4})"
    r"[\"']?\s*(?::|=|=>|\bis\b)\s*[\"']?(?P<body>[^\s\"',;]{6,200})",
    regex.IGNORECASE,
)

# Substring tests that every candidate passes: far cheaper than running the patterns on every text.
_TOKEN_HINTS = (
    "sk-", "sk_", "pk_", "rk_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "xox",
    "AKIA", "ASIA", "AGPA", "AIDA", "AROA", "AIPA", "ANPA", "ANVA", "APKA", "ABIA", "ACCA", "AIza", "hf_",
    "npm_", "SG.", "eyJ", "ya29.", "GOCSPX-", "pypi-", "whsec_", "_v1_", "shp", "dapi", "hvs.", "hvb.",
    "lin_api_", "SK", "Q~", ":AA", "hooks.slack.com",
)  # fmt: skip
_ASSIGN_HINTS = ("key", "secret", "token", "pass", "pwd")


# A bare AWS secret access key: 40 characters of base64 without padding.
AWS_SECRET_RE = regex.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
# Its key id, or "secret" / "aws" in any case ("aws_secret_access_key", "SecretAccessKey").
_AWS_SECRET_CONTEXT = re.compile(r"(?:AKIA|ASIA)[0-9A-Z]{16}|(?i:secret|\baws)")


def _aws_hint(text: str) -> bool:
    lower = text.lower()
    return "secret" in lower or "aws" in lower or "AKIA" in text or "ASIA" in text


# One pass of the standard library's engine over the text: faster than a substring test per hint
# (2.5 vs 3.4 us on 100 characters, 24 vs 26 on 1 KB; the `regex` module's takes 11 and 180).
_TOKEN_HINT_RE = re.compile("|".join(map(re.escape, _TOKEN_HINTS)))


def _token_hint(text: str) -> bool:
    return _TOKEN_HINT_RE.search(text) is not None


def _block_hint(text: str) -> bool:
    return "PRIVATE KEY" in text


def _assign_hint(text: str) -> bool:
    lower = text.lower()
    return any(h in lower for h in _ASSIGN_HINTS)


_RECOGNIZERS: dict[str, tuple[_Recognizer, ...]] = {
    "EMAIL": (_Recognizer("EMAIL", EMAIL_RE, _check_email, 254),),
    "CREDIT_CARD": (_Recognizer("CREDIT_CARD", CARD_RE, _check_card, 23),),
    "IBAN": (_Recognizer("IBAN", IBAN_RE, _check_iban, 42),),
    "US_SSN": (_Recognizer("US_SSN", SSN_RE, _check_ssn, 11),),
    "IP_ADDRESS": (
        _Recognizer("IP_ADDRESS", IPV4_RE, _check_ip, 15),
        _Recognizer("IP_ADDRESS", IPV6_RE, _check_ip, 45),
    ),
    "SECRET": (
        _Recognizer("SECRET", SECRET_TOKEN_RE, _check_secret_token, 256, _token_hint),
        _Recognizer("SECRET", SECRET_BLOCK_RE, _check_secret_block, PEM_MAX_SPAN, _block_hint),
        _Recognizer("SECRET", SECRET_ASSIGN_RE, _check_secret_assign, 512, _assign_hint),
        _Recognizer("SECRET", AWS_SECRET_RE, _check_aws_secret, 40, _aws_hint),
    ),
    # One digit candidate for every digit id: its check tells which id (or bank number) it is.
    "NATIONAL_ID": (
        _Recognizer(
            "NATIONAL_ID", pii_ids.ID_DIGITS_RE, _id_digits_check("NATIONAL_ID"), pii_ids.ID_DIGITS_MAX_SPAN
        ),
        _Recognizer("NATIONAL_ID", pii_ids.ID_ALNUM_RE, _check_id_alnum, pii_ids.ID_ALNUM_MAX_SPAN),
    ),
    "BANK_ACCOUNT": (
        _Recognizer(
            "BANK_ACCOUNT", pii_ids.ID_DIGITS_RE, _id_digits_check("BANK_ACCOUNT"), pii_ids.ID_DIGITS_MAX_SPAN
        ),
    ),
}


def resolve_overlaps(matches: list[Match]) -> list[Match]:
    """Keeps the strongest of overlapping matches (entity priority, then length), sorted by start."""
    ordered = sorted(matches, key=lambda m: (_PRIORITY.get(m.entity_type, 99), -(m.end - m.start), m.start))
    kept: list[Match] = []
    starts: list[int] = []  # starts of the kept matches, sorted; kept spans never overlap
    for m in ordered:
        i = bisect.bisect_left(starts, m.start)
        if (i < len(kept) and kept[i].start < m.end) or (i > 0 and kept[i - 1].end > m.start):
            continue
        starts.insert(i, m.start)
        kept.insert(i, m)
    return kept


class PiiDetector:
    """Finds the configured PII entity types (all of :data:`ENTITIES` by default).

    ``regions``: the ISO 3166 regions whose national phone formats count (``phonenumbers``);
    international numbers (``+...``, ``00...``) count whatever the regions.
    """

    def __init__(self, options: Mapping[str, Any]) -> None:
        reject_unknown(options, {"entities", "regions"})
        entities = option_str_list(options, "entities") or list(ENTITIES)
        unknown = [e for e in entities if e not in ENTITIES]
        if unknown:
            raise DetectorConfigError(
                f"unknown PII entity {unknown[0]!r} (known: {', '.join(ENTITIES)})", "entities"
            )
        regions = [r.upper() for r in option_str_list(options, "regions")] or list(DEFAULT_REGIONS)
        bad = pii_phone.check_regions(regions)
        if bad:
            raise DetectorConfigError(
                f"unknown phone region {bad[0]!r} (ISO 3166 codes like US, GB)", "regions"
            )
        self.entities = tuple(e for e in ENTITIES if e in entities)
        self.regions = tuple(regions)
        recognizers = {
            **_RECOGNIZERS,
            "PHONE": (_Recognizer("PHONE", PHONE_RE, _phone_check(self.regions), PHONE_MAX_SPAN),),
        }
        self._recognizers = [r for e in self.entities for r in recognizers[e]]
        # Recognizers may share a candidate pattern: a stream needs to run each once.
        self._patterns = list(dict.fromkeys(r.pattern for r in self._recognizers))
        # A private key block is the longest (PEM_MAX_SPAN): a ruleset must let a stream hold it back.
        self._max_span = max(r.max_span for r in self._recognizers)
        self._starts = _StartIndex(self._patterns)

    @property
    def max_span(self) -> int:
        return self._max_span

    def scan(self, text: str, ctx: ScanContext, start: int = 0) -> list[Match]:
        if not text:
            return []
        found: list[Match] = []
        # NATIONAL_ID and BANK_ACCOUNT share their digit candidates: find them once.
        candidates: dict[regex.Pattern[str], list[regex.Match[str]]] = {}
        # The patterns a match could begin with a character of the text from ``start`` for.
        active: tuple[regex.Pattern[str], ...] | None = None
        for rec in self._recognizers:
            matches = candidates.get(rec.pattern)
            if matches is None:
                if active is None:
                    active = self._starts.active(text, start)
                if rec.pattern not in active:
                    candidates[rec.pattern] = []
                    continue
            # The whole text: a hint may be a context word in the text before ``start``.
            if rec.hint is not None and not rec.hint(text):
                continue
            if matches is None:
                matches = candidates[rec.pattern] = list(rec.pattern.finditer(text, pos=start))
            for m in matches:
                accepted = rec.check(text, m)
                if accepted is not None:
                    found.append(Match(accepted[0], accepted[1], rec.entity, 1.0, accepted[2]))
        return resolve_overlaps(found)

    def pending_start(self, text: str, start: int = 0) -> int | None:
        # A pattern none of whose matches can begin with a character of the text from ``start``
        # can only be "pending" at the very end of the text, which holds nothing back.
        return pending_start_of(self._starts.active(text, start), text, start)


class _StartIndex:
    """Which patterns may have a match (or the start of one) beginning in a text's tail, told
    from the tail's characters: most streamed text holds no digit, and so on. A pattern whose
    match needs a look-behind that sees something, and any tail with a non-ASCII character,
    keep every pattern in (checked against the full scan in tests/unit/policy)."""

    def __init__(self, patterns: list[regex.Pattern[str]]) -> None:
        self.patterns = patterns
        self.everything = tuple(patterns)
        always = 0
        self.by_char = [0] * 128
        for bit, pattern in enumerate(patterns):
            if "(?<=" in pattern.pattern:
                always |= 1 << bit
                continue
            for c in range(128):
                if pattern.match(chr(c), partial=True) is not None:
                    self.by_char[c] |= 1 << bit
        self.always = always
        self._by_mask: dict[int, tuple[regex.Pattern[str], ...]] = {}

    def active(self, text: str, start: int) -> tuple[regex.Pattern[str], ...]:
        """The patterns that may begin a match in ``text[start:]``, in the detector's order."""
        tail = text[start:]
        if not tail.isascii():
            return self.everything
        mask = self.always
        by_char = self.by_char
        for c in set(tail):
            mask |= by_char[ord(c)]
        found = self._by_mask.get(mask)
        if found is None:
            found = self._by_mask[mask] = tuple(p for bit, p in enumerate(self.patterns) if mask >> bit & 1)
        return found
