"""Streamed output moderation: deltas in, text that is safe to release out.

The moderator keeps the not-yet-released tail of the answer (``pending``). After
each delta it releases the longest prefix that no output rule can still change:
text before the earliest place a pattern could still match if more text came
(``Detector.pending_start``), moved back so that no word, grapheme or complete
match is cut. Matches inside the released text are redacted with the request's
placeholders; a block ends the stream without releasing the text that triggered it.

The start of a possible match of a redacting or blocking rule is never released.
The ruleset guarantees every such rule's longest match fits the hold-back bound
(:func:`policy.rules.check_streamable`); if a match grows past it anyway (a pattern
longer than its declared ``max_span``), a blocking rule blocks the stream and a
redacting one opens a *swallowed span*: the text from the match's start is never
released, and once no match inside the span can grow any more, the span (widened
over any match that straddles its end) goes out as one placeholder. Only text that
no rule holds, an unbroken token longer than ``WORD_HOLD_CHARS`` or a flag rule's
match, is released at the bound instead of whole.

Rules see the normalized text too (:func:`policy.normalize.normalized`), as in
:mod:`policy.engine`: matches and possible starts found there are mapped back to the
answer's characters, and a spaced-out word that the next delta could still extend
("... b o m") is held like a possible match, up to the bound.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import string
from dataclasses import dataclass, field
from typing import cast

from policy.detectors.base import OUTPUT
from policy.detectors.lexical import MaxLengthDetector
from policy.engine import Finding, Redactor, apply_redactions, pending_start_both, scan_both
from policy.normalize import Normalized, normalized
from policy.rules import MAX_HOLD_BACK_CHARS, Action, Rule, Ruleset, Scope
from services.runtime.text import ZWJ, extends_grapheme, is_cjk

# Released text kept for the detectors' look-behinds and context words (PII looks 48 back).
CONTEXT_CHARS = 64
# An unbroken token that no rule holds is released (at a grapheme boundary) past this length
# rather than held whole: word safety is cosmetic, the bound is for the rules.
WORD_HOLD_CHARS = 128
# A swallowed span longer than this blocks the stream: scanning it again per delta would cost
# quadratic time, and no honest answer holds one unbroken secret that long.
MAX_SWALLOWED_CHARS = MAX_HOLD_BACK_CHARS
# Placeholder entity of a swallowed span in which no complete match was found.
SWALLOWED_ENTITY = "REDACTED"


def _word(ch: str) -> bool:
    return (ch.isalnum() or ch == "_") and not is_cjk(ch)


def grapheme_safe(text: str, i: int) -> bool:
    """A cut at ``i`` keeps every grapheme (and every code point) whole."""
    if i <= 0 or i >= len(text):
        return True
    return not extends_grapheme(text[i]) and text[i - 1] != ZWJ


def word_safe(text: str, i: int) -> bool:
    """A cut at ``i`` splits neither a word nor a grapheme (the end of the text is not safe mid-word)."""
    if i <= 0:
        return True
    if i >= len(text):
        # The next delta may continue the word or the grapheme: only whitespace ends one for sure.
        return text[-1].isspace()
    return grapheme_safe(text, i) and not (_word(text[i - 1]) and _word(text[i]))


# Characters that often end an answer's first word ("No," "Sure!" "I'm"): the steps taken if the
# next delta begins with one are offered in advance (StreamModerator.feed). Not "." : it may go
# on into an address or a number, so the default rules hold the word before it anyway.
AHEAD_CHARS = (" ", ",", "!", "'")
# An answer that opens with one mark ("[", "(", '"', "*", "<") goes on with a word: its first step
# also offers a step for each ASCII letter and digit (66 steps in all, ~5 ms of CPU against ~0.3
# for the four). Only on a first step kept in Ruleset.first_steps once it was copied this many
# times: it is taken again then, with those offers, and kept instead; an opening pushed out of
# the kept steps sooner never costs them (no thrashing at 5 ms a step).
OPENING_MARK_AHEAD = tuple(string.ascii_letters + string.digits)
MARK_OFFERS_AFTER = 4
# Offers stop after this many steps of an answer even if nothing is released yet (an answer that
# opens with a long held match would otherwise pay for them on every delta).
AHEAD_STEPS = 4
# An answer's first step depends only on the ruleset and the answer's first delta, and the answers
# of one model open with a handful of deltas ("No", "Sure", "I"): the step, with the offers it
# makes (four more steps, most of an answer's first-step cost), is kept on the ruleset
# (Ruleset.first_steps) for this many (tenant, first delta) pairs and copied instead of taken again
# (a tenant's step is never another tenant's, so its speed tells nobody how other answers began).
# Only deltas up to FIRST_DELTA_CHARS long.
FIRST_STEPS = 256
FIRST_DELTA_CHARS = 64


def _opening_mark(delta: str) -> bool:
    """``delta`` is one ASCII mark that a word may follow at once ("[", "(", '"', "*")."""
    return len(delta) == 1 and delta.isascii() and not delta.isalnum() and not delta.isspace()


@dataclass(frozen=True)
class AheadStep:
    """The step a moderator takes if the next delta begins with ``next``: ``text`` released,
    ``held_back`` characters of what was fed, ``next`` included, still held."""

    next: str
    text: str
    held_back: int
    # More characters whose step this is too (the same text and held_back).
    more: str = ""


@dataclass(frozen=True)
class StreamStep:
    """What to send back after a delta (or at the end)."""

    text: str
    findings: tuple[Finding, ...]
    action: Action
    held_back: int
    final: bool
    response_sha256: str = ""
    # Offered on an answer's first steps while nothing is released (StreamModerator.feed).
    ahead: tuple[AheadStep, ...] = ()


@dataclass
class _Swallowed:
    """Text that grew past the hold-back bound inside a possible match: never released."""

    rule: Rule
    # Released text before the span (the detectors' look-behinds).
    context: str
    text: str
    # text[:decided] is swallowed for sure: a match from inside it was still open that far.
    decided: int
    # Offset of the span's start in the answer.
    offset: int


@dataclass
class StreamModerator:
    """Moderates one streamed answer against the output rules of a ruleset snapshot."""

    ruleset: Ruleset
    redactor: Redactor = field(default_factory=Redactor)
    # Whose answer this is: an answer's first step is copied only from one of the same tenant's.
    tenant: str = ""

    def __post_init__(self) -> None:
        rules = self.ruleset.for_scope(Scope.OUTPUT)
        self._length_rules: list[Rule] = [r for r in rules if isinstance(r.detector, MaxLengthDetector)]
        self._span_rules: list[Rule] = [r for r in rules if not isinstance(r.detector, MaxLengthDetector)]
        # Rules whose matches must never be released: their partial matches are never cut.
        self._removing: list[Rule] = [r for r in self._span_rules if r.action >= Action.REDACT]
        self.bound = self.ruleset.hold_back_chars
        self._pending = ""
        self._context = ""
        self._offset = 0
        self._total = 0
        self._swallowed: _Swallowed | None = None
        self._length_flagged: set[str] = set()
        self.checked = hashlib.sha256()
        self.released = hashlib.sha256()
        self.action = Action.ALLOW
        self.findings: list[Finding] = []
        self.done = False
        self.max_held_back = 0
        # This moderator having taken each offered character after the last step (its ahead).
        self._ahead: dict[str, StreamModerator] = {}
        self._steps = 0

    @property
    def checked_chars(self) -> int:
        return self._total

    def ahead_offered(self, delta: str) -> bool:
        """The last step offered the step that ``delta``'s first character takes."""
        return delta[:1] in self._ahead

    def feed(self, delta: str, *, ahead_taken: bool = False) -> StreamStep:
        """Takes the next piece of the answer; returns what can be released now.

        On an answer's first steps, while none of it is released, a step also says what the
        moderator would release if the next delta began with each of :data:`AHEAD_CHARS`
        (``ahead``: only steps that release text no rule changed). A caller that released such a
        step's text as soon as a delta beginning with its character came passes the delta with
        ``ahead_taken``: that step is taken (exactly as offered), and the step returned is the
        rest of the delta's. The first word of an answer then waits for the token after it, and
        not also for this step's answer."""
        if self.done:
            raise ValueError("the stream has already ended")
        if ahead_taken:
            taken = self._ahead.get(delta[:1])
            if taken is None:
                raise ValueError("ahead_taken on a delta whose first character no offered step begins")
            # A copy: offered steps are shared by the copies of a kept first step (_clone).
            vars(self).update(vars(taken._fork()))
            delta = delta[1:]
            if not delta:
                return self._emit("", [], final=False)
        self._ahead = {}
        key = None
        kept_steps = None
        kept: _FirstStep | None = None
        if self._steps == 0 and self._total == 0 and self.redactor.empty and len(delta) <= FIRST_DELTA_CHARS:
            kept_steps = self.ruleset.first_steps
            key = (self.tenant, delta)
            kept = cast("_FirstStep | None", kept_steps.get(key))  # first_steps holds Any
            if kept is not None:
                kept_steps.move_to_end(key)
                kept.copies += 1
                if not (kept.plain_mark and kept.copies >= MARK_OFFERS_AFTER):
                    vars(self).update(vars(kept.state._clone()))
                    return kept.step
        # An opening mark kept and copied often enough is taken again, offering letters and digits.
        marks = kept is not None and _opening_mark(delta)
        step = self._first_or_next(delta, opening_mark=marks)
        if kept_steps is not None and key is not None:
            kept_steps[key] = _FirstStep(self._clone(), step, plain_mark=_opening_mark(delta) and not marks)
            if len(kept_steps) > FIRST_STEPS:
                kept_steps.popitem(last=False)
        return step

    def _first_or_next(self, delta: str, *, opening_mark: bool = False) -> StreamStep:
        """The step for ``delta``, with offers on an answer's first steps (see :meth:`feed`);
        with ``opening_mark`` (an answer's first delta, one mark, kept), for letters and digits too."""
        self._steps += 1
        step = self._feed(delta)
        if step.final or self._offset or self._swallowed is not None or not self._pending:
            return step
        if self._steps > AHEAD_STEPS:
            return step
        # Offers that release the same text and hold as much go as one AheadStep (``more``).
        offers: dict[tuple[str, int], AheadStep] = {}
        for ch in AHEAD_CHARS + OPENING_MARK_AHEAD if opening_mark else AHEAD_CHARS:
            twin = self._fork()
            after = twin._feed(ch)
            if after.text and not after.findings and not after.final:  # a block is final
                self._ahead[ch] = twin
                alike = offers.get((after.text, after.held_back))
                offers[after.text, after.held_back] = (
                    AheadStep(ch, after.text, after.held_back)
                    if alike is None
                    else dataclasses.replace(alike, more=alike.more + ch)
                )
        return dataclasses.replace(step, ahead=tuple(offers.values())) if offers else step

    def _clone(self) -> StreamModerator:
        """A copy that moves on without changing this one, with its offered steps (never changed:
        a step taken is copied first, :meth:`feed`)."""
        twin = self._fork()
        twin._ahead = dict(self._ahead)
        return twin

    def _fork(self) -> StreamModerator:
        """A copy that moves on without changing this one."""
        twin = copy.copy(self)
        twin.redactor = self.redactor.copy()
        twin.checked = self.checked.copy()
        twin.released = self.released.copy()
        twin.findings = list(self.findings)
        twin._length_flagged = set(self._length_flagged)
        twin._swallowed = None if self._swallowed is None else dataclasses.replace(self._swallowed)
        twin._ahead = {}
        return twin

    def _feed(self, delta: str) -> StreamStep:
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
        self._ahead = {}
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
                if rule.action == Action.BLOCK:
                    return self._block((finding,))
                self.findings.append(finding)
                self.action = max(self.action, rule.action)
        return None

    def _block(self, findings: tuple[Finding, ...]) -> StreamStep:
        self.done = True
        self.action = Action.BLOCK
        held = len(self._pending) + (len(self._swallowed.text) if self._swallowed else 0)
        self._pending = ""
        self._swallowed = None
        self.findings.extend(findings)
        return StreamStep("", findings, Action.BLOCK, held, True, self.released.hexdigest())

    def _pending_starts(self, pending: str, norm: Normalized) -> list[tuple[Rule, int]]:
        """Each span rule's earliest possible match still open, relative to ``pending``."""
        base = len(self._context)
        out: list[tuple[Rule, int]] = []
        for rule in self._span_rules:
            start = pending_start_both(rule.detector, self._context + pending, norm, base)
            if start is not None and start - base < len(pending):
                out.append((rule, max(0, start - base)))
        return out

    def _cut(
        self,
        pending: str,
        matches: list[tuple[Rule, int, int]],
        holds: list[tuple[Rule, int]],
        open_run: int | None = None,
    ) -> int:
        n = len(pending)
        # A flag rule removes nothing: it holds text back at most to the bound.
        hold = min((s if r.action >= Action.REDACT else max(s, n - self.bound) for r, s in holds), default=n)
        if open_run is not None:
            # A spaced-out word still open may join into a match: held like a flag rule's, since
            # only a run longer than the bound (one word of thousands of letters) reaches it.
            hold = min(hold, max(open_run, n - self.bound))
        cut = _clear_of(pending, hold, matches)
        floor = min(hold, n - WORD_HOLD_CHARS)
        if cut < floor:
            # Only word safety holds the text before ``floor`` (a long unbroken token): release it
            # up to a grapheme boundary, never into a match.
            forced = floor
            while forced > cut and not grapheme_safe(pending, forced):
                forced -= 1
            cut = max(cut, _clear_of(pending, forced, matches, words=False))
        return cut

    def _step(self, *, final: bool) -> StreamStep:
        prefix = ""
        findings: list[Finding] = []
        if self._swallowed is not None:
            resolved = self._resolve_swallowed(final)
            if isinstance(resolved, StreamStep):
                return resolved
            if resolved is None:
                return self._emit("", findings, final=False)
            prefix, finding = resolved
            findings.append(finding)
        pending = self._pending
        n = len(pending)
        # Detectors see some released text before the pending one: look-behinds and context
        # checks ("order no. ...") must decide as they would on the whole answer.
        base = len(self._context)
        full = self._context + pending
        norm = normalized(full) if self._span_rules else Normalized(full, full, None, None, None)
        found: list[tuple[Rule, int, int, str, str]] = []
        for rule in self._span_rules:
            # Only matches that begin in the pending text: none of a redacting or blocking rule
            # can begin in released text (its possible start is never released).
            for m in scan_both(rule.detector, full, norm, OUTPUT, base):
                found.append((rule, m.start - base, m.end - base, m.entity_type, m.value))
        # A block fires on a match that is complete: it ends before the text does (or the text ended)
        # and before a spaced-out word that more text could still change.
        settled = n if norm.open_from is None else max(0, min(n, norm.open_from - base))
        blocks = [
            f for f in found if f[0].action == Action.BLOCK and (final or (f[2] < n and f[2] <= settled))
        ]
        if blocks:
            return self._block(tuple(self._finding(r, s, e, t, 1.0) for r, s, e, t, _ in blocks))
        swallow: Rule | None = None
        if final:
            cut = n
        else:
            holds = self._pending_starts(pending, norm)
            spans = [(r, s, e) for r, s, e, _, _ in found]
            open_run = None if norm.open_from is None else max(0, norm.open_from - base)
            cut = self._cut(pending, spans, holds, open_run)
            over = [(r, s) for r, s in holds if r.action >= Action.REDACT and s < n - self.bound]
            if over:
                # A match of a redacting or blocking rule outgrew the bound: never release it.
                rule, start = min(over, key=lambda h: h[1])
                blocking = [r for r, _ in over if r.action == Action.BLOCK]
                if blocking:
                    return self._block(
                        tuple(self._finding(r, start, n, "HOLD_BACK_EXCEEDED", 1.0) for r in blocking)
                    )
                cut = _clear_of(pending, start, spans, words=False)
                swallow = rule
        spans_out: list[tuple[int, int, str, str]] = []
        for rule, start, end, entity, value in found:
            if end > cut:
                continue  # seen again, whole, in a later step (or swallowed)
            finding = self._finding(rule, start, end, entity, 1.0)
            findings.append(finding)
            if rule.action == Action.REDACT:
                spans_out.append((start, end, entity, value))
        text = prefix + apply_redactions(pending[:cut], spans_out, self.redactor)
        self._pending = pending[cut:]
        context = (self._context + pending[:cut])[-CONTEXT_CHARS:]
        self._context = context
        self._offset += cut
        if swallow is not None:
            rest = self._pending
            self._swallowed = _Swallowed(swallow, context, rest, len(rest), self._offset)
            self._pending = ""
        return self._emit(text, findings, final=final)

    def _emit(self, text: str, findings: list[Finding], *, final: bool) -> StreamStep:
        self.released.update(text.encode("utf-8"))
        self.findings.extend(findings)
        self.action = max([self.action, *(f.action for f in findings)])
        # Everything fed that this text does not stand for yet, swallowed text included: the caller
        # maps released text back to the model's characters (and their logprobs) by it.
        held = len(self._pending) + (len(self._swallowed.text) if self._swallowed else 0)
        self.max_held_back = max(self.max_held_back, held)
        if final:
            self.done = True
        return StreamStep(
            text,
            tuple(findings),
            self.action,
            held,
            final,
            self.released.hexdigest() if final else "",
        )

    def _resolve_swallowed(self, final: bool) -> tuple[str, Finding] | StreamStep | None:
        """Extends the swallowed span; (placeholder, finding) once it is closed, None while open."""
        sw = self._swallowed
        assert sw is not None
        sw.text += self._pending
        self._pending = ""
        full = sw.context + sw.text
        base = len(sw.context)
        n = len(sw.text)
        if n > MAX_SWALLOWED_CHARS:
            return self._block((self._finding(sw.rule, 0, n, "HOLD_BACK_EXCEEDED", 1.0, offset=sw.offset),))
        norm = normalized(full)
        if not final:
            for rule in self._removing:
                start = pending_start_both(rule.detector, full, norm, base)
                if start is not None and start - base < sw.decided:
                    sw.decided = n  # a match from inside the span may still grow: all of it goes
                    return None
        matches: list[tuple[Rule, int, int, str, str]] = []
        for rule in self._removing:
            for m in scan_both(rule.detector, full, norm, OUTPUT, base):
                matches.append((rule, m.start - base, m.end - base, m.entity_type, m.value))
        end = sw.decided
        moved = True
        while moved:
            moved = False
            for _, start, stop, _, _ in matches:
                if start < end < stop:
                    end, moved = stop, True
        inside = [m for m in matches if m[1] < end]
        blocks = [m for m in inside if m[0].action == Action.BLOCK]
        if blocks:
            return self._block(
                tuple(self._finding(r, s, e, t, 1.0, offset=sw.offset) for r, s, e, t, _ in blocks)
            )
        # One placeholder for the whole span, named after the match it began with, if it completed.
        first = next((m for m in inside if m[0] is sw.rule and m[1] == 0), None)
        entity, value = (first[3], first[4]) if first else (SWALLOWED_ENTITY, sw.text[:end])
        placeholder = self.redactor.placeholder(entity, value or sw.text[:end])
        finding = self._finding(sw.rule, 0, end, entity, 1.0, offset=sw.offset)
        self._swallowed = None
        self._pending = sw.text[end:]
        self._context = (sw.context + sw.text[:end])[-CONTEXT_CHARS:]
        self._offset = sw.offset + end
        return placeholder, finding

    def _finding(
        self, rule: Rule, start: int, end: int, entity: str, score: float, *, offset: int | None = None
    ) -> Finding:
        at = self._offset if offset is None else offset
        return Finding(
            rule.id,
            rule.detector_name,
            rule.action,
            rule.message,
            entity,
            0,
            at + start,
            at + end,
            score,
        )


@dataclass(slots=True)
class _FirstStep:
    """An answer's first step: the moderator after it (a template, never fed) and the step;
    ``plain_mark``: an opening mark not offered letters and digits yet, copied ``copies`` times."""

    state: StreamModerator
    step: StreamStep
    plain_mark: bool = False
    copies: int = 0


def _clear_of(pending: str, cut: int, matches: list[tuple[Rule, int, int]], *, words: bool = True) -> int:
    """``cut`` moved back until it splits no complete match (and, with ``words``, no word)."""
    while True:
        while cut > 0 and not (word_safe(pending, cut) if words else grapheme_safe(pending, cut)):
            cut -= 1
        moved = False
        for _, start, end in matches:
            if start < cut < end:
                cut = start
                moved = True
        if not moved:
            return cut
