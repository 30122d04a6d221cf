"""Output moderation of every field of a choice that carries model text: its text, the logprobs of
its tokens and its tool calls (names and arguments), whole or as the choice streams.

* Text: ``CheckOutput`` on a whole choice, ``CheckOutputStream`` as it streams
  (:class:`~gateway.stages.policy.StreamModeration`).
* Logprobs: a token's entry (and its ``top_logprobs``) spells the text it belongs to, so it goes
  out only with that text. A whole choice whose text or tool calls were redacted, or that was
  blocked, has no logprobs. In a stream a token's entry is held while its text is held back, and
  dropped when the moderation step that released its text redacted anything, or when the choice
  is blocked. Tokens that produced no text yet (a character split across tokens, a tool-call
  parser's buffer) belong to the text that comes next; the tokens of a choice's tool calls wait
  until the calls are moderated.
* Tool calls: the name and the arguments of each call are checked with ``CheckOutput`` once the
  call is whole; a stream holds tool-call deltas back until the choice ends and then sends each
  call whole. A block ends the choice with ``content_filter`` and no calls. Redacted arguments
  are sent redacted when they still parse as JSON (or never did); a redaction that would break
  the JSON blocks the choice instead, and so does any change to a name (a placeholder names no
  function).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from llmesh.v1 import common_pb2

from gateway.answers import merge_tool_calls
from gateway.stages.policy import PolicyGate, Release

CONTENT_FILTER = common_pb2.FINISH_REASON_CONTENT_FILTER


@dataclass
class ToolCallVerdict:
    """Tool calls after moderation: the calls to send (redacted where allowed), or a block."""

    calls: list[common_pb2.ToolCall]
    blocked: bool = False
    redacted: bool = False


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


async def moderate_tool_calls(
    policy: PolicyGate, calls: Sequence[common_pb2.ToolCall], fail_open: bool
) -> ToolCallVerdict:
    """Every call's name and arguments through ``CheckOutput`` (see the module doc)."""
    out: list[common_pb2.ToolCall] = []
    redacted = False
    for call in calls:
        name = await policy.check_output(call.function.name, fail_open)
        if name.blocked or name.text != call.function.name:
            return ToolCallVerdict([], blocked=True)
        arguments = await policy.check_output(call.function.arguments, fail_open)
        if arguments.blocked:
            return ToolCallVerdict([], blocked=True)
        if arguments.redacted:
            if _is_json(call.function.arguments) and not _is_json(arguments.text):
                return ToolCallVerdict([], blocked=True)
            redacted = True
        moderated = common_pb2.ToolCall()
        moderated.CopyFrom(call)
        moderated.function.arguments = arguments.text
        out.append(moderated)
    return ToolCallVerdict(out, redacted=redacted)


def _blocked(index: int) -> common_pb2.Completion:
    return common_pb2.Completion(index=index, finish_reason=CONTENT_FILTER)


async def moderate_choice(
    policy: PolicyGate, choice: common_pb2.Completion, fail_open: bool
) -> common_pb2.Completion:
    """A whole choice with every field moderated; a blocked one ends with ``content_filter`` and
    carries no text, tool calls or logprobs."""
    text = await policy.check_output(choice.text, fail_open)
    if text.blocked:
        return _blocked(choice.index)
    calls = await moderate_tool_calls(policy, choice.tool_calls, fail_open)
    if calls.blocked:
        return _blocked(choice.index)
    out = common_pb2.Completion()
    out.CopyFrom(choice)
    out.text = text.text
    del out.tool_calls[:]
    out.tool_calls.extend(calls.calls)
    if text.redacted or calls.redacted:
        del out.logprobs[:]
    return out


@dataclass
class _Tokens:
    """The logprob entries of one delta and the characters of the answer they spelled."""

    logprobs: list[common_pb2.TokenLogprob]
    start: int
    # None: the tokens produced no text yet; they belong to the text that comes next.
    end: int | None
    # Part of (or before) a tool call: held until the calls are moderated.
    with_tools: bool
    tainted: bool = False


