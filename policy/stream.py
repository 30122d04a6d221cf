"""Streamed output moderation: deltas in, text that is safe to release out.

The moderator keeps the not-yet-released tail of the answer (``pending``). After
each delta it releases the longest prefix that no output rule can still change:
text before the earliest place a pattern could still match if more text came
(``Detector.pending_start``), moved back so that no word, grapheme or complete
match is cut. The tail it keeps never exceeds the ruleset's hold-back bound; when
a single unbroken token is longer than the bound, the bound wins (the token is
released at a grapheme boundary) and the step says so through ``held_back``.
Matches inside the released text are redacted with the request's placeholders; a
block ends the stream without releasing the text that triggered it.
"""

from __future__ import annotations

import hashlib
import unicodedata
from dataclasses import dataclass, field

from policy.detectors.base import MESSAGE
from policy.detectors.lexical import MaxLengthDetector
from policy.engine import Finding, Redactor, apply_redactions
from policy.rules import Action, Rule, Ruleset, Scope

_ZWJ = "\u200d"
# Released text kept for the detectors' look-behinds and context words (PII looks 48 back).
CONTEXT_CHARS = 64


def _is_cjk(ch: str) -> bool:
    o = ord(ch)
    return (
        0x3040 <= o <= 0x30FF  # kana
        or 0x3400 <= o <= 0x4DBF
        or 0x4E00 <= o <= 0x9FFF
        or 0xAC00 <= o <= 0xD7AF  # hangul
        or 0xF900 <= o <= 0xFAFF
        or 0x20000 <= o <= 0x2FFFF
    )


def _word(ch: str) -> bool:
    return (ch.isalnum() or ch == "_") and not _is_cjk(ch)


def _extends(ch: str) -> bool:
    """True if ``ch`` belongs to the grapheme before it (combining mark, ZWJ, variation selector)."""
    o = ord(ch)
    return (
        unicodedata.combining(ch) != 0
        or ch == _ZWJ
        or 0xFE00 <= o <= 0xFE0F
        or 0xE0100 <= o <= 0xE01EF
        or 0x1F3FB <= o <= 0x1F3FF  # skin tone modifiers
        or unicodedata.category(ch) in ("Mn", "Me", "Mc")
    )


def grapheme_safe(text: str, i: int) -> bool:
    """A cut at ``i`` keeps every grapheme (and every code point) whole."""
    if i <= 0 or i >= len(text):
        return True
    return not _extends(text[i]) and text[i - 1] != _ZWJ


def word_safe(text: str, i: int) -> bool:
    """A cut at ``i`` splits neither a word nor a grapheme (the end of the text is not safe mid-word)."""
    if i <= 0:
        return True
    if i >= len(text):
        # The next delta may continue the word or the grapheme: only whitespace ends one for sure.
        return text[-1].isspace()
    return grapheme_safe(text, i) and not (_word(text[i - 1]) and _word(text[i]))


@dataclass(frozen=True)
class StreamStep:
    """What to send back after a delta (or at the end)."""

    text: str
    findings: tuple[Finding, ...]
    action: Action
    held_back: int
    final: bool
    response_sha256: str = ""


