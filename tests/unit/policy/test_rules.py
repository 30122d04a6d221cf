from __future__ import annotations

import pytest

from policy.config import DEFAULT_RULESET
from policy.rules import Action, RulesetError, Scope, parse_ruleset

BASE = """\
version: t1
rules:
  - id: pii
    detector: pii
    scope: both
    action: redact
  - id: words
    detector: keyword
    scope: output
    action: block
    options: {keywords: [forbidden]}
tenants:
  acme:
    disable: [words]
    audit_store_text: true
    rules:
      - id: pii
        detector: pii
        scope: input
        action: flag
        options: {entities: [EMAIL]}
      - id: acme-extra
        detector: regex
        scope: input
        action: block
        options: {patterns: ['secret project \\w+']}
"""


def test_default_ruleset_parses() -> None:
    doc = parse_ruleset(DEFAULT_RULESET.read_bytes(), str(DEFAULT_RULESET))
    ids = [r.id for r in doc.rules]
    assert {"pii", "prompt-injection", "input-max-length"} <= set(ids)
    assert doc.for_tenant("anyone").hold_back_chars > 0


def test_tenant_override_replaces_disables_and_adds() -> None:
    doc = parse_ruleset(BASE, "api")
    base = doc.for_tenant("someone")
    acme = doc.for_tenant("acme")
    assert [r.id for r in base.rules] == ["pii", "words"]
    assert [r.id for r in acme.rules] == ["pii", "acme-extra"]
    assert acme.rules[0].action == Action.FLAG and acme.rules[0].scope == Scope.INPUT
    assert acme.audit_store_text and not base.audit_store_text
    assert base.version == acme.version and base.version.startswith("t1+")


def test_version_changes_with_any_edit() -> None:
    a = parse_ruleset(BASE, "api").version
    b = parse_ruleset(BASE.replace("forbidden", "forbidden2"), "api").version
    assert a != b


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        (
            "rules:\n  - id: a\n    detector: nope\n    scope: input\n    action: block\n",
            3,
            "unknown detector",
        ),
        (
            "rules:\n  - id: a\n    detector: regex\n    scope: input\n    action: block\n"
            "    options:\n      patterns: ['(']\n",
            7,
            "invalid pattern",
        ),
        (
            "rules:\n  - id: a\n    detector: pii\n    scope: sideways\n    action: block\n",
            4,
            "scope must be",
        ),
        (
            "rules:\n  - id: a\n    detector: pii\n    scope: input\n    action: block\n"
            "  - id: a\n    detector: pii\n    scope: input\n    action: flag\n",
            6,
            "duplicate rule id",
        ),
        (
            "rules:\n  - id: a\n    detector: pii\n    scope: input\n    action: block\n"
            "    options: {entities: [PASSPORT]}\n",
            6,
            "unknown PII entity",
        ),
        ("rules: [\n", 2, "invalid YAML"),
        ("rules: []\nextra: 1\n", 2, "unknown key 'extra'"),
        (
            "rules:\n  - id: a\n    detector: max_length\n    scope: input\n    action: block\n",
            3,
            "max_chars",
        ),
    ],
)
def test_invalid_ruleset_names_line_and_reason(text: str, line: int, fragment: str) -> None:
    with pytest.raises(RulesetError) as err:
        parse_ruleset(text, "api")
    assert err.value.line == line
    assert fragment in err.value.reason


def test_invalid_utf8_is_rejected() -> None:
    with pytest.raises(RulesetError, match="UTF-8"):
        parse_ruleset(b"rules: []\n# \xff\n", "api")


def test_roles_are_validated() -> None:
    with pytest.raises(RulesetError, match="roles must be") as err:
        parse_ruleset(
            "rules:\n  - id: a\n    detector: pii\n    scope: input\n    action: flag\n    roles: [boss]\n",
            "x",
        )
    assert err.value.line == 6
    doc = parse_ruleset(
        "rules:\n  - id: a\n    detector: pii\n    scope: input\n    action: flag\n    roles: [user]\n", "x"
    )
    rule = doc.rules[0]
    assert rule.applies_to("user") and not rule.applies_to("system") and rule.applies_to("")


def test_output_rules_must_fit_a_stream() -> None:
    rule = "rules:\n  - id: {id}\n    detector: {detector}\n    scope: {scope}\n    action: {action}\n"
    regex = rule + "    options: {{patterns: ['x+'], max_span: 300}}\nhold_back_chars: 200\n"
    with pytest.raises(RulesetError, match=r"rule 'r'.*300 characters.*hold_back_chars \(200\)"):
        parse_ruleset(regex.format(id="r", detector="regex", scope="both", action="redact"), "x")
    # Input only, or a flag (which removes nothing), may outspan the bound.
    parse_ruleset(regex.format(id="r", detector="regex", scope="input", action="redact"), "x")
    parse_ruleset(regex.format(id="r", detector="regex", scope="output", action="flag"), "x")
    with pytest.raises(RulesetError, match="rule 'inj': the injection detector needs the whole answer"):
        parse_ruleset(rule.format(id="inj", detector="injection", scope="output", action="block"), "x")
    topics = rule + "    options: {{topics: {{t: [a, b]}}, min_hits: 2}}\n"
    with pytest.raises(RulesetError, match="rule 't'"):
        parse_ruleset(topics.format(id="t", detector="topic", scope="both", action="block"), "x")
