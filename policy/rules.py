"""Rulesets: the YAML format, its validation (with line numbers) and the per-tenant view.

A ruleset document::

    version: "2026.11.1"        # optional label, shown in the ruleset version
    hold_back_chars: 8448       # bound on what a stream may hold back (>= every output rule's span)
    audit_store_text: false     # put the checked text itself into audit records
    rules:
      - id: pii
        detector: pii           # regex | keyword | topic | max_length | pii | injection
        scope: both             # input | output | both
        action: redact          # allow | flag | redact | block
        message: Personal data was redacted.
        options: {entities: [EMAIL, PHONE]}
        roles: [user, tool]     # optional: message roles it applies to (documents always)
    tenants:
      acme:
        disable: [topic-denylist]
        rules: [...]            # replace a rule with the same id, or add one
        audit_store_text: true

The version of a document is its label (if any) plus the first 12 hex digits of
the SHA-256 of its bytes, so any edit, to any tenant's section, gives a new version.

Streaming: an output rule whose longest match (``Detector.max_span``) is longer than
``hold_back_chars`` is refused, for the base rules and for every tenant's view: a stream
would have to release the start of such a match before it could tell that it is one.
The bound does not silently follow the rules because it is the operator's promise about
how long a stream may stall; the error names the rule and the bound it needs. So are
output rules that need the whole answer rather than a window (``injection``, ``topic``
with ``min_hits`` > 1) when they redact or block.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import yaml

from policy.detectors import Detector, DetectorConfigError, build
from policy.detectors.injection import InjectionDetector
from policy.detectors.lexical import MaxLengthDetector, TopicDetector
from policy.detectors.pii import PEM_MAX_SPAN

# Enough for the longest built-in match (a PEM private key block, PEM_MAX_SPAN characters).
DEFAULT_HOLD_BACK_CHARS = 8448
assert DEFAULT_HOLD_BACK_CHARS >= PEM_MAX_SPAN
MAX_HOLD_BACK_CHARS = 65536
MAX_RULES = 500


class Action(IntEnum):
    """What a rule does when it matches; a larger value is a stronger action."""

    ALLOW = 1
    FLAG = 2
    REDACT = 3
    BLOCK = 4


class Scope(IntEnum):
    INPUT = 1
    OUTPUT = 2
    BOTH = 3

    def covers(self, scope: Scope) -> bool:
        return self in (Scope.BOTH, scope)


class RulesetError(ValueError):
    """An invalid ruleset: the line (1-based, 0 = unknown) and the reason."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}" if line else reason)
        self.line = line
        self.reason = reason


@dataclass(frozen=True)
class Rule:
    id: str
    detector_name: str
    scope: Scope
    action: Action
    message: str
    options: Mapping[str, Any]
    detector: Detector = field(compare=False, repr=False)
    line: int = 0
    # Message roles the rule applies to (None = all). Documents and answers have no role: always.
    roles: frozenset[str] | None = None

    def applies_to(self, role: str) -> bool:
        return self.roles is None or not role or role in self.roles


@dataclass(frozen=True)
class Ruleset:
    """The rules one tenant's requests are checked against."""

    version: str
    rules: tuple[Rule, ...]
    hold_back_bound: int
    audit_store_text: bool
    source: str
    # Answers' first moderation steps under this ruleset, by (tenant, first delta): kept and used
    # by policy.stream, and gone with the ruleset (a reload starts afresh).
    first_steps: OrderedDict[tuple[str, str], Any] = field(
        default_factory=OrderedDict, compare=False, repr=False
    )

    def for_scope(self, scope: Scope) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.scope.covers(scope))

    @property
    def hold_back_chars(self) -> int:
        """Longest window a streamed output rule needs (never more than the bound: see
        :func:`check_streamable`)."""
        need = max((r.detector.max_span for r in self.for_scope(Scope.OUTPUT)), default=0)
        return min(need, self.hold_back_bound)


