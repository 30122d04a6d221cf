"""Input and output moderation through the policy service.

Policy down means fail closed (503) unless the tenant opted into fail-open, in
which case the request is served unmoderated, and the span and the response say so
(:func:`moderation_skipped`; the pipeline then neither caches it nor keeps it in the session). A block is
data, not an error: the input gate raises :class:`~gateway.errors.PolicyBlocked`
(a 400 naming the rules); the output side reports it so the stream can end with
``finish_reason=content_filter``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import grpc
from llmesh.v1 import common_pb2, policy_pb2, policy_pb2_grpc
from opentelemetry import trace

from gateway.errors import PolicyBlocked
from gateway.local_cache import LocalCopies, digest
from gateway.stages.input_batch import InputBatcher, check_input_call
from gateway.stages.moderation_mux import Lane, ModerationMux, Unsupported, broken
from services.runtime import context as rc
from services.runtime import namespaces
from services.runtime.errors import Unavailable
from services.runtime.versions import version_key

log = logging.getLogger(__name__)

BLOCK = policy_pb2.POLICY_ACTION_BLOCK
REDACT = policy_pb2.POLICY_ACTION_REDACT
# google.rpc codes to grpc's (a multiplexed answer's error comes as a number).
_CODES = {code.value[0]: code for code in grpc.StatusCode}
# Statuses that mean "the policy service could not answer" (fail mode applies).
DOWN = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL})
# The most characters of one word a streamed answer keeps here before the policy service sees them
# (:meth:`StreamModeration.feed`).
WORD_KEPT_CHARS = 32


def _action_name(action: int) -> str:
    return str(policy_pb2.PolicyAction.Name(action)).removeprefix("POLICY_ACTION_").lower()


def _rule_ids(findings: Sequence[policy_pb2.Finding], action: int = BLOCK) -> list[str]:
    return sorted({f.rule_id for f in findings if f.action == action})


def _down(exc: grpc.aio.AioRpcError, fail_open: bool) -> None:
    """Fail open (log and return) or closed (raise Unavailable)."""
    if exc.code() not in DOWN:
        raise exc
    if not fail_open:
        raise Unavailable("the policy service is unavailable; retry shortly", retry_after_s=2.0) from exc
    log.warning("policy service unavailable (%s): serving unmoderated (tenant fails open)", exc.code().name)
    trace.get_current_span().set_attribute("policy.action", "unchecked")
    mark_unmoderated(rc.current())


# An answer served while the policy service was down (fail-open) says so: this key and value are
# the response's trailing metadata over gRPC and its X-Llmesh-Moderation header over HTTP. Such an
# answer is never stored in the response cache nor appended to a session (gateway/pipeline.py).
MODERATION_KEY = "x-llmesh-moderation"
MODERATION_SKIPPED = "skipped"


def mark_unmoderated(ctx: rc.RequestContext) -> None:
    """Records on the request that part of it (input or output) went unmoderated."""
    if not moderation_skipped(ctx):
        ctx.add_trailer(MODERATION_KEY, MODERATION_SKIPPED)


def moderation_skipped(ctx: rc.RequestContext) -> bool:
    return (MODERATION_KEY, MODERATION_SKIPPED) in ctx.extra_trailers


class PolicyGate:
    """The policy service's input check and output moderation (None = policy off)."""

    def __init__(
        self,
        stub: policy_pb2_grpc.PolicyServiceAsyncStub | None,
        *,
        local: LocalCopies[policy_pb2.CheckInputResponse] | None = None,
        verdict_ttl_s: float = 2.0,
        mux: bool = True,
        mux_lane_s: float = 30.0,
        mux_window_s: float = 0.005,
        batch_inputs: bool = True,
        input_calls: int = 2,
        max_checks_per_call: int = 256,
        ahead: bool = True,
    ) -> None:
        self._stub = stub
        # Whether streams take the steps the service offers in advance (StreamModeration).
        self._ahead = ahead
        # Input checks of requests that arrive together in one call (None: one call per check).
        self.batcher: InputBatcher | None = None
        if stub is not None and batch_inputs:
            self.batcher = InputBatcher(stub, input_calls, max_checks_per_call)
        # Streamed answers' moderation over a few shared calls (None: one call per answer).
        self.mux = ModerationMux(stub, mux_lane_s, mux_window_s) if stub is not None and mux else None
        # Input verdicts kept in this process (gateway/local_cache.py), valid while the tenant's
        # "policy" version does not move, and for at most verdict_ttl_s (how long a policy replica
        # may take to adopt a ruleset another one loaded).
        self.local = local
        self._verdict_ttl_ms = int(verdict_ttl_s * 1000)

    @property
    def enabled(self) -> bool:
        return self._stub is not None

    async def check_input(
        self, messages: Sequence[common_pb2.ChatMessage], fail_open: bool, documents: Sequence[str] = ()
    ) -> list[common_pb2.ChatMessage]:
        """The messages to use (redacted where the rules say so); PolicyBlocked on a block."""
        checked, _ = await self.check_request(messages, (), fail_open, documents)
        return checked

    async def check_request(
        self,
        messages: Sequence[common_pb2.ChatMessage],
        tools: Sequence[common_pb2.ToolDefinition],
        fail_open: bool,
        documents: Sequence[str] = (),
    ) -> tuple[list[common_pb2.ChatMessage], list[common_pb2.ToolDefinition]]:
        """The messages and tool definitions to send on, redacted where the rules say so.

        The policy service checks every client text of them (contents, names, tool calls'
        arguments, tool descriptions and schemas); PolicyBlocked on a block, including a
        redaction that would have broken a JSON field.
        """
        if self._stub is None or (not messages and not documents and not tools):
            return list(messages), list(tools)
        request = policy_pb2.CheckInputRequest(messages=messages, documents=documents, tools=tools)
        try:
            reply = await self._check_input(request)
        except grpc.aio.AioRpcError as exc:
            _down(exc, fail_open)
            return list(messages), list(tools)
        span = trace.get_current_span()
        span.set_attribute("policy.action", _action_name(reply.action))
        if reply.action == BLOCK:
            raise PolicyBlocked(_rule_ids(reply.findings))
        if reply.action != REDACT:
            return list(messages), list(tools)
        if len(reply.redacted_messages) != len(messages) or len(reply.redacted_tools) != len(tools):
            # A policy service that cannot say what to send instead: nothing unredacted goes on.
            raise Unavailable("the policy service answered a redaction without the redacted request")
        return list(reply.redacted_messages), list(reply.redacted_tools)

    async def _check_input(self, request: policy_pb2.CheckInputRequest) -> policy_pb2.CheckInputResponse:
        """CheckInput, answered from a kept verdict when one is proven current (module
        gateway/local_cache.py).

        A verdict is kept when the service versions its rulesets (its answer carries a ``policy``
        version) and depends on the tenant's ``policy`` version key: any push of it drops the
        verdict. It carries no version of its own: the trailer echoes the request's floors and
        whatever else the request observed, so it cannot say which ruleset version answered. For
        the same reason a request with a ``policy`` floor is always checked by the service.
        """
        assert self._stub is not None
        local = self.local
        ctx = rc.current()
        if local is None or request.documents or ctx.floor_for(namespaces.POLICY) > 0:
            return (await self._call_input(request))[0]
        key = digest(request.SerializeToString(deterministic=True))
        found = await local.get(ctx.tenant, key, ctx.floor_for, None)
        if found is not None:
            trace.get_current_span().set_attribute("policy.local", True)
            return found[0].value
        mark, t0 = local.watch.mark(), time.monotonic()
        reply, versioned = await self._call_input(request)
        if versioned:
            local.put(
                ctx.tenant,
                key,
                reply,
                stamps={},
                extra_keys=[version_key(ctx.tenant, namespaces.POLICY)],
                mark=mark,
                t0=t0,
                age_ms=0,
                ttl_ms=self._verdict_ttl_ms,
                size=reply.ByteSize() + len(key),
            )
        return reply

    async def _call_input(
        self, request: policy_pb2.CheckInputRequest
    ) -> tuple[policy_pb2.CheckInputResponse, bool]:
        """The service's verdict, batched with other requests' checks where it can be
        (gateway/stages/input_batch.py), and whether it reported the tenant's ``policy`` version
        (which the request then observed)."""
        assert self._stub is not None
        if self.batcher is not None and self.batcher.supported:
            try:
                reply, version = await self.batcher.check(request)
            except Unsupported:
                pass  # an older policy service: per call from now on
            else:
                if version:
                    rc.current().observe(namespaces.POLICY, version)
                return reply, version > 0
        reply, version = await check_input_call(self._stub, request)
        return reply, version > 0

    async def check_output(self, text: str, fail_open: bool) -> OutputVerdict:
        """Whole-answer moderation (non-streamed responses)."""
        if self._stub is None or not text:
            return OutputVerdict(text)
        try:
            reply = await self._stub.CheckOutput(policy_pb2.CheckOutputRequest(text=text))
        except grpc.aio.AioRpcError as exc:
            _down(exc, fail_open)
            return OutputVerdict(text)
        if reply.action == BLOCK:
            return OutputVerdict("", blocked=True, rule_ids=_rule_ids(reply.findings))
        if reply.action == REDACT:
            return OutputVerdict(reply.redacted_text, redacted=True)
        return OutputVerdict(text)

    def stream(self, fail_open: bool) -> StreamModeration:
        return StreamModeration(self._stub, fail_open, self.mux, ahead=self._ahead)

    async def close(self) -> None:
        if self.mux is not None:
            await self.mux.close()
        if self.batcher is not None:
            await self.batcher.close()


