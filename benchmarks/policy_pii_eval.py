"""PII recall and false positives of the ``pii`` rule on third-party text: Presidio's templates.

The data is not ours: the sentence templates that ``presidio-evaluator`` ships
(``presidio_evaluator/data_generator/raw_data/templates.txt``, MIT licence), filled
by Faker (``en_US``, seeded). Only the template file (and the package's own fill
lists) is read; the package is not imported (its ``__init__`` needs spaCy).

The split was decided before any tuning and does not change: a template whose
0-based line index in the file is even belongs to ``tune``, odd to ``test`` (the
headline). Every fill of a template stays on its template's side. Detectors may be
tuned by looking at ``tune`` failures only (``--misses`` refuses ``test``).

* Recall: each template is filled :data:`FILLS` times. Slots that hold one of our
  entity types (:data:`COUNTED`) are expected spans; a span is recalled when a
  finding of a ``pii`` rule of the same entity type overlaps it (``any_type``:
  of any type). The other slots (names, addresses, dates, ...) are filled too and
  must not be flagged (``spurious``: findings on no counted span).
* False positives: each template with a counted slot is filled once per
  :data:`LOOKALIKES` kind, every counted slot holding a non-PII look-alike of
  that kind (hashes, uuids, EAN/ISBN, timestamps, version strings, Luhn-invalid
  card numbers, order numbers, ...); templates without a counted slot are filled
  :data:`FILLS` times as they are (``plain``). ``pii_fpr`` is the fraction of
  these texts on which a ``pii`` rule finds anything.

``python -m benchmarks.policy_pii_eval`` prints both splits.
"""

from __future__ import annotations

import argparse
import csv
import importlib.metadata
import io
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

import yaml
from faker import Faker
from stdnum import iban as stdnum_iban  # type: ignore[import-untyped]
from stdnum import luhn  # type: ignore[import-untyped]

from policy.config import DEFAULT_RULESET
from policy.engine import Segment, check_segments
from policy.rules import Ruleset, Scope, parse_ruleset

PACKAGE = "presidio-evaluator"
PACKAGE_VERSION = "0.3.2"
LICENCE = "MIT"
RAW_DATA = "presidio_evaluator/data_generator/raw_data"
TEMPLATES = f"{RAW_DATA}/templates.txt"
DATASET = {
    "name": f"{PACKAGE} sentence templates ({TEMPLATES}) filled by Faker en_US",
    "version": PACKAGE_VERSION,
    "licence": LICENCE,
}
SPLITS = ("tune", "test")
FAKER_LOCALE = "en_US"
FAKER_SEED = 18
FILLS = 5
# Faker's dates are relative to today unless bounded: these bounds keep every run's data the same.
EPOCH = datetime(1970, 1, 1)
END = datetime(2025, 1, 1)
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
# Template slot -> the entity type the pii rule must find there. Every other slot is context.
COUNTED = {
    "credit_card_number": "CREDIT_CARD",
    "iban": "IBAN",
    "phone_number": "PHONE",
    "email": "EMAIL",
    "ssn": "US_SSN",
    "ip_address": "IP_ADDRESS",
    "ipv4": "IP_ADDRESS",
    "ipv6": "IP_ADDRESS",
}


def _luhn_invalid(f: Faker) -> str:
    digits = f.numerify("4###############")
    if luhn.is_valid(digits):
        digits = digits[:-1] + str((int(digits[-1]) + 1) % 10)
    sep = f.random_element((" ", "-", ""))
    return sep.join(digits[i : i + 4] for i in range(0, 16, 4))


def _iban_invalid(f: Faker) -> str:
    value = str(f.iban())
    while stdnum_iban.is_valid(value):
        value = value[:-1] + str((int(value[-1]) + 1) % 10)
    return value


