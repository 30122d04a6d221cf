"""The PII recognizers built on phonenumbers and python-stdnum, and the false-positive classes."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policy.config import DEFAULT_RULESET
from policy.detectors.base import MESSAGE, DetectorConfigError
from policy.detectors.pii import PiiDetector
from policy.engine import Segment, check_segments
from policy.rules import Scope, parse_ruleset
from policy.stream import StreamModerator

DETECTOR = PiiDetector({})
RULESET = parse_ruleset(DEFAULT_RULESET.read_bytes(), "default").for_tenant("t")
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzXAMPLEKEY"


def spans(text: str, detector: PiiDetector = DETECTOR) -> list[tuple[str, str]]:
    return [(m.entity_type, text[m.start : m.end]) for m in detector.scan(text, MESSAGE)]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("My cell is 138 0013 8000", "138 0013 8000"),
        ("手机\uff1a13800138000", "13800138000"),
        ("+86 138-0013-8000 works", "+86 138-0013-8000"),
        ("(+86) 138 0013 8000", "(+86) 138 0013 8000"),
        ("电话 010-6552-9988", "010-6552-9988"),
        ("call 1 (415) 555-2671 tomorrow", "1 (415) 555-2671"),
        ("Reach me at 1-415-555-2671", "1-415-555-2671"),
        ("Desk: (758)482-4606x415", "(758)482-4606x415"),
        ("office 415.555.2671 ext. 12", "415.555.2671 ext. 12"),
        ("stop texting 4155552671", "4155552671"),
        ("Desk: 2924563458", "2924563458"),  # after a phone word, the North American shape is enough
        ("my number is 07700 900461", "07700 900461"),
        ("Tel. 030 1234567", "030 1234567"),
        ("sms 98765 43210", "98765 43210"),  # Indian mobile, written without its trunk 0
    ],
)
def test_phone_numbers(text: str, value: str) -> None:
    assert ("PHONE", value) in spans(text)


@pytest.mark.parametrize(
    "text",
    [
        "call 1700000000",  # valid in Germany only as 0170 0000000: not how it is written here
        "call me at 1183550434",  # a unix time: no valid number in any region
        "My driver's license number is 0492225553",
        "order number 4155552671",
        "ticket 2024-0001-5678",
        "id 13800138000x",  # part of a word
        "see 4155552671 for details",  # ten bare digits without a phone word: maybe an id
    ],
)
def test_phone_look_alikes(text: str) -> None:
    assert [e for e, _ in spans(text) if e == "PHONE"] == []


def test_regions_limit_national_formats_but_not_international_ones() -> None:
    us_only = PiiDetector({"regions": ["US"]})
    assert spans("see 138 0013 8000", us_only) == []
    assert spans("see 138 0013 8000") == [("PHONE", "138 0013 8000")]
    assert spans("call +86 138 0013 8000", us_only) == [("PHONE", "+86 138 0013 8000")]
    assert spans("call (415) 555-2671", us_only) == [("PHONE", "(415) 555-2671")]
    assert PiiDetector({"regions": ["cn"]}).regions == ("CN",)


@pytest.mark.parametrize("options", [{"regions": ["XX"]}, {"regions": "US, GB"}, {"region": ["US"]}])
def test_bad_phone_options_are_refused(options: dict[str, object]) -> None:
    with pytest.raises(DetectorConfigError):
        PiiDetector(options)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("resident id 11010519491231002X", "11010519491231002X"),
        ("身份证号码 110105194912310021", None),  # wrong check digit
        ("NIR 2 95 10 99 126 111 93", "2 95 10 99 126 111 93"),
        ("RRN 971013-9019902", "971013-9019902"),
        ("CPF 390.533.447-05", "390.533.447-05"),
        ("CPF 390.533.447-06", None),
        ("DNI 54362315K", "54362315K"),
        ("DNI 54362315A", None),
        ("NIE X2482300W", "X2482300W"),
        ("codice fiscale RCCMNL83S18D969H", "RCCMNL83S18D969H"),
        ("PAN ACUPA7085R", "ACUPA7085R"),
        ("NINO AB 12 34 56 C", "AB 12 34 56 C"),
        ("ITIN 912-90-3456", "912-90-3456"),
        ("Steuer-ID: 36 574 261 809", "36 574 261 809"),
        ("PESEL 44051401359", "44051401359"),
        ("my BSN is 111222333", "111222333"),
        ("Aadhaar 2341 2341 2346", "2341 2341 2346"),
        ("NHS number 943 476 5870", "943 476 5870"),
        ("personnummer 880320-0016", "880320-0016"),
        ("SIN 130 692 544", "130 692 544"),
        ("the value 111222333 passes the BSN check", None),  # no name before it: bare digits
        ("the value 44051401359 passes the PESEL check", None),
    ],
)
def test_national_ids(text: str, value: str | None) -> None:
    found = [v for e, v in spans(text) if e == "NATIONAL_ID"]
    assert found == ([value] if value else [])


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("routing number 111000025", "111000025"),
        ("ABA 111000025", "111000025"),
        ("routing number 111000026", None),  # checksum fails
        ("account number: 000123456789", "000123456789"),
        ("Savings account 12-345-678", "12-345-678"),
        ("sort code 12-34-56", "12-34-56"),
        ("order number 000123456789", None),
    ],
)
def test_bank_accounts(text: str, value: str | None) -> None:
    found = [v for e, v in spans(text) if e == "BANK_ACCOUNT"]
    assert found == ([value] if value else [])


def test_id_entities_can_be_chosen_separately() -> None:
    banks = PiiDetector({"entities": ["BANK_ACCOUNT"]})
    assert spans("BSN 111222333, account number 00123456", banks) == [("BANK_ACCOUNT", "00123456")]
    ids = PiiDetector({"entities": ["NATIONAL_ID"]})
    assert spans("BSN 111222333, account number 00123456", ids) == [("NATIONAL_ID", "111222333")]


@pytest.mark.parametrize(
    "text",
    [
        f"AWS_SECRET_ACCESS_KEY={AWS_SECRET}",
        f'"aws_secret_access_key": "{AWS_SECRET}"',
        f"key id AKIAIOSFODNN7EXAMPLE and then {AWS_SECRET}",
        f"the secret is {AWS_SECRET}",
        "token ya29.a0AfH6SMBx3jK9LmNoPqRsTuVwXyZ012345",
        "GOCSPX-4hQ2xR7bT9kLmN3pVw8sYz1aBcD",
        "DO token dop_v1_" + hashlib.sha256(b"do").hexdigest(),
        "shpat_" + "a1b2c3d4" * 4,
        "bot 123456789:AAHfiqksKZ8WmR2zSjiQ7_v4TMAKdiHm9T0",
        "hooks.slack.com/services/T0123ABCD/B0456EFGH/abcdEFGHijklMNOPqrstUVWX",
        "client secret abc8Q~xYz1234567890AbCdEfGhIjKlMnOpQrStU",
        "AccountKey=Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZmdoaWprbG1ub3A=",
    ],
)
def test_provider_secrets(text: str) -> None:
    assert "SECRET" in {e for e, _ in spans(text)}


@pytest.mark.parametrize(
    "text",
    [
        "commit 9fceb02d0ae598e95dc970b74767f19372d61af8 has the secret fix",  # hex: a digest
        f"the value {AWS_SECRET} alone",  # 40 base64 characters, nothing says it is a key
    ],
)
def test_secret_look_alikes(text: str) -> None:
    assert [e for e, _ in spans(text) if e == "SECRET"] == []


@pytest.mark.parametrize(
    "text",
    [
        "Upgraded to version 10.2.0.1 yesterday",
        "version: 10.2.0.1",
        "Running v1.2.3.4 now",
        "User-Agent: Chrome/1.2.3.4",
        "firmware 4.3.2.1 installed",
        "release 2.0.0.1 is out",
        "The package was bumped to 1.10.0.2 last week",
        "pip install pkg==1.2.3.4",
    ],
)
def test_versions_are_not_ip_addresses(text: str) -> None:
    assert spans(text) == []


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("server at 10.2.0.1 is down", "10.2.0.1"),
        ("after the upgrade the host 10.2.0.1 is down", "10.2.0.1"),  # the address word is nearer
        ("ssh admin@10.0.0.1", "10.0.0.1"),
        ("host=10.12.0.254;port=5432", "10.12.0.254"),
        ("Upgraded to 10.2.0.1. Then ping 10.2.0.1", "10.2.0.1"),  # a new clause
    ],
)
def test_addresses_near_version_words(text: str, value: str) -> None:
    assert ("IP_ADDRESS", value) in spans(text)


@pytest.mark.parametrize(
    "text",
    [
        "Order ORD-55512345 shipped, invoice INV-204518",
        "invoice 2024-00123 and order number 4155552671",
        "sha256 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "md5 5d41402abc4b2a76b9719d911017c592, uuid 9b2f4c1e-8d3a-4e5b-9c7d-1a2b3c4d5e6f",
        "timestamp 2024-01-15T10:30:45Z, epoch 1700000000, millis 1700000000123",
        "EAN 4006381333931 and ISBN 978-3-16-148410-0",
        "card 4111 1111 1111 1112 and IBAN GB29 NWBK 6016 1331 9268 18",  # checksums fail
        "SSN 000-12-3456 and 666-45-6789",
        "int x = 1234567890; arr[0x7fffffff]; mask = 0xFFFF0000",
        "for (int i = 0; i < 100000; i++) total += 3.14159265;",
        "price $1,234,567.89 for 12 units",
        "card number 4111 1111 1111 1111"[:12] + " 1234",  # a card's first 8 digits + more
    ],
)
def test_pii_free_look_alikes(text: str) -> None:
    assert spans(text) == []


def test_short_maestro_numbers_need_a_card_word() -> None:
    assert spans("card 676168246277") == [("CREDIT_CARD", "676168246277")]
    assert spans("ref 676168246277") == []


def test_jcb_fifteen_digit_ranges() -> None:
    assert ("CREDIT_CARD", "180064708330160") in spans("my card 180064708330160")


STREAM_PIECES = [
    "My cell is 138 0013 8000. ",
    "Desk: (758)482-4606x415 ",
    f"aws key AKIAIOSFODNN7EXAMPLE secret {AWS_SECRET} ",
    "BSN 111222333 ",
    "version 10.2.0.1 and host 10.2.0.1 ",
    "sort code 12-34-56 ",
    "plain words here ",
]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.sampled_from(STREAM_PIECES), min_size=1, max_size=6),
    st.lists(st.integers(min_value=0, max_value=300), max_size=30),
)
def test_stream_redacts_what_a_whole_check_does(parts: list[str], cuts: list[int]) -> None:
    text = "".join(parts)
    whole = check_segments(RULESET, Scope.OUTPUT, [Segment(text, 0)]).redacted[0]
    moderator = StreamModerator(RULESET)
    out: list[str] = []
    prev = 0
    for cut in [*sorted({c for c in cuts if 0 < c < len(text)}), len(text)]:
        out.append(moderator.feed(text[prev:cut]).text)
        prev = cut
    out.append(moderator.finish().text)
    assert "".join(out) == whole
    assert "138 0013 8000" not in whole and AWS_SECRET not in whole and "111222333" not in whole
