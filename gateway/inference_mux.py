"""Every streamed answer of a replica over one long-lived call (inference ``GenerateStreams``).

A ``GenerateStream`` call per answer costs one gRPC message per token per answer between the
replica and the gateway, and grpc.aio's work per message (the poller thread's hand-off, the
event loop's wake-ups, the interceptors' wrapper) was most of the gateway's CPU per token after
the moderation hop was multiplexed. The replica sends what all its streams produced in one
turn of its loop (one decode step at concurrency) as one message; here the message is split
back into the streams, which wake in the same turn, so their deltas also reach the moderation
mux together.

A :class:`MuxStream` reads like a grpc.aio stream call (:meth:`MuxStream.read` gives the next
message, ``grpc.aio.EOF`` or raises the stream's ``AioRpcError``; :meth:`MuxStream.cancel`
aborts it, and a read waiting then raises ``CancelledError``), so the pool's routing, retry
and resume logic is the same for both. Each stream carries its request id, its deadline
(enforced here too: a replica that stopped answering cannot end the stream by itself) and
its traceparent in its start order.

A :class:`StreamLane` is one call. New streams go to the replica's newest lane; a lane older
than ``lane_max_s`` takes no new ones and closes its request side after its last stream ends
(servers close connections after ``max_connection_age_s``, and a draining replica waits for
its calls), and so does a lane whose replica left the ring. A broken call fails every stream
open on it with the call's error (a lost connection reads as one for each, so their streams
resume elsewhere). A replica without ``GenerateStreams`` (UNIMPLEMENTED) turns the
multiplexing off for that replica: its streams go per call.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import math
from typing import Any

import grpc
from llmesh.v1 import inference_pb2, inference_pb2_grpc
from prometheus_client import Counter

from services.runtime import context as rc
from services.runtime.interceptors import outgoing_traceparent
from services.runtime.lanes import Lane, Lanes
from services.runtime.status import RETRY_AFTER

MESSAGES = Counter(
    "llmesh_gateway_inference_messages_total",
    "Response messages received on the shared inference calls (GenerateStreams).",
)
PARTS = Counter(
    "llmesh_gateway_inference_parts_total",
    "Streams' messages and ends those response messages carried.",
)
_EOF: Any = grpc.aio.EOF


class Unsupported(Exception):
    """The replica has no GenerateStreams: send this stream per call."""


def _status(code: grpc.StatusCode, details: str, retry_after_s: float = 0.0) -> grpc.aio.AioRpcError:
    trailers = (
        grpc.aio.Metadata((RETRY_AFTER, f"{retry_after_s:g}")) if retry_after_s else grpc.aio.Metadata()
    )
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailers, details)


_CODES = {code.value[0]: code for code in grpc.StatusCode}


class MuxStream:
    """One generation on a lane, read like a grpc.aio stream call (module doc)."""

    __slots__ = ("_buffer", "_error", "_lane", "_over", "_timer", "_waiter", "number")

    def __init__(self, lane: StreamLane, number: int, timeout_s: float | None) -> None:
        self._lane = lane
        self.number = number
        self._buffer: collections.deque[Any] = collections.deque()
        self._waiter: asyncio.Future[Any] | None = None
        self._over = False
        self._error: BaseException | None = None
        self._timer = (
            None if timeout_s is None else asyncio.get_running_loop().call_later(timeout_s, self._expire)
        )

    async def read(self) -> Any:
        """The next message, ``grpc.aio.EOF`` after the last, or the stream's error."""
        if self._buffer:
            return self._buffer.popleft()
        if self._error is not None:
            raise self._error
        if self._over:
            return _EOF
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            return await waiter
        finally:
            self._waiter = None

    def cancel(self) -> bool:
        """Aborts the stream (its engine request too); a waiting read raises CancelledError."""
        if self._over:
            return False
        self._end(None)
        self._lane.cancel(self.number)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.cancel()
        return True

    def _deliver(self, part: inference_pb2.StreamPart) -> None:
        if self._over:
            return
        if not part.end:
            item: Any = part.message
        elif part.error_code:
            code = _CODES.get(part.error_code, grpc.StatusCode.UNKNOWN)
            item = _status(code, part.error, part.retry_after_s)
            self._end(item)
        else:
            item = _EOF
            self._end(None)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if isinstance(item, BaseException):
                waiter.set_exception(item)
            else:
                waiter.set_result(item)
        elif item is not _EOF and not isinstance(item, BaseException):
            self._buffer.append(item)

    def _fail(self, error: BaseException) -> None:
        """The lane broke: the stream ends with ``error`` (after what was already delivered)."""
        if self._over:
            return
        self._end(error)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    def _expire(self) -> None:
        if self._over:
            return
        self._lane.cancel(self.number)
        self._fail(_status(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))

    def _end(self, error: BaseException | None) -> None:
        self._over = True
        self._error = error
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._lane.forget(self.number)


