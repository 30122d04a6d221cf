"""A stream's engine steps joined into fewer messages (``stream_interval``), free of gRPC.

Every streamed message costs each hop after the engine its work per message: the inference
front end's send, the gateway's read, its moderation exchange with the policy service, its SSE
write, and on a host whose cores the engine shares, the wake-ups of every one of those
processes in the middle of the engine's steps (BENCHMARKS.md, "generation beside the input
check"). With an interval N > 1 a stream's steps go out one by one until the first word is
complete (a non-space followed by whitespace in some choice's text: the step that brings it is
the one that lets a moderating gateway release that word, so the first word reaches the client
as soon as with N = 1), then N steps per message, and the last step at once. In Chinese,
Japanese and Korean text the moderator cuts after every character (services/runtime/text.py),
so there the first word is complete at the first CJK character that another character follows
(not one that attaches to it, such as a combining mark). Other text without spaces (one long
URL, a token of code) has no word end: those streams go step by step throughout. Tokens, text,
logprobs and token ids are exactly those of N = 1, only in fewer messages; a step that carries a
tool call goes in a message of its own (after what was held), so tool-call deltas are never
merged.

Under load the messages per token matter most (every answer's hop work at every step, on cores
the engine shares) and a later token's few steps of delay matter least: while the replica has
``busy`` streams running (``LLMESH_INFERENCE_BUSY_STREAMS``), every stream goes every
``busy_interval`` steps at least (``LLMESH_INFERENCE_BUSY_STREAM_INTERVAL``), its first word
still step by step; when the load falls the stream's own interval applies again.

Every stream of the engine sends on the same steps: a held message also goes when the engine's
step count (``clock``, counted as vLLM reports each step's outputs) is a multiple of N, so at
concurrency the answers' messages of one step travel together in the multiplexed call's message
and the steps between carry only first words and ends. A stream never holds more than N steps,
whatever the clock says.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from services.inference.types import Choice, StreamChunk
from services.runtime.text import extends_grapheme, is_cjk

_WORD_DONE = re.compile(r"\S\s")


def first_word_done(text: str, start: int = 0) -> bool:
    """Whether ``text`` (a choice's text so far) completes its first word at or after ``start``:
    whitespace after a non-space, or a CJK character followed by one that does not attach to it
    (module doc). ``start`` skips what an earlier call saw (its last character is read again)."""
    start = max(0, start - 1)
    if _WORD_DONE.search(text, start):
        return True
    return any(is_cjk(text[i]) and not extends_grapheme(text[i + 1]) for i in range(start, len(text) - 1))


class Coalescer:
    """Feed a stream's chunks in order to :meth:`add`; send what it returns (module doc)."""

    def __init__(
        self,
        interval: int,
        clock: Callable[[], int] | None = None,
        busy: Callable[[], bool] | None = None,
        busy_interval: int = 1,
    ) -> None:
        self.interval = interval
        self._clock = clock
        # Under load (``busy()``) the interval is at least ``busy_interval`` (module doc).
        self._busy = busy if busy is not None and busy_interval > interval else None
        self._busy_interval = busy_interval
        # Text so far of each choice whose first word is not complete yet; the choices done.
        self._heads: dict[int, str] = {}
        self._done: set[int] = set()
        self._first_word = interval > 1 or self._busy is not None
        self._held: StreamChunk | None = None
        self._steps = 0

    def add(self, chunk: StreamChunk) -> list[StreamChunk]:
        """The messages to send now (none while ``chunk`` is held)."""
        interval = self.interval
        if self._busy is not None and self._busy():
            interval = self._busy_interval
        if self._first_word:
            self._first_word = self._still_first_word(chunk)
            return [chunk]
        if interval <= 1:
            # (What a busy spell held goes first.)
            return [chunk] if self._held is None else [*self.flush(), chunk]
        if any(d.tool_calls for d in chunk.deltas):
            return [*self.flush(), chunk]
        if self._held is None:
            self._held, self._steps = chunk, 1
        else:
            _merge(self._held, chunk)
            self._steps += 1
        if (
            self._steps >= interval
            or (self._clock is not None and self._clock() % interval == 0)
            or chunk.usage is not None
            or any(d.finish_reason for d in chunk.deltas)
        ):
            return self.flush()
        return []

    def flush(self) -> list[StreamChunk]:
        """What is held (the stream ended without a last step, or a tool call comes next)."""
        if self._held is None:
            return []
        held, self._held, self._steps = self._held, None, 0
        return [held]

    def _still_first_word(self, chunk: StreamChunk) -> bool:
        """Whether, after ``chunk``, some choice's first word is still incomplete."""
        for delta in chunk.deltas:
            if delta.index in self._done:
                continue
            before = self._heads.pop(delta.index, "")
            head = before + delta.text
            # A choice whose first word is done, or that ended, waits for no more steps.
            if first_word_done(head, len(before)) or delta.finish_reason or delta.tool_calls:
                self._done.add(delta.index)
            else:
                self._heads[delta.index] = head
        return bool(self._heads)


def _merge(into: StreamChunk, chunk: StreamChunk) -> None:
    """``chunk``'s deltas appended to ``into``'s, choice by choice; its usage and timings kept."""
    by_index = {d.index: d for d in into.deltas}
    for delta in chunk.deltas:
        held = by_index.get(delta.index)
        if held is None:
            into.deltas.append(delta)
            by_index[delta.index] = delta
            continue
        _extend(held, delta)
    if chunk.usage is not None:
        into.usage = chunk.usage
    if chunk.timings is not None:
        into.timings = chunk.timings


def _extend(held: Choice, delta: Choice) -> None:
    held.text += delta.text
    held.logprobs.extend(delta.logprobs)
    held.token_ids.extend(delta.token_ids)
    if delta.finish_reason:
        held.finish_reason = delta.finish_reason
        held.stop_reason = delta.stop_reason