@dataclass
class OutputVerdict:
    """A whole answer's moderation: the text to release, and whether it was changed or blocked."""

    text: str
    blocked: bool = False
    rule_ids: list[str] = field(default_factory=list)
    redacted: bool = False


@dataclass(frozen=True)
class Release:
    """What one step of a streamed answer's moderation lets out: ``text`` (redacted where the
    rules say so) stands for the answer's characters ``[start, end)`` as the model wrote them;
    ``redacted`` when it differs from them. Logprobs of those characters go out with it."""

    text: str
    start: int
    end: int
    redacted: bool = False


class StreamModeration:
    """One answer's streamed moderation: feed deltas, get the text safe to release.

    The policy service answers every request message with exactly one response, so
    the exchange runs in lockstep over one bidirectional stream. Each response says how
    many characters it still holds back; the rest of what was fed is what its text
    stands for, which tells the caller which model output (logprobs) may go out with it.
    """

    def __init__(
        self,
        stub: policy_pb2_grpc.PolicyServiceAsyncStub | None,
        fail_open: bool,
        mux: ModerationMux | None = None,
        *,
        ahead: bool = True,
    ) -> None:
        self._stub = stub
        self._fail_open = fail_open
        # Take the steps the service offers for the character after the first word (_take_ahead).
        self._takes_ahead = ahead
        # The gateway's multiplexed calls (gateway/stages/moderation_mux.py); None: a call of its own.
        self._mux = mux
        self._lane: Lane | None = None
        self._number = 0
        self._queue: asyncio.Queue[policy_pb2.CheckOutputStreamRequest | None] = asyncio.Queue()
        self._responses: AsyncIterator[policy_pb2.CheckOutputStreamResponse] | None = None
        self._call: (
            grpc.aio.StreamStreamCall[
                policy_pb2.CheckOutputStreamRequest, policy_pb2.CheckOutputStreamResponse
            ]
            | None
        ) = None
        # The model's text fed but not released yet, and where it starts in the answer.
        self._held = ""
        # Pieces that only continue the word being held, not sent yet (:meth:`feed`).
        self._kept = ""
        self._released_upto = 0
        # The steps the service offered for the next delta's first character (its ahead), and
        # the exchange of a delta that took one, answered at the next call (:meth:`_take_ahead`).
        self._ahead: dict[str, tuple[str, int]] = {}
        self._deferred: asyncio.Future[Release] | None = None
        self.blocked = False
        self.rule_ids: list[str] = []
        self.response_sha256 = ""
        self.finished = False

    async def _requests(self) -> AsyncIterator[policy_pb2.CheckOutputStreamRequest]:
        while True:
            item = await self._queue.get()
            if item is None:
                return
            yield item

    def _release(self, text: str, held_back: int) -> Release:
        """``text`` released, ``held_back`` characters of what was fed still held."""
        held_back = min(max(held_back, 0), len(self._held))
        raw = self._held[: len(self._held) - held_back]
        self._held = self._held[len(raw) :]
        start = self._released_upto
        self._released_upto += len(raw)
        return Release(text, start, self._released_upto, redacted=text != raw)

    async def _exchange(
        self, request: policy_pb2.CheckOutputStreamRequest, fed: str | None = None
    ) -> Release:
        """One step; ``fed``: the text it adds to what is held when not the request's delta."""
        self._held += request.delta if fed is None else fed
        if self._stub is None:
            # Unmoderated (no policy, or failed open): everything fed goes out as written.
            return self._release(self._held, 0)
        if self.finished:
            return self._release("", len(self._held))  # nothing moderates it any more: nothing goes out
        if self._mux is not None and self._mux.supported:
            try:
                return self._step((await self._mux_exchange([request]))[0])
            except Unsupported:
                self._mux, self._lane = None, None  # an older policy service: this answer goes per call
            except grpc.aio.AioRpcError as exc:
                _down(exc, self._fail_open)
                self._stub = None
                return self._release(self._held, 0)
        if self._call is None:
            self._call = self._stub.CheckOutputStream(self._requests())
            self._responses = self._call.__aiter__()
        assert self._responses is not None
        self._queue.put_nowait(request)
        try:
            reply = await self._responses.__anext__()
        except grpc.aio.AioRpcError as exc:
            _down(exc, self._fail_open)
            # Failing open mid-stream: the rest goes out unmoderated, with what the service held.
            self._stub = None
            return self._release(self._held, 0)
        except StopAsyncIteration:
            self.finished = True
            return self._release("", len(self._held))
        return self._step(reply)

    async def _mux_exchange(
        self, requests: list[policy_pb2.CheckOutputStreamRequest]
    ) -> list[policy_pb2.CheckOutputStreamResponse]:
        """The requests' steps over the shared call, in one message, up to the first final one."""
        assert self._mux is not None
        events = [
            policy_pb2.StreamEvent(end=True)
            if request.end
            else policy_pb2.StreamEvent(delta=request.delta, ahead_taken=request.ahead_taken)
            for request in requests
        ]
        first = self._lane is None
        if self._lane is None:
            self._lane, self._number = self._mux.open()
            ctx = rc.current()
            events[0].open.tenant, events[0].open.request_id = ctx.tenant, ctx.request_id
        for event in events:
            event.stream = self._number
        try:
            # The request's deadline, which a call of its own would have carried (interceptors).
            steps = await self._lane.exchange(events, rc.current().time_remaining())
        except TimeoutError:
            self._lane.release(self._number, cancel=True)
            raise broken(
                "moderation passed the request's deadline", grpc.StatusCode.DEADLINE_EXCEEDED
            ) from None
        out: list[policy_pb2.CheckOutputStreamResponse] = []
        for step in steps:
            if step.error_code:
                self._lane.release(self._number, cancel=False)
                raise broken(step.error, _CODES.get(step.error_code, grpc.StatusCode.INTERNAL))
            if first and step.policy_version:
                # What a per-answer call's trailers would have said (services.runtime.interceptors).
                rc.current().observe(namespaces.POLICY, step.policy_version)
            first = False
            out.append(step.step)
            if step.step.final:
                self._lane.release(self._number, cancel=False)
                break
        return out

    def _step(self, reply: policy_pb2.CheckOutputStreamResponse) -> Release:
        self._ahead = {}
        if reply.ahead and not reply.final:  # a block is final
            self._ahead = {
                ch: (a.text, a.held_back)
                for a in reply.ahead
                if len(a.next) == 1
                for ch in a.next + a.more_next  # more_next: characters that take the same step
            }
        if reply.action == BLOCK:
            self.blocked = True
            self.rule_ids = _rule_ids(reply.findings)
            trace.get_current_span().set_attribute("policy.action", "block")
        if reply.final:
            self.finished = True
            self.response_sha256 = reply.response_sha256
            self._queue.put_nowait(None)
        if self.blocked:
            # Nothing that was held is ever released.
            return self._release("", len(self._held))
        return self._release(str(reply.text), 0 if reply.final else reply.held_back)

    async def feed(self, delta: str) -> Release:
        """The text releasable after ``delta`` (maybe empty: held back).

        A piece that only continues the word the policy service is holding ("photo" + "syn")
        waits here for the next piece: the service never cuts inside a word, so it would release
        nothing for it (at most text that a possible match held before the word, one piece
        later), and the piece costs no message and no moderation step."""
        if not delta:
            return Release("", self._released_upto, self._released_upto)
        before = await self._settle()
        if self._continues_word(delta):
            self._kept += delta
            return _joined(before, Release("", self._released_upto, self._released_upto))
        if self._takes_ahead and delta[:1] in self._ahead and not self._kept and self._stub is not None:
            return _joined(before, self._take_ahead(delta))
        delta, self._kept = self._kept + delta, ""
        return _joined(before, await self._exchange(policy_pb2.CheckOutputStreamRequest(delta=delta)))

    def _take_ahead(self, delta: str) -> Release:
        """Releases the step the service offered for the character ``delta`` begins with, now,
        and sends the delta saying so; the service's answer for the rest of it comes with the
        next call (mostly the word after the first, held until the token after it anyway)."""
        text, held_back = self._ahead[delta[0]]
        self._ahead = {}
        self._held += delta[0]
        now = self._release(text, held_back)
        request = policy_pb2.CheckOutputStreamRequest(delta=delta, ahead_taken=True)
        self._deferred = asyncio.ensure_future(self._exchange(request, fed=delta[1:]))
        return now

    async def _settle(self) -> Release | None:
        """What the exchange left running by :meth:`_take_ahead` released (None: none ran)."""
        if self._deferred is None:
            return None
        deferred, self._deferred = self._deferred, None
        return await deferred

    def _continues_word(self, delta: str) -> bool:
        # ASCII letters and digits only: word characters to the policy service's moderator too
        # (policy/stream.py), so no cut point appears between the held text and the piece or
        # inside it.
        if (
            self._stub is None
            or self.finished
            or (self._takes_ahead and not self._released_upto)  # the first word: piece by piece
            or len(self._kept) + len(delta) > WORD_KEPT_CHARS
        ):
            return False
        tail = (self._kept or self._held)[-1:]
        return tail.isascii() and tail.isalnum() and delta.isascii() and delta.isalnum()

    async def finish(self, delta: str) -> list[Release]:
        """The answer's last piece and its end: what :meth:`feed` then :meth:`end` release (the
        second left out when the piece ended the answer). Over the shared call the piece and the
        end travel in one message, so ending an answer costs no round trip of its own."""
        before = await self._settle()
        if before is not None:
            return _first_joined(before, await self.finish(delta))
        text, self._kept = self._kept + delta, ""
        if (
            text
            and self._stub is not None
            and not self.finished
            and self._mux is not None
            and self._mux.supported
        ):
            self._held += text
            try:
                steps = await self._mux_exchange(
                    [
                        policy_pb2.CheckOutputStreamRequest(delta=text),
                        policy_pb2.CheckOutputStreamRequest(end=True),
                    ]
                )
            except Unsupported:
                self._held = self._held[: len(self._held) - len(text)]
                self._mux, self._lane = None, None  # an older policy service: this answer goes per call
            except grpc.aio.AioRpcError as exc:
                _down(exc, self._fail_open)
                self._stub = None
                return [self._release(self._held, 0)]
            else:
                return [self._step(step) for step in steps]
        if not text:
            return [await self.end()]
        first = await self._exchange(policy_pb2.CheckOutputStreamRequest(delta=text))
        if self.finished:
            return [first]
        return [first, await self._exchange(policy_pb2.CheckOutputStreamRequest(end=True))]

    async def end(self) -> Release:
        """Releases the held-back tail."""
        before = await self._settle()
        if before is not None:
            return _joined(before, await self.end())
        if self.finished:
            return Release("", self._released_upto, self._released_upto)
        if self._kept:
            kept, self._kept = self._kept, ""
            first = await self._exchange(policy_pb2.CheckOutputStreamRequest(delta=kept))
            if self.finished:
                return first
            last = await self._exchange(policy_pb2.CheckOutputStreamRequest(end=True))
            return Release(first.text + last.text, first.start, last.end, first.redacted or last.redacted)
        return await self._exchange(policy_pb2.CheckOutputStreamRequest(end=True))

    def close(self) -> None:
        if self._deferred is not None:
            self._deferred.cancel()
            # Nobody waits for it any more: its outcome (cancelled, or the error that ended it)
            # is not news.
            self._deferred.add_done_callback(lambda f: f.cancelled() or f.exception())
            self._deferred = None
        if self._lane is not None:
            self._lane.release(self._number, cancel=not self.finished)
        self._queue.put_nowait(None)
        if self._call is not None and not self.finished:
            self._call.cancel()


def _joined(first: Release | None, second: Release) -> Release:
    """Two releases in a row as one."""
    if first is None:
        return second
    return Release(first.text + second.text, first.start, second.end, first.redacted or second.redacted)


def _first_joined(first: Release, rest: list[Release]) -> list[Release]:
    return [_joined(first, rest[0]), *rest[1:]] if rest else [first]
