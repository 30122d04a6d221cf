"""A long-lived bidirectional call that many requests share (a *lane*).

The gateway multiplexes streamed answers over a few such calls (policy ``ModerateStreams``,
inference ``GenerateStreams``): each request's messages are orders or events inside the
call's messages, named by a number. This base holds what every lane does the same way: the
call is started outside any request's context (it must not take the first request's
deadline, tenant or trace: :mod:`services.runtime.interceptors` reads them from the context),
its request stream is fed from a queue, and it is retired (no new requests; the request stream
ends once the last open one has) or closed. Subclasses read the responses (:meth:`_read`).
:class:`Lanes` is a client's set of lanes to one server: new requests go to the newest, and a
lane past its age or broken is replaced (so new calls reach servers that joined since).
"""

from __future__ import annotations

import abc
import asyncio
import contextvars
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

from services.runtime.tasks import cancel_and_wait

Req = TypeVar("Req")
L = TypeVar("L", bound="Lane[Any]")


class Lane(abc.ABC, Generic[Req]):
    """One shared bidirectional call: a request queue in, :meth:`_read` out."""

    def __init__(self, open_call: Callable[[AsyncIterator[Req]], Any]) -> None:
        self.started = time.monotonic()
        self.retired = False
        # Set once the call has ended: the lane takes no new requests.
        self.error: BaseException | None = None
        self._closed = False
        self._queue: asyncio.Queue[Req | None] = asyncio.Queue()
        self._reader: asyncio.Task[None] = contextvars.Context().run(self._start, open_call)

    def _start(self, open_call: Callable[[AsyncIterator[Req]], Any]) -> asyncio.Task[None]:
        call = open_call(self._requests())
        return asyncio.get_running_loop().create_task(self._read(call))

    async def _requests(self) -> AsyncIterator[Req]:
        while (message := await self._queue.get()) is not None:
            yield message

    @abc.abstractmethod
    async def _read(self, call: Any) -> None:
        """Reads the call's responses until it ends."""

    @abc.abstractmethod
    def has_open(self) -> bool:
        """Whether requests are still open on the lane (a retired lane closes after the last)."""

    def _send(self, message: Req) -> None:
        if not self._closed:
            self._queue.put_nowait(message)

    def _before_close(self) -> None:
        """Runs once, just before the request stream ends (a last flush)."""

    def retire(self) -> None:
        """No new requests; the request stream ends with the last open one."""
        self.retired = True
        if not self.has_open():
            self._close_requests()

    def _close_requests(self) -> None:
        if not self._closed:
            self._before_close()
            self._closed = True
            self._queue.put_nowait(None)

    async def closed(self) -> None:
        """Returns once the call has ended."""
        await asyncio.shield(self._reader)

    async def close(self) -> None:
        self._close_requests()
        await cancel_and_wait(self._reader)


class Lanes(abc.ABC, Generic[L]):
    """A client's lanes to one server (module doc); subclasses make a lane (:meth:`_new_lane`)."""

    def __init__(self, lane_max_s: float) -> None:
        self.lane_max_s = lane_max_s
        self._lane: L | None = None
        self._lanes: set[L] = set()

    @abc.abstractmethod
    def _new_lane(self) -> L:
        """A new lane (its call starts at once)."""

    def current(self) -> L:
        """The lane for a new request: the newest, unless it is older than ``lane_max_s`` (it is
        retired) or broken."""
        lane = self._lane
        if lane is not None and time.monotonic() - lane.started > self.lane_max_s:
            lane.retire()
            lane = None
        if lane is None or lane.error is not None:
            lane = self._lane = self._new_lane()
            self._lanes.add(lane)
        return lane

    def retire(self) -> None:
        """New requests start a new call (the server left, or its connection changed)."""
        lane, self._lane = self._lane, None
        if lane is not None:
            lane.retire()

    def forget(self, lane: L) -> None:
        """The lane's call ended."""
        self._lanes.discard(lane)
        if self._lane is lane:
            self._lane = None

    async def close(self) -> None:
        lanes, self._lanes, self._lane = list(self._lanes), set(), None
        for lane in lanes:
            await lane.close()