class StreamLane(Lane[inference_pb2.GenerateStreamsRequest]):
    """One GenerateStreams call and the streams open on it."""

    def __init__(self, mux: GenerationMux) -> None:
        self._mux = mux
        self._streams: dict[int, MuxStream] = {}
        self._pending: list[inference_pb2.StreamOrder] = []
        self._soon = False
        super().__init__(mux.stub.GenerateStreams)

    def has_open(self) -> bool:
        return bool(self._streams)

    def open(self, request: inference_pb2.GenerateStreamRequest) -> MuxStream:
        ctx = rc.peek()
        remaining = ctx.time_remaining() if ctx is not None else None
        number = next(self._mux.numbers)
        stream = MuxStream(self, number, remaining)
        if self.error is not None:
            stream._fail(self.error)
            return stream
        if remaining is not None and remaining <= 0:
            stream._expire()
            return stream
        self._streams[number] = stream
        self._order(
            inference_pb2.StreamOrder(
                stream=number,
                start=request,
                request_id=ctx.request_id if ctx is not None else "",
                timeout_ms=0 if remaining is None else max(1, math.ceil(remaining * 1000)),
                traceparent=outgoing_traceparent(ctx),
            )
        )
        return stream

    def cancel(self, number: int) -> None:
        if self.error is None:
            self._order(inference_pb2.StreamOrder(stream=number, cancel=True))

    def forget(self, number: int) -> None:
        if self._streams.pop(number, None) is not None and self.retired and not self._streams:
            # Its last stream: the request side ends after what is queued (the flush runs first).
            asyncio.get_running_loop().call_soon(self._close_requests)

    def _order(self, order: inference_pb2.StreamOrder) -> None:
        self._pending.append(order)
        if not self._soon:
            # Orders of this loop turn (answers that started together, cancels) go as one message.
            self._soon = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._soon = False
        orders, self._pending = self._pending, []
        if orders:
            self._send(inference_pb2.GenerateStreamsRequest(orders=orders))

    def _before_close(self) -> None:
        self._flush()

    async def _read(self, call: Any) -> None:
        error: BaseException = _status(grpc.StatusCode.UNAVAILABLE, "the inference replica ended the call")
        streams = self._streams
        try:
            async for reply in call:
                parts = reply.parts
                MESSAGES.inc()
                PARTS.inc(len(parts))
                for part in parts:
                    stream = streams.get(part.stream)
                    if stream is not None:
                        stream._deliver(part)
        except grpc.aio.AioRpcError as exc:
            error = Unsupported() if exc.code() == grpc.StatusCode.UNIMPLEMENTED else exc
        finally:
            self._broken(error)

    def _broken(self, error: BaseException) -> None:
        self.error = error
        self._mux.forget(self)
        if isinstance(error, Unsupported):
            self._mux.supported = False
        streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream._fail(error)
        self._close_requests()


class GenerationMux(Lanes[StreamLane]):
    """One replica's multiplexed generation calls (module doc)."""

    def __init__(self, stub: inference_pb2_grpc.InferenceServiceAsyncStub, lane_max_s: float = 30.0) -> None:
        super().__init__(lane_max_s)
        self.stub = stub
        self.supported = True
        self.numbers = itertools.count(1)

    def _new_lane(self) -> StreamLane:
        return StreamLane(self)

    def open(self, request: inference_pb2.GenerateStreamRequest) -> MuxStream:
        """Starts ``request`` on the newest lane (in the caller's request context)."""
        return self.current().open(request)