# Non-PII values that look like the PII they replace. Each kind fills every counted slot of a template.
LOOKALIKES: dict[str, Callable[[Faker], str]] = {
    "sha256": lambda f: str(f.sha256()),
    "md5": lambda f: str(f.md5()),
    "sha1_short": lambda f: str(f.sha1())[:10],
    "uuid4": lambda f: str(f.uuid4()),
    "ean13": lambda f: str(f.ean13()),
    "isbn13": lambda f: str(f.isbn13()),
    "iso8601": lambda f: f.date_time_between(EPOCH, END).isoformat(),
    "unix_time": lambda f: str(int(f.date_time_between(EPOCH, END).timestamp())),
    "date_time": lambda f: f.date_time_between(EPOCH, END).strftime("%Y-%m-%d %H:%M:%S"),
    "version": lambda f: f.numerify("#.##.#"),
    "v_version": lambda f: f.numerify("v#.#.##"),
    "v_version4": lambda f: f.numerify("v#.#.#.##"),
    "luhn_invalid_card": _luhn_invalid,
    "iban_invalid": _iban_invalid,
    "ssn_invalid": lambda f: f.numerify(str(f.random_element(("000-##-####", "666-##-####")))),
    "order_number": lambda f: f.bothify("ORD-########"),
    "invoice_number": lambda f: f.bothify("INV-######"),
    "price": lambda f: str(f.pricetag()),
    "hex_literal": lambda f: "0x" + f.hexify("^^^^^^^^"),
}


@dataclass(frozen=True)
class Span:
    start: int
    end: int
    entity: str


@dataclass(frozen=True)
class Text:
    template: int
    text: str
    spans: tuple[Span, ...]
    kind: str = ""  # look-alike kind of a PII-free text ("plain": none was needed)


@dataclass
class Family:
    expected: int = 0
    found: int = 0
    any_type: int = 0

    def row(self) -> dict[str, Any]:
        return {
            "expected": self.expected,
            "found": self.found,
            "recall": round(self.found / self.expected, 4) if self.expected else None,
            "any_type": self.any_type,
        }


@dataclass
class Result:
    per_family: dict[str, Family] = field(default_factory=dict)
    per_kind: dict[str, list[int]] = field(default_factory=dict)  # kind -> [flagged, texts]
    spurious: int = 0
    n_texts: int = 0
    misses: list[tuple[Text, Span, list[tuple[int, int, str]]]] = field(default_factory=list)
    spurious_items: list[tuple[Text, tuple[int, int, str]]] = field(default_factory=list)
    false_positives: list[tuple[Text, list[tuple[int, int, str]]]] = field(default_factory=list)


def _raw_file(name: str) -> str:
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError as exc:
        raise RuntimeError(f"{PACKAGE} is not installed: run scripts/test-setup.sh") from exc
    path = Path(str(dist.locate_file(f"{RAW_DATA}/{name}")))
    return path.read_text(encoding="utf-8-sig")


def package_version() -> str:
    return importlib.metadata.version(PACKAGE)


def templates() -> list[str]:
    """The template file's lines, as Presidio reads them (``\\n`` written out becomes a newline)."""
    return [line.strip().replace("\\n", "\n") for line in _raw_file("templates.txt").splitlines()]


def split_of(index: int) -> str:
    return "tune" if index % 2 == 0 else "test"


