"""The third-party PII evaluation: its data, its split and that its figures can fail."""

from __future__ import annotations

from stdnum import iban, luhn  # type: ignore[import-untyped]

from benchmarks import policy_pii_eval as ev
from policy.rules import parse_ruleset

EMAIL_ONLY = """
rules:
  - id: pii
    detector: pii
    scope: both
    action: redact
    options: {entities: [EMAIL]}
"""


def test_dataset_is_the_pinned_package() -> None:
    assert ev.package_version() == ev.PACKAGE_VERSION
    lines = ev.templates()
    assert len(lines) > 200
    slots = {slot for line in lines for _, _, slot in ev._slots(line)}
    # Every template slot gets a fill, and the counted ones are the slots the file really uses.
    assert {"credit_card_number", "phone_number", "email", "iban", "ssn", "ip_address"} <= slots


def test_split_is_by_template_line_and_deterministic() -> None:
    tune_pos, tune_neg = ev.build("tune")
    test_pos, test_neg = ev.build("test")
    assert {t.template % 2 for t in tune_pos + tune_neg} == {0}
    assert {t.template % 2 for t in test_pos + test_neg} == {1}
    again_pos, again_neg = ev.build("test")
    assert [t.text for t in again_pos] == [t.text for t in test_pos]
    assert [t.text for t in again_neg] == [t.text for t in test_neg]


def test_spans_point_at_the_filled_values() -> None:
    positives, negatives = ev.build("tune")
    spans = [(t.text[s.start : s.end], s.entity) for t in positives for s in t.spans]
    assert spans and all(value.strip() == value and value for value, _ in spans)
    assert any(entity == "EMAIL" and "@" in value for value, entity in spans)
    assert all(not t.spans and t.kind for t in negatives)


def test_look_alikes_are_not_pii() -> None:
    faker = ev._Filler().faker
    for _ in range(50):
        card = ev.LOOKALIKES["luhn_invalid_card"](faker)
        assert not luhn.is_valid("".join(c for c in card if c.isdigit()))
        assert not iban.is_valid(ev.LOOKALIKES["iban_invalid"](faker))


def test_figures_fail_when_the_detector_misses() -> None:
    ruleset = parse_ruleset(EMAIL_ONLY, "test").for_tenant("")
    report = ev.evaluate(ruleset, "tune")
    assert report["per_family"]["EMAIL"]["recall"] == 1.0
    assert report["per_family"]["PHONE"]["found"] == 0
    assert report["pii_recall"] < 0.5


def test_default_ruleset_on_the_tune_split() -> None:
    # A regression guard on the split detectors may be tuned on; the test split is the headline.
    report = ev.evaluate(ev.default_ruleset(), "tune")
    assert report["pii_recall"] >= 0.97 and report["pii_fpr"] <= 0.02
    assert report["n_spans"] >= 100 and report["n_pii_free"] >= 500
    assert set(report) >= {
        "pii_recall",
        "pii_fpr",
        "per_family",
        "n_texts",
        "n_spans",
        "n_pii_free",
        "dataset",
    }
    assert report["dataset"]["licence"] == "MIT" and report["dataset"]["version"] == "0.3.2"
