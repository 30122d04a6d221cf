"""Every streamed answer's moderation over a few long-lived calls (policy ``ModerateStreams``).

One ``CheckOutputStream`` call per answer costs two gRPC messages per token, and most of the
gateway's and the policy service's CPU per streamed token is grpc.aio's work per message, not
moderation. At concurrency the engine produces a token of every answer in the same decode
step, so their deltas reach the gateway within a millisecond or two: here they travel together.
An answer's event is queued; the queue goes out as one request message as soon as every answer
open on the call has its next event queued or in flight (so one answer alone never waits), or
``window_s`` after its first event otherwise (:meth:`Lane._schedule`). The policy answers each
message with one, and each step finds its answer by number.

A *lane* is one call. New answers go to the newest lane; a lane older than ``lane_max_s`` takes
no new answers, and closes its request stream once its last answer ends, so new calls (picked
by the channel's load balancing) reach policy replicas that joined since. A broken call fails
the answers waiting on it with its error, and every answer open on it with UNAVAILABLE on its
next event (the caller's fail-open or fail-closed rule applies, as for a broken per-answer
call); the next answer opens a new lane. A policy service without ``ModerateStreams``
(UNIMPLEMENTED) turns the multiplexing off for good: its answers go per call.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc
from llmesh.v1 import policy_pb2, policy_pb2_grpc
from prometheus_client import Counter

from services.runtime import lanes

log = logging.getLogger(__name__)

MESSAGES = Counter(
    "llmesh_gateway_moderation_messages_total",
    "Request messages sent on the shared moderation calls (ModerateStreams).",
)
EVENTS = Counter(
    "llmesh_gateway_moderation_events_total",
    "Answers' moderation events (deltas, ends, cancels) those messages carried.",
)


class Unsupported(Exception):
    """The policy service has no ModerateStreams: send this answer per call."""


def broken(details: str, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class Lane(lanes.Lane[policy_pb2.ModerateStreamsRequest]):
    """One ModerateStreams call and the answers on it."""

    def __init__(self, mux: ModerationMux) -> None:
        self._mux = mux
        self.open: set[int] = set()
        self.error: grpc.aio.AioRpcError | None = None
        self._pending: list[policy_pb2.StreamEvent] = []
        self._waiting: dict[int, _Waiter] = {}
        self._soon = False
        self._timer: asyncio.TimerHandle | None = None
        super().__init__(mux.stub.ModerateStreams)

    async def _read(
        self,
        call: grpc.aio.StreamStreamCall[
            policy_pb2.ModerateStreamsRequest, policy_pb2.ModerateStreamsResponse
        ],
    ) -> None:
        error = broken("the policy service ended the moderation call")
        try:
            async for reply in call:
                for step in reply.steps:
                    waiter = self._waiting.get(step.stream)
                    if waiter is None:
                        continue  # (an event after its answer's final step: refused, not awaited)
                    waiter.steps.append(step)
                    if len(waiter.steps) == waiter.count or step.error_code or step.step.final:
                        del self._waiting[step.stream]
                        if not waiter.future.done():
                            waiter.future.set_result(waiter.steps)
        except grpc.aio.AioRpcError as exc:
            error = exc
        finally:
            self._fail(error)

    def _fail(self, error: grpc.aio.AioRpcError) -> None:
        self.error = error
        self._mux.forget(self)
        if error.code() == grpc.StatusCode.UNIMPLEMENTED:
            self._mux.supported = False
        waiting, self._waiting = self._waiting, {}
        for waiter in waiting.values():
            if not waiter.future.done():
                if error.code() == grpc.StatusCode.UNIMPLEMENTED:
                    waiter.future.set_exception(Unsupported())
                else:
                    waiter.future.set_exception(error)
        self._close_requests()

    async def exchange(
        self, events: Sequence[policy_pb2.StreamEvent], timeout_s: float | None
    ) -> list[policy_pb2.StreamStep]:
        """Sends delta or end events of one answer in one message and waits for their steps (up
        to the first final or refused one: the policy refuses any event after it); TimeoutError
        after ``timeout_s`` (one timer: this runs once per token of every answer)."""
        if self.error is not None:
            raise broken(f"the moderation call broke: {self.error.details()}")
        loop = asyncio.get_running_loop()
        stream = events[0].stream
        waiter = _Waiter(loop.create_future(), len(events))
        self._waiting[stream] = waiter
        for event in events:
            self.add(event)
        expiry = None if timeout_s is None else loop.call_later(timeout_s, _expire, waiter.future)
        try:
            return await waiter.future
        finally:
            if expiry is not None:
                expiry.cancel()
            self._waiting.pop(stream, None)

    def add(self, event: policy_pb2.StreamEvent) -> None:
        self._pending.append(event)
        self._schedule()

    def _schedule(self) -> None:
        """Flush at the end of this turn when every open answer's next event is queued or in
        flight (none is left to wait for), else at the latest ``window_s`` from now."""
        if not self._pending or self._soon:
            return
        loop = asyncio.get_running_loop()
        if len(self._waiting) >= len(self.open) or self._mux.window_s <= 0:
            self._soon = True
            loop.call_soon(self._flush)
        elif self._timer is None:
            self._timer = loop.call_later(self._mux.window_s, self._flush)

    def _flush(self) -> None:
        self._soon = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        events, self._pending = self._pending, []
        if events and not self._closed:
            self._mux.messages += 1
            self._mux.events += len(events)
            MESSAGES.inc()
            EVENTS.inc(len(events))
            self._send(policy_pb2.ModerateStreamsRequest(events=events))

    def release(self, stream: int, cancel: bool) -> None:
        """The answer is over (``cancel``: the policy is told it was abandoned)."""
        if stream not in self.open:
            return
        self.open.discard(stream)
        if cancel and self.error is None:
            self.add(policy_pb2.StreamEvent(stream=stream, cancel=True))
        else:
            self._schedule()  # one answer fewer to wait for
        if self.retired and not self.open:
            # Its last answer: the request stream ends after what is queued (the flush runs first).
            asyncio.get_running_loop().call_soon(self._close_requests)

    def has_open(self) -> bool:
        return bool(self.open)

    def _before_close(self) -> None:
        self._flush()


@dataclass
class _Waiter:
    """An answer's events in flight: the steps come back in their order, ``count`` at most."""

    future: asyncio.Future[list[policy_pb2.StreamStep]]
    count: int
    steps: list[policy_pb2.StreamStep] = field(default_factory=list)


def _expire(waiter: asyncio.Future[list[policy_pb2.StreamStep]]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class ModerationMux(lanes.Lanes[Lane]):
    """The gateway's multiplexed moderation calls (module doc)."""

    def __init__(
        self, stub: policy_pb2_grpc.PolicyServiceAsyncStub, lane_max_s: float = 30.0, window_s: float = 0.005
    ) -> None:
        super().__init__(lane_max_s)
        self.stub = stub
        self.window_s = window_s
        self.supported = True
        self._ids = itertools.count(1)
        # Request messages and events sent (what the multiplexing saves shows in their ratio).
        self.messages = 0
        self.events = 0

    def open(self) -> tuple[Lane, int]:
        """A lane for a new answer and the answer's number on it."""
        lane = self.current()
        stream = next(self._ids)
        lane.open.add(stream)
        return lane, stream

    def _new_lane(self) -> Lane:
        return Lane(self)