class _Filler:
    """Faker plus the package's own lists for the slots Faker has no provider for."""

    def __init__(self) -> None:
        self.faker = Faker(FAKER_LOCALE)
        self.faker.seed_instance(FAKER_SEED)
        nationalities = list(csv.DictReader(io.StringIO(_raw_file("nationalities.csv"))))
        self._nation = {
            "nationality": [r["nationality"] for r in nationalities],
            "nation_man": [r["man"] for r in nationalities],
            "nation_woman": [r["woman"] for r in nationalities],
            "nation_plural": [r["plural"] for r in nationalities],
        }
        self._organizations = _raw_file("companies_and_organizations.csv").splitlines()[1:]
        licences = yaml.safe_load(_raw_file("us_driver_license_format.yaml"))
        self._licence_formats = [
            fmt for formats in licences["en"]["faker"]["driving_license"]["usa"].values() for fmt in formats
        ]

    def fill(self, slot: str) -> str:
        f = self.faker
        if slot in ("person", "name"):
            return str(f.name())
        if slot == "organization":
            return str(f.random_element(self._organizations))
        if slot in self._nation:
            return str(f.random_element(self._nation[slot]))
        if slot == "ip_address":  # as the package's IpAddressProvider: mostly v4
            return str(f.ipv4() if f.random.random() < 0.8 else f.ipv6())
        if slot == "age":
            return str(f.random_int(1, 99))
        if slot == "us_driver_license":
            return f.bothify(str(f.random_element(self._licence_formats)))
        if slot == "date_time":
            return f.date_time_between(EPOCH, END).strftime("%Y-%m-%d %H:%M:%S")
        if slot == "date_of_birth":
            return str(f.date_between(date(1930, 1, 1), date(2006, 12, 31)))
        if slot == "year":
            return str(f.random_int(1970, END.year - 1))
        if slot == "day_of_week":
            return str(f.random_element(WEEKDAYS))
        provider = getattr(f, slot, None)
        if provider is None:
            raise KeyError(f"no fill for template slot {slot!r}")
        return str(provider())


def _slots(template: str) -> list[tuple[int, int, str]]:
    out: list[tuple[int, int, str]] = []
    pos = 0
    while (i := template.find("{{", pos)) >= 0:
        j = template.index("}}", i)
        out.append((i, j + 2, template[i + 2 : j].strip().lower()))
        pos = j + 2
    return out


def _render(index: int, template: str, value: Callable[[str], str], kind: str = "") -> Text:
    parts: list[str] = []
    spans: list[Span] = []
    pos = length = 0
    for start, end, slot in _slots(template):
        parts.append(template[pos:start])
        length += start - pos
        filled = value(slot)
        if slot in COUNTED and not kind:
            spans.append(Span(length, length + len(filled), COUNTED[slot]))
        parts.append(filled)
        length += len(filled)
        pos = end
    parts.append(template[pos:])
    return Text(index, "".join(parts), tuple(spans), kind)


