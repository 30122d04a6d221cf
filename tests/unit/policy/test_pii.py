from __future__ import annotations

import pytest

from policy.detectors.base import MESSAGE
from policy.detectors.pii import PiiDetector, iban_ok, luhn_ok, ssn_ok

DETECTOR = PiiDetector({})


def found(text: str) -> set[str]:
    return {m.entity_type for m in DETECTOR.scan(text, MESSAGE)}


def test_checks() -> None:
    assert luhn_ok("4111111111111111") and not luhn_ok("4111111111111112")
    assert iban_ok("DE89370400440532013000") and not iban_ok("DE89370400440532013001")
    assert ssn_ok("536", "22", "1234")
    assert (
        not ssn_ok("666", "12", "3456")
        and not ssn_ok("900", "12", "3456")
        and not ssn_ok("123", "00", "4567")
    )


@pytest.mark.parametrize(
    ("text", "entity"),
    [
        ("mail anna.schmidt@example.de now", "EMAIL"),
        ("call +44 20 7946 0958", "PHONE"),
        ("call (415) 555 2671", "PHONE"),
        ("card 4111 1111 1111 1111", "CREDIT_CARD"),
        ("amex 3782 822463 10005", "CREDIT_CARD"),
        ("IBAN GB29 NWBK 6016 1331 9268 19", "IBAN"),
        ("SSN 536-22-1234", "US_SSN"),
        ("host 192.168.10.4", "IP_ADDRESS"),
        ("host 2001:db8::8a2e:370:7334", "IP_ADDRESS"),
        ("key ghp_aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5", "SECRET"),
        ("AWS AKIAIOSFODNN7EXAMPLE", "SECRET"),
        ("password: Tr0ub4dor&3x", "SECRET"),
        ("Her number: +48 601 234 567", "PHONE"),
    ],
)
def test_positive(text: str, entity: str) -> None:
    assert entity in found(text)


@pytest.mark.parametrize(
    "text",
    [
        "card 4111 1111 1111 1112",  # Luhn fails
        "Order number 4532015112830366 is ready",  # Luhn passes, but it is an order id
        "id 7734229100458812",  # Luhn passes, no issuer uses 77
        "IBAN DE89 3704 0044 0532 0130 01",  # mod-97 fails
        "SSN 666-45-6789",
        "released 2024-01-15 at 10:30:45",
        "version 1.2.3.4",
        "uuid 550e8400-e29b-41d4-a716-446655440000",
        "OPENAI_API_KEY=sk-XXXXXXXXXXXXXXXXXXXXXXXXXXXX",
        "api_key=<YOUR_API_KEY>",
        "epoch 1700000000",
        "std::vector and a::b",
    ],
)
def test_hard_negative(text: str) -> None:
    assert found(text) == set()


def test_overlaps_keep_the_stronger_entity() -> None:
    matches = DETECTOR.scan("pay DE89 3704 0044 0532 0130 00 today", MESSAGE)
    assert [m.entity_type for m in matches] == ["IBAN"]


def test_card_followed_by_another_number() -> None:
    (m,) = DETECTOR.scan("card 4111 1111 1111 1111 2027", MESSAGE)
    assert m.entity_type == "CREDIT_CARD" and m.value == "4111111111111111"


def test_entity_selection() -> None:
    only_email = PiiDetector({"entities": ["EMAIL"]})
    assert {m.entity_type for m in only_email.scan("a@b.io 4111 1111 1111 1111", MESSAGE)} == {"EMAIL"}


def test_scan_from_start_sees_the_context_before_it() -> None:
    text = "Order number 4532015112830366, mail a@b.io, call +44 20 7946 0958"
    start = text.index("4532")
    found_types = [m.entity_type for m in DETECTOR.scan(text, MESSAGE, start)]
    assert found_types == ["EMAIL", "PHONE"]  # the card-shaped order id stays an order id
    assert all(m.start >= start for m in DETECTOR.scan(text, MESSAGE, start))


def test_skipping_patterns_by_their_first_characters_never_changes_a_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The start index (patterns no character of the tail can begin a match of are not run) gives
    what running every pattern gives: scans of whole texts, and scans and pending starts of every
    prefix of them as a stream sees it (the tail from a few characters back)."""
    from benchmarks.policy_eval import load
    from policy.detectors.base import OUTPUT
    from policy.detectors.pii import _StartIndex

    texts = [i["text"] for i in load() if i["detector"] == "pii"]
    texts += [
        "mail me at jane.doe@example.com or call +1 (415) 555-0133 tomorrow",
        "the key is AKIAIOSFODNN7EXAMPLE and fe80::1ff:fe23:4567:890a",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEow",
        "plain prose with nothing in it at all",
        "DE89 3704 0044 0532 0130 00 is an IBAN; 4111 1111 1111 1111 a card",
    ]

    def run() -> list[object]:
        out: list[object] = []
        for text in texts:
            out.append(DETECTOR.scan(text, MESSAGE))
            for end in range(1, len(text) + 1, 3):
                prefix = text[:end]
                start = max(0, end - 12)
                out.append(DETECTOR.scan(prefix, OUTPUT, start))
                found = DETECTOR.pending_start(prefix, start)
                # A pattern pending only at the very end holds nothing back: the same as none.
                out.append(None if found is None or found >= len(prefix) else found)
        return out

    indexed = run()
    everything = tuple(DETECTOR._patterns)
    monkeypatch.setattr(_StartIndex, "active", lambda self, text, start: everything)
    assert run() == indexed
    assert len(indexed) > 5000