def _whole_text_only(detector: Detector) -> bool:
    """Detectors whose verdict depends on the whole answer, not on a bounded window of it."""
    if isinstance(detector, InjectionDetector):
        return True
    return isinstance(detector, TopicDetector) and detector.min_hits > 1


def check_streamable(ruleset: Ruleset, where: str) -> None:
    """RulesetError unless a stream can hold back every output rule's longest match."""
    for rule in ruleset.for_scope(Scope.OUTPUT):
        if rule.action < Action.REDACT:
            continue  # a flag removes nothing: releasing early cannot leak
        span = rule.detector.max_span
        if span > ruleset.hold_back_bound:
            raise RulesetError(
                rule.line,
                f"rule {rule.id!r}{where}: a {rule.detector_name} match can span {span} characters, more "
                f"than hold_back_chars ({ruleset.hold_back_bound}); a stream would release its start "
                f"before it could redact or block it. Raise hold_back_chars to at least {span} "
                f"(at most {MAX_HOLD_BACK_CHARS}), narrow the rule, or scope it to input",
            )
        if _whole_text_only(rule.detector):
            raise RulesetError(
                rule.line,
                f"rule {rule.id!r}{where}: the {rule.detector_name} detector needs the whole answer "
                "and cannot moderate a stream; scope it to input, or (topic) set min_hits to 1",
            )


@dataclass(frozen=True)
class TenantOverride:
    disable: frozenset[str]
    rules: tuple[Rule, ...]
    audit_store_text: bool | None
    hold_back_chars: int | None


@dataclass(frozen=True)
class RulesetDocument:
    """A parsed, validated ruleset file with its tenant overrides."""

    version: str
    digest: str
    source: str
    rules: tuple[Rule, ...]
    hold_back_chars: int
    audit_store_text: bool
    tenants: Mapping[str, TenantOverride]
    _views: dict[str, Ruleset] = field(default_factory=dict, compare=False, repr=False)

    def for_tenant(self, tenant: str) -> Ruleset:
        """The effective ruleset of ``tenant`` (the base rules unless it has a section)."""
        key = tenant if tenant in self.tenants else ""
        view = self._views.get(key)
        if view is None:
            view = self._build_view(self.tenants.get(key))
            self._views[key] = view
        return view

    def _build_view(self, override: TenantOverride | None) -> Ruleset:
        if override is None:
            return Ruleset(self.version, self.rules, self.hold_back_chars, self.audit_store_text, self.source)
        replaced = {r.id: r for r in override.rules}
        rules = [replaced.pop(r.id, r) for r in self.rules if r.id not in override.disable]
        rules.extend(replaced.values())
        return Ruleset(
            self.version,
            tuple(rules),
            override.hold_back_chars if override.hold_back_chars is not None else self.hold_back_chars,
            override.audit_store_text if override.audit_store_text is not None else self.audit_store_text,
            self.source,
        )


# --- YAML with line numbers ---


class _LineDict(dict[str, Any]):
    line: int = 0
    key_lines: dict[str, int] = {}


class _LineList(list[Any]):
    line: int = 0
    item_lines: list[int]


class _Loader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> _LineDict:
    out = _LineDict()
    out.line = node.start_mark.line + 1
    out.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            raise RulesetError(key_node.start_mark.line + 1, f"keys must be strings, got {key!r}")
        if key in out:
            raise RulesetError(key_node.start_mark.line + 1, f"duplicate key {key!r}")
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_lines[key] = value_node.start_mark.line + 1
    return out


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> _LineList:
    out = _LineList(loader.construct_object(child, deep=True) for child in node.value)
    out.line = node.start_mark.line + 1
    out.item_lines = [child.start_mark.line + 1 for child in node.value]
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)  # type: ignore[arg-type]
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)  # type: ignore[arg-type]


def _line_of(container: Any, key: str | int | None = None) -> int:
    if isinstance(container, _LineDict):
        if isinstance(key, str) and key in getattr(container, "key_lines", {}):
            return container.key_lines[key]
        return container.line
    if isinstance(container, _LineList):
        if isinstance(key, int) and 0 <= key < len(container.item_lines):
            return container.item_lines[key]
        return container.line
    return 0