def build(split: str) -> tuple[list[Text], list[Text]]:
    """(texts with PII, PII-free texts) of one split, the same on every run."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}")
    filler = _Filler()
    positives: list[Text] = []
    negatives: list[Text] = []
    for index, template in enumerate(templates()):
        if not template or split_of(index) != split:
            continue
        for _ in range(FILLS):
            positives.append(_render(index, template, filler.fill))
        if any(slot in COUNTED for _, _, slot in _slots(template)):
            for kind, make in LOOKALIKES.items():

                def value(slot: str, make: Callable[[Faker], str] = make) -> str:
                    return make(filler.faker) if slot in COUNTED else filler.fill(slot)

                negatives.append(_render(index, template, value, kind))
        else:
            negatives.extend(_render(index, template, filler.fill, "plain") for _ in range(FILLS))
    return positives, negatives


def default_ruleset() -> Ruleset:
    return parse_ruleset(DEFAULT_RULESET.read_bytes(), str(DEFAULT_RULESET)).for_tenant("")


def _pii_findings(ruleset: Ruleset, text: str) -> list[tuple[int, int, str]]:
    decision = check_segments(ruleset, Scope.INPUT, [Segment(text, 0)])
    return [(f.start, f.end, f.entity_type) for f in decision.findings if f.detector == "pii"]


def run(ruleset: Ruleset, split: str) -> Result:
    positives, negatives = build(split)
    result = Result(per_family={e: Family() for e in sorted(set(COUNTED.values()))})
    result.n_texts = len(positives)
    for item in positives:
        findings = _pii_findings(ruleset, item.text)
        covered = [False] * len(findings)
        for span in item.spans:
            family = result.per_family[span.entity]
            family.expected += 1
            hits = [i for i, (s, e, _) in enumerate(findings) if s < span.end and span.start < e]
            for i in hits:
                covered[i] = True
            family.any_type += bool(hits)
            if any(findings[i][2] == span.entity for i in hits):
                family.found += 1
            else:
                result.misses.append((item, span, findings))
        result.spurious += covered.count(False)
        result.spurious_items.extend((item, f) for f, hit in zip(findings, covered, strict=True) if not hit)
    for item in negatives:
        findings = _pii_findings(ruleset, item.text)
        counts = result.per_kind.setdefault(item.kind, [0, 0])
        counts[0] += bool(findings)
        counts[1] += 1
        if findings:
            result.false_positives.append((item, findings))
    return result


def evaluate(ruleset: Ruleset | None = None, split: str = "test") -> dict[str, Any]:
    """The headline figures of one split (``test`` unless asked otherwise)."""
    result = run(ruleset or default_ruleset(), split)
    expected = sum(f.expected for f in result.per_family.values())
    found = sum(f.found for f in result.per_family.values())
    n_free = sum(n for _, n in result.per_kind.values())
    flagged = sum(k for k, _ in result.per_kind.values())
    return {
        "split": split,
        "pii_recall": round(found / expected, 4) if expected else None,
        "pii_recall_any_type": round(sum(f.any_type for f in result.per_family.values()) / expected, 4)
        if expected
        else None,
        "pii_fpr": round(flagged / n_free, 4) if n_free else None,
        "per_family": {name: f.row() for name, f in result.per_family.items()},
        "per_lookalike": {
            kind: {"texts": n, "flagged": k, "fpr": round(k / n, 4)}
            for kind, (k, n) in result.per_kind.items()
        },
        "spurious_findings": result.spurious,
        "n_texts": result.n_texts,
        "n_spans": expected,
        "n_pii_free": n_free,
        "dataset": {**DATASET, "installed_version": package_version(), "fills": FILLS, "seed": FAKER_SEED},
    }


def _table(report: dict[str, Any]) -> str:
    lines = [
        f"split {report['split']}: pii_recall {report['pii_recall']} "
        f"(any type {report['pii_recall_any_type']}), "
        f"pii_fpr {report['pii_fpr']} on {report['n_pii_free']} PII-free texts, {report['n_spans']} spans "
        f"in {report['n_texts']} texts, {report['spurious_findings']} spurious findings",
        f"  {'entity':<12} {'expected':>8} {'found':>6} {'recall':>7} {'any':>5}",
    ]
    for name, row in report["per_family"].items():
        lines.append(
            f"  {name:<12} {row['expected']:>8} {row['found']:>6} {row['recall']!s:>7} {row['any_type']:>5}"
        )
    flagged = ", ".join(
        f"{k} {v['flagged']}/{v['texts']}" for k, v in report["per_lookalike"].items() if v["flagged"]
    )
    lines.append(f"  look-alikes flagged: {flagged or 'none'}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--split", choices=(*SPLITS, "both"), default="both")
    parser.add_argument(
        "--misses", action="store_true", help="list the tune split's misses and false positives"
    )
    args = parser.parse_args(argv)
    ruleset = default_ruleset()
    print(f"dataset: {DATASET['name']}, version {package_version()}, licence {LICENCE}")
    for split in SPLITS if args.split == "both" else (args.split,):
        began = time.perf_counter()
        report = evaluate(ruleset, split)
        print(_table(report))
        print(f"  ({time.perf_counter() - began:.2f} s)")
    if args.misses:
        # Only the tune split may be looked at item by item: the test split is the headline.
        result = run(ruleset, "tune")
        for item, span, findings in result.misses:
            print("MISS", span.entity, repr(item.text[span.start : span.end]), "|", repr(item.text), findings)
        for item, findings in result.false_positives:
            print("FP", item.kind, repr(item.text), findings)
        for item, (start, end, entity) in result.spurious_items:
            print("SPURIOUS", entity, repr(item.text[start:end]), "|", repr(item.text))


if __name__ == "__main__":
    main()