class HeldLogprobs:
    """One streamed choice's logprobs, each let out only with the text it belongs to."""

    def __init__(self) -> None:
        self._held: deque[_Tokens] = deque()
        self._fed = 0

    def add(self, text_chars: int, logprobs: Sequence[common_pb2.TokenLogprob], *, with_tools: bool) -> None:
        """A delta of the model: ``text_chars`` characters of text and its tokens' logprobs;
        ``with_tools`` once the choice has begun tool calls."""
        start = self._fed
        self._fed += text_chars
        for held in self._held:
            held.with_tools = held.with_tools or (with_tools and held.end is None)
            if held.end is None and text_chars:
                held.end = self._fed
        if logprobs:
            self._held.append(_Tokens(list(logprobs), start, self._fed if text_chars else None, with_tools))

    def release(self, step: Release) -> list[common_pb2.TokenLogprob]:
        """The text ``step`` stands for went out: the logprobs due with it (none of redacted text)."""
        if step.redacted:
            for held in self._held:
                if held.end is not None and held.start < step.end and held.end > step.start:
                    held.tainted = True
        out: list[common_pb2.TokenLogprob] = []
        while self._held:
            first = self._held[0]
            if first.end is None or first.end > step.end or first.with_tools:
                break
            self._held.popleft()
            if not first.tainted:
                out.extend(first.logprobs)
        return out

    def finish(self, released_upto: int, *, clean: bool) -> list[common_pb2.TokenLogprob]:
        """The choice ended with its text released up to ``released_upto``: what is still held,
        unless its tool calls were changed (``clean`` false) or its text never went out."""
        out: list[common_pb2.TokenLogprob] = []
        if clean:
            for held in self._held:
                if not held.tainted and (held.end is None or held.end <= released_upto):
                    out.extend(held.logprobs)
        self._held.clear()
        return out


class ChoiceStream:
    """One streamed choice: the model's deltas in, the deltas that may be sent out.

    Owns its text moderation stream; :meth:`close` ends it.
    """

    def __init__(self, index: int, policy: PolicyGate, fail_open: bool) -> None:
        self.index = index
        self._policy = policy
        self._fail_open = fail_open
        self._text = policy.stream(fail_open)
        self._logprobs = HeldLogprobs()
        self._calls: dict[int, common_pb2.ToolCall] = {}
        self.blocked = False
        self.done = False

    async def feed(self, delta: common_pb2.CompletionDelta) -> common_pb2.CompletionDelta:
        """What to send for ``delta`` (maybe nothing: held back); the last one has the finish reason."""
        piece = common_pb2.CompletionDelta(index=self.index)
        if self.done:
            return piece
        merge_tool_calls(self._calls, delta.tool_calls)
        self._logprobs.add(len(delta.text), delta.logprobs, with_tools=bool(self._calls))
        if delta.finish_reason:
            steps = await self._text.finish(delta.text)
        else:
            steps = [await self._text.feed(delta.text)]
        piece.text = "".join(step.text for step in steps)
        if self._text.blocked:
            return self._block(piece)
        for step in steps:
            piece.logprobs.extend(self._logprobs.release(step))
        if not delta.finish_reason:
            return piece
        calls = await moderate_tool_calls(
            self._policy, [self._calls[i] for i in sorted(self._calls)], self._fail_open
        )
        if calls.blocked:
            return self._block(piece)
        piece.tool_calls.extend(calls.calls)
        piece.logprobs.extend(self._logprobs.finish(steps[-1].end, clean=not calls.redacted))
        piece.finish_reason = delta.finish_reason
        piece.stop_reason = delta.stop_reason
        self.done = True
        return piece

    def _block(self, piece: common_pb2.CompletionDelta) -> common_pb2.CompletionDelta:
        """Ends the choice: text already released stays out, nothing else of it ever goes out."""
        self.blocked = self.done = True
        del piece.logprobs[:]
        piece.finish_reason = CONTENT_FILTER
        return piece

    def close(self) -> None:
        self._text.close()