def _plain(value: Any) -> Any:
    """Line-annotated containers back to plain dicts and lists (for options and JSON)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _require_mapping(value: Any, where: str, line: int) -> _LineDict:
    if not isinstance(value, _LineDict):
        raise RulesetError(line, f"{where} must be a mapping")
    return value


def _known_keys(mapping: _LineDict, allowed: set[str], where: str) -> None:
    for key in mapping:
        if key not in allowed:
            raise RulesetError(
                _line_of(mapping, key),
                f"unknown key {key!r} in {where} (allowed: {', '.join(sorted(allowed))})",
            )


def _enum(value: Any, enum: type[IntEnum], what: str, line: int) -> Any:
    names = [m.name.lower() for m in enum]
    if not isinstance(value, str) or value.lower() not in names:
        raise RulesetError(line, f"{what} must be one of {', '.join(names)}, got {value!r}")
    return enum[value.upper()]


def _bounded_int(mapping: _LineDict, key: str, default: int, low: int, high: int) -> int:
    value = mapping.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RulesetError(_line_of(mapping, key), f"{key} must be an integer between {low} and {high}")
    return value


def _bool(mapping: _LineDict, key: str) -> bool | None:
    if key not in mapping:
        return None
    value = mapping[key]
    if not isinstance(value, bool):
        raise RulesetError(_line_of(mapping, key), f"{key} must be true or false")
    return value


_RULE_KEYS = {"id", "detector", "scope", "action", "message", "options", "enabled", "roles"}
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


def _parse_rule(raw: Any, line: int) -> Rule | None:
    rule = _require_mapping(raw, "a rule", line)
    _known_keys(rule, _RULE_KEYS, "a rule")
    rule_id = rule.get("id")
    if not isinstance(rule_id, str) or not rule_id or len(rule_id) > 128 or any(c.isspace() for c in rule_id):
        raise RulesetError(_line_of(rule, "id"), "a rule needs an id: 1-128 characters without spaces")
    for key in ("detector", "scope", "action"):
        if key not in rule:
            raise RulesetError(rule.line, f"rule {rule_id!r} has no {key}")
    scope = _enum(rule["scope"], Scope, "scope", _line_of(rule, "scope"))
    action = _enum(rule["action"], Action, "action", _line_of(rule, "action"))
    message = rule.get("message", "")
    if not isinstance(message, str):
        raise RulesetError(_line_of(rule, "message"), "message must be a string")
    options = rule.get("options", _LineDict())
    if options is None:
        options = _LineDict()
    options = _require_mapping(options, "options", _line_of(rule, "options"))
    name = rule["detector"]
    if not isinstance(name, str):
        raise RulesetError(_line_of(rule, "detector"), "detector must be a string")
    try:
        detector = build(name, _plain(options))
    except DetectorConfigError as exc:
        if exc.key and exc.key in options:
            line_no = _line_of(options, exc.key)
        else:
            line_no = _line_of(rule, "options" if "options" in rule else "detector")
        raise RulesetError(line_no, f"rule {rule_id!r}: {exc.reason}") from exc
    if isinstance(detector, MaxLengthDetector) and action in (Action.REDACT,):
        raise RulesetError(_line_of(rule, "action"), f"rule {rule_id!r}: max_length cannot redact")
    if _bool(rule, "enabled") is False:
        return None
    roles = None
    if "roles" in rule:
        raw_roles = rule["roles"]
        if (
            not isinstance(raw_roles, list)
            or not raw_roles
            or not all(isinstance(r, str) and r in ROLES for r in raw_roles)
        ):
            raise RulesetError(
                _line_of(rule, "roles"), f"roles must be a non-empty list of {', '.join(sorted(ROLES))}"
            )
        roles = frozenset(raw_roles)
    return Rule(rule_id, name, scope, action, message, _plain(options), detector, rule.line, roles)


def _parse_rules(raw: Any, line: int, where: str) -> tuple[Rule, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, _LineList):
        raise RulesetError(line, f"{where} must be a list of rules")
    if len(raw) > MAX_RULES:
        raise RulesetError(line, f"{where} has more than {MAX_RULES} rules")
    rules: list[Rule] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        rule = _parse_rule(item, _line_of(raw, i))
        if rule is None:
            continue
        if rule.id in seen:
            raise RulesetError(rule.line, f"duplicate rule id {rule.id!r}")
        seen.add(rule.id)
        rules.append(rule)
    return tuple(rules)


def _parse_tenant(name: str, raw: Any, line: int) -> TenantOverride:
    section = _require_mapping(raw, f"tenant {name!r}", line)
    _known_keys(section, {"disable", "rules", "audit_store_text", "hold_back_chars"}, f"tenant {name!r}")
    disable = section.get("disable") or []
    if not isinstance(disable, list) or not all(isinstance(d, str) for d in disable):
        raise RulesetError(_line_of(section, "disable"), "disable must be a list of rule ids")
    hold = None
    if "hold_back_chars" in section:
        hold = _bounded_int(section, "hold_back_chars", DEFAULT_HOLD_BACK_CHARS, 0, MAX_HOLD_BACK_CHARS)
    return TenantOverride(
        frozenset(disable),
        _parse_rules(section.get("rules"), _line_of(section, "rules"), f"tenant {name!r} rules"),
        _bool(section, "audit_store_text"),
        hold,
    )


def parse_ruleset(text: str | bytes, source: str) -> RulesetDocument:
    """Parses and validates a ruleset document; RulesetError names the line and the reason."""
    raw = text.encode("utf-8") if isinstance(text, str) else text
    try:
        document = yaml.load(raw.decode("utf-8"), Loader=_Loader)
    except UnicodeDecodeError as exc:
        raise RulesetError(0, f"the ruleset is not valid UTF-8 ({exc.reason} at byte {exc.start})") from exc
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 0
        raise RulesetError(line, f"invalid YAML: {exc.problem or exc.context}") from exc
    except yaml.YAMLError as exc:
        raise RulesetError(0, f"invalid YAML: {exc}") from exc
    top = _require_mapping(document, "the ruleset", 1)
    _known_keys(top, {"version", "hold_back_chars", "audit_store_text", "rules", "tenants"}, "the ruleset")
    label = top.get("version", "")
    if not isinstance(label, str | int | float) or isinstance(label, bool):
        raise RulesetError(_line_of(top, "version"), "version must be a string")
    label = str(label).strip()
    if len(label) > 64 or any(c.isspace() for c in label):
        raise RulesetError(_line_of(top, "version"), "version must be at most 64 characters without spaces")
    if "rules" not in top:
        raise RulesetError(1, "the ruleset has no rules list")
    rules = _parse_rules(top["rules"], _line_of(top, "rules"), "rules")
    tenants_raw = top.get("tenants") or _LineDict()
    tenants_map = _require_mapping(tenants_raw, "tenants", _line_of(top, "tenants"))
    tenants = {
        name: _parse_tenant(name, value, _line_of(tenants_map, name)) for name, value in tenants_map.items()
    }
    digest = hashlib.sha256(raw).hexdigest()
    version = f"{label}+{digest[:12]}" if label else digest[:12]
    document = RulesetDocument(
        version=version,
        digest=digest,
        source=source,
        rules=rules,
        hold_back_chars=_bounded_int(top, "hold_back_chars", DEFAULT_HOLD_BACK_CHARS, 0, MAX_HOLD_BACK_CHARS),
        audit_store_text=bool(_bool(top, "audit_store_text")),
        tenants=tenants,
    )
    check_streamable(document.for_tenant(""), "")
    for name in tenants:
        check_streamable(document.for_tenant(name), f" (tenant {name!r})")
    return document