@dataclass
class StreamModerator:
    """Moderates one streamed answer against the output rules of a ruleset snapshot."""

    ruleset: Ruleset
    redactor: Redactor = field(default_factory=Redactor)

    def __post_init__(self) -> None:
        rules = self.ruleset.for_scope(Scope.OUTPUT)
        self._length_rules: list[Rule] = [r for r in rules if isinstance(r.detector, MaxLengthDetector)]
        self._span_rules: list[Rule] = [r for r in rules if not isinstance(r.detector, MaxLengthDetector)]
        self.bound = self.ruleset.hold_back_chars
        self._pending = ""
        self._context = ""
        self._offset = 0
        self._total = 0
        self._length_flagged: set[str] = set()
        self.checked = hashlib.sha256()
        self.released = hashlib.sha256()
        self.action = Action.ALLOW
        self.findings: list[Finding] = []
        self.done = False
        self.max_held_back = 0

    @property
    def checked_chars(self) -> int:
        return self._total

    def feed(self, delta: str) -> StreamStep:
        """Takes the next piece of the answer; returns what can be released now."""
        if self.done:
            raise ValueError("the stream has already ended")
        self.checked.update(delta.encode("utf-8"))
        self._total += len(delta)
        self._pending += delta
        blocked = self._check_length()
        if blocked is not None:
            return blocked
        return self._step(final=False)

    def finish(self) -> StreamStep:
        """No more text: releases everything still held (redacted) and closes."""
        if self.done:
            raise ValueError("the stream has already ended")
        return self._step(final=True)

    def _check_length(self) -> StreamStep | None:
        for rule in self._length_rules:
            detector = rule.detector
            assert isinstance(detector, MaxLengthDetector)
            if self._total > detector.max_chars and rule.id not in self._length_flagged:
                self._length_flagged.add(rule.id)
                finding = Finding(
                    rule.id,
                    rule.detector_name,
                    rule.action,
                    rule.message,
                    "MAX_LENGTH",
                    0,
                    detector.max_chars,
                    self._total,
                    1.0,
                )
                self.findings.append(finding)
                self.action = max(self.action, rule.action)
                if rule.action == Action.BLOCK:
                    return self._block((finding,))
        return None

    def _block(self, findings: tuple[Finding, ...]) -> StreamStep:
        self.done = True
        self.action = Action.BLOCK
        held = len(self._pending)
        self._pending = ""
        return StreamStep("", findings, Action.BLOCK, held, True, self.released.hexdigest())

    def _cut(self, pending: str, matches: list[tuple[Rule, int, int]]) -> int:
        n = len(pending)
        cut = n
        base = len(self._context)
        for rule in self._span_rules:
            start = rule.detector.pending_start(self._context + pending, base)
            if start is not None and start - base < cut:
                cut = max(0, start - base)
        # Never cut a word or a complete match; repeat until nothing straddles the cut.
        while True:
            while cut > 0 and not word_safe(pending, cut):
                cut -= 1
            moved = False
            for _, start, end in matches:
                if start < cut < end:
                    cut = start
                    moved = True
            if not moved:
                break
        floor = n - self.bound
        if cut < floor:
            # The bound wins: release up to a word boundary inside the window, else a grapheme one.
            forced = next((i for i in range(floor, n + 1) if word_safe(pending, i) and i < n), None)
            if forced is None:
                forced = floor
                while forced < n and not grapheme_safe(pending, forced):
                    forced += 1
            cut = forced
            for _, start, end in matches:
                if start < cut < end:
                    cut = end
        return cut

    def _step(self, *, final: bool) -> StreamStep:
        pending = self._pending
        n = len(pending)
        # Detectors see some released text before the pending one: look-behinds and context
        # checks ("order no. ...") must decide as they would on the whole answer.
        base = len(self._context)
        found: list[tuple[Rule, int, int, str, str]] = []
        for rule in self._span_rules:
            # Only matches that begin in the pending text: one that began in released text was decided then.
            for m in rule.detector.scan(self._context + pending, MESSAGE, base):
                found.append((rule, m.start - base, m.end - base, m.entity_type, m.value))
        # A block fires on a match that is complete: it ends before the text does (or the text ended).
        blocks = [f for f in found if f[0].action == Action.BLOCK and (final or f[2] < n)]
        if blocks:
            return self._block(tuple(self._finding(r, s, e, t, 1.0) for r, s, e, t, _ in blocks))
        cut = n if final else self._cut(pending, [(r, s, e) for r, s, e, _, _ in found])
        spans: list[tuple[int, int, str, str]] = []
        step_findings: list[Finding] = []
        for rule, start, end, entity, value in found:
            if end > cut:
                continue  # seen again, whole, in a later step
            finding = self._finding(rule, start, end, entity, 1.0)
            step_findings.append(finding)
            if rule.action == Action.REDACT:
                spans.append((start, end, entity, value))
        text = apply_redactions(pending[:cut], spans, self.redactor)
        self.released.update(text.encode("utf-8"))
        self._pending = pending[cut:]
        self._context = (self._context + pending[:cut])[-CONTEXT_CHARS:]
        self._offset += cut
        self.findings.extend(step_findings)
        self.action = max([self.action, *(f.action for f in step_findings)])
        held = len(self._pending)
        self.max_held_back = max(self.max_held_back, held)
        if final:
            self.done = True
        return StreamStep(
            text,
            tuple(step_findings),
            self.action,
            held,
            final,
            self.released.hexdigest() if final else "",
        )

    def _finding(self, rule: Rule, start: int, end: int, entity: str, score: float) -> Finding:
        return Finding(
            rule.id,
            rule.detector_name,
            rule.action,
            rule.message,
            entity,
            0,
            self._offset + start,
            self._offset + end,
            score,
        )
