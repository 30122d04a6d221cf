"""Checks texts against a ruleset: findings, the strongest action, redacted texts.

Pure CPU work without I/O; :mod:`policy.service` adds the tenant, the audit record
and the versions around it, :mod:`policy.stream` applies the same rules to an
answer as it streams.

Every rule sees the text as written and, where :func:`policy.normalize.normalized` changes
it (zero-width characters, full-width forms, homoglyphs, spaced-out letters), the normalized
text too; matches on the latter are mapped back to the original, merged with the original
matches they overlap, and redaction cuts the original text.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from policy.detectors import Detector, Match
from policy.detectors.base import DOCUMENT, MESSAGE, OUTPUT, ScanContext
from policy.detectors.lexical import MaxLengthDetector
from policy.memo import Matches, ScanMemo
from policy.normalize import Normalized, normalized
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

    def copy(self) -> Redactor:
        """An independent copy (keys and labels are strings: the dicts' copies suffice)."""
        return Redactor(dict(self._by_value), dict(self._counts))

    @property
    def empty(self) -> bool:
        """No placeholder handed out yet."""
        return not self._counts


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


def scan_rule(
    rule: Rule, text: str, *, document: bool, norm: Normalized | None = None, output: bool = False
) -> list[Match]:
    ctx = OUTPUT if output else DOCUMENT if document else MESSAGE
    return scan_both(rule.detector, text, norm or normalized(text), ctx)


def _uses_normalized(detector: Detector, norm: Normalized) -> bool:
    # A length limit counts the characters as sent, not what NFKC expands them to. A detector that
    # sets ``normalizes_text`` folds every text itself (the injection detectors: the forms of
    # ``policy.normalize.variants`` include this one), and running it twice would double the most
    # expensive checks.
    if not norm.changed or isinstance(detector, MaxLengthDetector):
        return False
    return not getattr(detector, "normalizes_text", False)


def scan_both(
    detector: Detector, text: str, norm: Normalized, ctx: ScanContext, start: int = 0
) -> list[Match]:
    """The detector's matches in ``text`` from ``start`` on, and in its normalized form mapped back.

    A normalized match that overlaps original ones replaces them by one match over all their
    spans, with the normalized entity and value (so the same value obfuscated two ways gets one
    placeholder); the others are added.
    """
    found = detector.scan(text, ctx, start)
    if not _uses_normalized(detector, norm):
        return found
    extra: list[Match] = []
    for m in detector.scan(norm.text, ctx, norm.normalized_index(start)):
        first, last = norm.original_span(m.start, m.end)
        value = m.value or norm.text[m.start : m.end]
        extra.append(Match(max(first, start), last, m.entity_type, m.score, value))
    return merge_matches(found, extra)


def merge_matches(found: list[Match], extra: list[Match]) -> list[Match]:
    """``found`` plus ``extra``, each of the latter merged with the matches of ``found`` it overlaps."""
    out = list(found)
    for m in extra:
        overlapping = [
            i
            for i, o in enumerate(out)
            if (o.start < m.end and m.start < o.end) or (o.start, o.end) == (m.start, m.end)
        ]
        if not overlapping:
            out.append(m)
            continue
        group = [out[i] for i in overlapping]
        merged = Match(
            min(m.start, *(o.start for o in group)),
            max(m.end, *(o.end for o in group)),
            m.entity_type,
            max(m.score, *(o.score for o in group)),
            m.value,
        )
        out[overlapping[0]] = merged
        for i in reversed(overlapping[1:]):
            del out[i]
    return out


def pending_start_both(detector: Detector, text: str, norm: Normalized, start: int = 0) -> int | None:
    """:meth:`Detector.pending_start` over ``text`` and its normalized form (original offsets)."""
    found = detector.pending_start(text, start)
    if _uses_normalized(detector, norm):
        at = detector.pending_start(norm.text, norm.normalized_index(start))
        if at is not None:
            mapped = max(start, norm.original_index(at))
            found = mapped if found is None else min(found, mapped)
    return found


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
    ruleset: Ruleset,
    scope: Scope,
    segments: Sequence[Segment],
    redactor: Redactor | None = None,
    *,
    memo: ScanMemo | None = None,
    tenant: str = "",
) -> Decision:
    """Runs every rule of ``scope`` on every segment; with ``memo``, a segment ``tenant`` had
    checked before under this same ruleset is not scanned again (:mod:`policy.memo`)."""
    redactor = redactor or Redactor()
    rules = ruleset.for_scope(scope)
    findings: list[Finding] = []
    redacted: list[str] = []
    for seg in segments:

        def scan(seg: Segment = seg) -> Matches:
            norm = normalized(seg.text)
            return tuple(
                tuple(
                    scan_rule(rule, seg.text, document=seg.document, norm=norm, output=scope == Scope.OUTPUT)
                )
                if rule.applies_to(seg.role)
                else ()
                for rule in rules
            )

        if memo is None:
            per_rule = scan()
        else:
            key = memo.key(tenant, scope.name, seg.role, seg.document, seg.text)
            per_rule = memo.lookup_or_scan(key, ruleset, scan)
        spans: list[tuple[int, int, str, str]] = []
        for rule, matches in zip(rules, per_rule, strict=True):
            for m in matches:
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
