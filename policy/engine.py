"""Checks texts against a ruleset: findings, the strongest action, redacted texts.

Pure CPU work without I/O; :mod:`policy.service` adds the tenant, the audit record
and the versions around it, :mod:`policy.stream` applies the same rules to an
answer as it streams.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from policy.detectors import Match
from policy.detectors.base import DOCUMENT, MESSAGE
from policy.rules import Action, Rule, Ruleset, Scope

DOCUMENT_INDEX = -1


@dataclass(frozen=True, slots=True)
class Finding:
    """One rule that matched, with where it matched."""

    rule_id: str
    detector: str
    action: Action
    message: str
    entity_type: str
    # Index of the message; -1 = a retrieved document (``document_index`` says which).
    message_index: int
    start: int
    end: int
    score: float
    document_index: int = -1
    # Which text of the request: "content", or a path like "tools[0].function.description".
    field: str = ""


@dataclass(frozen=True, slots=True)
class Segment:
    """A text to check: a chat message (or another client text of it), a tool definition's text
    or a retrieved document."""

    text: str
    index: int
    document: bool = False
    # The message's role ("user", "system", ...); "" for documents, tool definitions and answers.
    role: str = ""
    field: str = ""


@dataclass(frozen=True)
class Decision:
    action: Action
    findings: tuple[Finding, ...]
    # Redacted text of each segment that is a message (documents are not returned).
    redacted: tuple[str, ...]
    ruleset_version: str
    text_sha256: str


@dataclass
class Redactor:
    """Placeholders like ``<EMAIL_1>``, the same one for the same value within a request."""

    _by_value: dict[tuple[str, str], str] = field(default_factory=dict)
    _counts: dict[str, int] = field(default_factory=dict)

    def placeholder(self, entity_type: str, value: str) -> str:
        key = (entity_type, value.casefold())
        label = self._by_value.get(key)
        if label is None:
            n = self._counts.get(entity_type, 0) + 1
            self._counts[entity_type] = n
            label = f"<{entity_type}_{n}>"
            self._by_value[key] = label
        return label


def strongest(actions: Iterable[Action]) -> Action:
    return max(actions, default=Action.ALLOW)


def sha256_segments(segments: Sequence[Segment]) -> str:
    """SHA-256 of the checked text: each segment length-prefixed, so boundaries count."""
    h = hashlib.sha256()
    for seg in segments:
        encoded = seg.text.encode("utf-8")
        h.update(f"{'d' if seg.document else 'm'}{len(encoded)}:".encode())
        h.update(encoded)
    return h.hexdigest()


def scan_rule(rule: Rule, text: str, *, document: bool) -> list[Match]:
    return rule.detector.scan(text, DOCUMENT if document else MESSAGE)


def apply_redactions(text: str, spans: Sequence[tuple[int, int, str, str]], redactor: Redactor) -> str:
    """Replaces (start, end, entity, value) spans, skipping any that overlap an earlier one."""
    if not spans:
        return text
    out: list[str] = []
    pos = 0
    for start, end, entity, value in sorted(spans, key=lambda s: (s[0], -(s[1] - s[0]))):
        if start < pos:
            continue
        out.append(text[pos:start])
        out.append(redactor.placeholder(entity, value or text[start:end]))
        pos = end
    out.append(text[pos:])
    return "".join(out)


def check_segments(
    ruleset: Ruleset, scope: Scope, segments: Sequence[Segment], redactor: Redactor | None = None
) -> Decision:
    """Runs every rule of ``scope`` on every segment."""
    redactor = redactor or Redactor()
    rules = ruleset.for_scope(scope)
    findings: list[Finding] = []
    redacted: list[str] = []
    for seg in segments:
        spans: list[tuple[int, int, str, str]] = []
        for rule in rules:
            if not rule.applies_to(seg.role):
                continue
            for m in scan_rule(rule, seg.text, document=seg.document):
                findings.append(
                    Finding(
                        rule_id=rule.id,
                        detector=rule.detector_name,
                        action=rule.action,
                        message=rule.message,
                        entity_type=m.entity_type,
                        message_index=DOCUMENT_INDEX if seg.document else seg.index,
                        start=m.start,
                        end=m.end,
                        score=m.score,
                        document_index=seg.index if seg.document else -1,
                        field=seg.field,
                    )
                )
                if rule.action == Action.REDACT and m.end > m.start:
                    spans.append((m.start, m.end, m.entity_type, m.value))
        if not seg.document:
            redacted.append(apply_redactions(seg.text, spans, redactor))
    return Decision(
        action=strongest(f.action for f in findings),
        findings=tuple(findings),
        redacted=tuple(redacted),
        ruleset_version=ruleset.version,
        text_sha256=sha256_segments(segments),
    )
