"""Many streamed generations over one call (``GenerateStreams``), free of gRPC.

A gateway streaming to many clients at once used to hold one ``GenerateStream`` call per
answer: one gRPC message per token per answer on this hop, and grpc.aio's work per message
(the poller thread's hand-off, the event loop's wake-ups, the interceptors) was most of what
the inference front end and the gateway spent per token. At concurrency the engine finishes a
token of every running answer in the same decode step and vLLM's output handler hands them to
their generators in the same turn of the event loop; here they are collected and leave as one
message.

:class:`StreamSet` runs each stream as a task of its own (with the request context its order
carried: request id, deadline, traceparent), exactly as ``GenerateStream`` would run it, and
queues what it yields as :class:`Part`\\ s. :meth:`StreamSet.batches` hands out everything
queued whenever its consumer wakes up: the parts produced in the turn that woke it (the
consumer runs one turn after the first producer, so every producer of that turn has run), and,
while the consumer is still writing the previous batch, all that came meanwhile. A stream's
error (a bad request, a full engine, its deadline) ends only that stream, as the part that
carries it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from services.runtime import context as rc
from services.runtime.errors import InvalidArgument, ResourceExhausted
from services.runtime.interceptors import stream_span
from services.runtime.tasks import cancel_and_wait

R = TypeVar("R")
T = TypeVar("T")

SPAN_NAME = "llmesh.v1.InferenceService/GenerateStreams.stream"
DEADLINE_GRACE_S = 0.05


@dataclass(slots=True)
class Part(Generic[T]):
    """One stream's next chunk, or its end (``error`` None: it ended well)."""

    stream: int
    chunk: T | None = None
    end: bool = False
    error: BaseException | None = None
    # The stream's request id (an INTERNAL error names it, as GenerateStream's status would).
    request_id: str = ""


@dataclass(slots=True)
class StreamStart(Generic[R]):
    """An order to open a stream, with what GenerateStream takes from metadata."""

    stream: int
    request: R
    request_id: str = ""
    timeout_ms: int = 0
    traceparent: str = ""


class StreamSet(Generic[R, T]):
    """The streams of one ``GenerateStreams`` call (module doc); ``open_stream`` is what
    ``GenerateStream`` runs for one request (the engine's ``generate_stream``)."""

    def __init__(
        self, open_stream: Callable[[R], AsyncIterator[T]], max_open: int, max_queued: int = 65_536
    ) -> None:
        self._open_stream = open_stream
        self._max_open = max_open
        # Producers wait while this many parts are queued (a caller that stopped reading).
        self._max_queued = max_queued
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._outbox: list[Part[T]] = []
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._closing = False
        self._failed: BaseException | None = None

    @property
    def open_streams(self) -> int:
        return len(self._tasks)

    def start(self, order: StreamStart[R]) -> None:
        """Opens a stream; a refused order ends it at once with its error."""
        stream = order.stream
        if stream in self._tasks:
            self.cancel(stream)
            self._put(Part(stream, end=True, error=InvalidArgument(f"stream {stream} is already open")))
            return
        if len(self._tasks) >= self._max_open:
            self._put(
                Part(
                    stream,
                    end=True,
                    error=ResourceExhausted(
                        f"this call already has {self._max_open} open streams "
                        "(LLMESH_INFERENCE_MAX_STREAMS_PER_CALL)",
                        retry_after_s=1.0,
                    ),
                )
            )
            return
        try:
            ctx = rc.new_context(
                request_id=rc.request_id_value(order.request_id) if order.request_id else rc.new_request_id(),
                deadline=time.monotonic() + order.timeout_ms / 1000 if order.timeout_ms else None,
                traceparent=order.traceparent or None,
            )
        except InvalidArgument as exc:
            self._put(Part(stream, end=True, error=exc))
            return
        # The task runs in a copy of this context; its own request context is set inside it.
        self._tasks[stream] = asyncio.get_running_loop().create_task(self._run(stream, order.request, ctx))

    def cancel(self, stream: int) -> None:
        """The caller gave up on the stream: its engine request is aborted, no part follows."""
        task = self._tasks.pop(stream, None)
        if task is not None:
            task.cancel()

    async def _run(self, stream: int, request: R, ctx: rc.RequestContext) -> None:
        rc.activate(ctx)
        remaining = ctx.time_remaining()
        try:
            # The stream's deadline, as grpc enforces a call's (the engine's own check of the
            # same deadline, with its clearer message, normally comes first).
            async with asyncio.timeout(None if remaining is None else remaining + DEADLINE_GRACE_S):
                with stream_span(SPAN_NAME, ctx.traceparent):
                    chunks = self._open_stream(request)
                    async with contextlib.aclosing(chunks):  # type: ignore[type-var]
                        async for chunk in chunks:
                            if not self._room.is_set():
                                await self._room.wait()
                            self._put(Part(stream, chunk=chunk))
            part: Part[T] = Part(stream, end=True)
        except asyncio.CancelledError:
            if self._tasks.get(stream) is asyncio.current_task():
                raise  # the whole set closes
            return  # cancelled by its order: the caller forgot the stream already
        except Exception as exc:  # every error ends only its stream, as its status
            part = Part(stream, end=True, error=exc, request_id=ctx.request_id)
        if self._tasks.get(stream) is asyncio.current_task():
            del self._tasks[stream]
            self._put(part)

    def _put(self, part: Part[T]) -> None:
        self._outbox.append(part)
        self._wake.set()
        if len(self._outbox) >= self._max_queued:
            self._room.clear()

    def fail(self, error: BaseException) -> None:
        """The orders broke (a message that did not parse): :meth:`batches` raises ``error``."""
        self._failed = error
        self._wake.set()

    def close_orders(self) -> None:
        """The caller sent its last order: :meth:`batches` ends once every stream has."""
        self._closing = True
        self._wake.set()

    async def batches(self) -> AsyncIterator[list[Part[T]]]:
        """Everything queued since the previous batch, until the orders are closed and every
        stream has ended."""
        while True:
            if self._failed is not None:
                raise self._failed
            if not self._outbox:
                if self._closing and not self._tasks:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            batch, self._outbox = self._outbox, []
            self._room.set()
            yield batch

    async def close(self) -> None:
        """Cancels every open stream (the call ended) and waits for their tasks."""
        tasks, self._tasks = list(self._tasks.values()), {}
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def serve(
    requests: AsyncIterator[Any],
    streams: StreamSet[R, T],
    orders: Callable[[Any], list[StreamStart[R] | int]],
) -> AsyncIterator[list[Part[T]]]:
    """One GenerateStreams call: applies the orders of each request message (``orders`` reads
    them: a start, or the number of a stream to cancel) as they come, and gives the batches of
    parts to send. Ends once the caller closed its side and every stream ended; a message that
    did not parse fails the call with its error."""
    follow = asyncio.get_running_loop().create_task(_follow(requests, streams, orders))
    try:
        async for parts in streams.batches():
            yield parts
        await follow
    finally:
        await cancel_and_wait(follow)
        await streams.close()


async def _follow(
    requests: AsyncIterator[Any],
    streams: StreamSet[R, T],
    orders: Callable[[Any], list[StreamStart[R] | int]],
) -> None:
    try:
        async for request in requests:
            for order in orders(request):
                if isinstance(order, int):
                    streams.cancel(order)
                else:
                    streams.start(order)
    except Exception as exc:
        streams.fail(exc)
        raise
    finally:
        streams.close_orders()
