"""Input and output moderation through the policy service.

Policy down means fail closed (503) unless the tenant opted into fail-open, in
which case the request is served unmoderated and the span says so. A block is
data, not an error: the input gate raises :class:`~gateway.errors.PolicyBlocked`
(a 400 naming the rules); the output side reports it so the stream can end with
``finish_reason=content_filter``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import grpc
from llmesh.v1 import common_pb2, policy_pb2, policy_pb2_grpc
from opentelemetry import trace

from gateway.errors import PolicyBlocked
from services.runtime.errors import Unavailable

log = logging.getLogger(__name__)

BLOCK = policy_pb2.POLICY_ACTION_BLOCK
REDACT = policy_pb2.POLICY_ACTION_REDACT
# Statuses that mean "the policy service could not answer" (fail mode applies).
DOWN = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL})


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


class PolicyGate:
    """The policy service's input check and output moderation (None = policy off)."""

    def __init__(self, stub: policy_pb2_grpc.PolicyServiceAsyncStub | None) -> None:
        self._stub = stub

    @property
    def enabled(self) -> bool:
        return self._stub is not None

    async def check_input(
        self, messages: Sequence[common_pb2.ChatMessage], fail_open: bool, documents: Sequence[str] = ()
    ) -> list[common_pb2.ChatMessage]:
        """The messages to use (redacted where the rules say so); PolicyBlocked on a block."""
        if self._stub is None or (not messages and not documents):
            return list(messages)
        try:
            reply = await self._stub.CheckInput(
                policy_pb2.CheckInputRequest(messages=messages, documents=documents)
            )
        except grpc.aio.AioRpcError as exc:
            _down(exc, fail_open)
            return list(messages)
        span = trace.get_current_span()
        span.set_attribute("policy.action", _action_name(reply.action))
        if reply.action == BLOCK:
            raise PolicyBlocked(_rule_ids(reply.findings))
        if reply.action == REDACT and len(reply.redacted_messages) == len(messages):
            return list(reply.redacted_messages)
        return list(messages)

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
        return OutputVerdict(reply.redacted_text if reply.action == REDACT else text)

    def stream(self, fail_open: bool) -> StreamModeration:
        return StreamModeration(self._stub, fail_open)


@dataclass
class OutputVerdict:
    text: str
    blocked: bool = False
    rule_ids: list[str] = field(default_factory=list)


class StreamModeration:
    """One answer's streamed moderation: feed deltas, get the text safe to release.

    The policy service answers every request message with exactly one response, so
    the exchange runs in lockstep over one bidirectional stream.
    """

    def __init__(self, stub: policy_pb2_grpc.PolicyServiceAsyncStub | None, fail_open: bool) -> None:
        self._stub = stub
        self._fail_open = fail_open
        self._queue: asyncio.Queue[policy_pb2.CheckOutputStreamRequest | None] = asyncio.Queue()
        self._responses: AsyncIterator[policy_pb2.CheckOutputStreamResponse] | None = None
        self._call: (
            grpc.aio.StreamStreamCall[
                policy_pb2.CheckOutputStreamRequest, policy_pb2.CheckOutputStreamResponse
            ]
            | None
        ) = None
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

    async def _exchange(self, request: policy_pb2.CheckOutputStreamRequest) -> str:
        if self._stub is None or self.finished:
            return "" if request.HasField("end") else request.delta
        if self._call is None:
            self._call = self._stub.CheckOutputStream(self._requests())
            self._responses = self._call.__aiter__()
        assert self._responses is not None
        self._queue.put_nowait(request)
        try:
            reply = await self._responses.__anext__()
        except grpc.aio.AioRpcError as exc:
            _down(exc, self._fail_open)
            # Failing open mid-stream: the rest goes out unmoderated.
            self._stub = None
            return "" if request.HasField("end") else request.delta
        except StopAsyncIteration:
            self.finished = True
            return ""
        if reply.action == BLOCK:
            self.blocked = True
            self.rule_ids = _rule_ids(reply.findings)
            trace.get_current_span().set_attribute("policy.action", "block")
        if reply.final:
            self.finished = True
            self.response_sha256 = reply.response_sha256
            self._queue.put_nowait(None)
        return str(reply.text)

    async def feed(self, delta: str) -> str:
        """The text releasable after ``delta`` (maybe empty: held back)."""
        if not delta:
            return ""
        return await self._exchange(policy_pb2.CheckOutputStreamRequest(delta=delta))

    async def end(self) -> str:
        """Releases the held-back tail."""
        if self.finished:
            return ""
        return await self._exchange(policy_pb2.CheckOutputStreamRequest(end=True))

    def close(self) -> None:
        self._queue.put_nowait(None)
        if self._call is not None and not self.finished:
            self._call.cancel()
