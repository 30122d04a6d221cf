"""Admission control: a bounded number of generations in flight, each holding a slot.

Only :class:`~gateway.pipeline.ChatPipeline` acquires slots, and the request it
prepared gives its slot back: ``complete()`` in its ``finally``, a streamed request
through the :class:`SlotStream` that owns it from the moment it is made. The front
ends (HTTP routes, the gRPC servicer) never touch a slot.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Iterator
from typing import Generic, Self, TypeVar

from services.runtime.errors import Unavailable

T = TypeVar("T")


class Slot:
    """One admitted generation's place; giving it back more than once is harmless."""

    __slots__ = ("_admission", "held")

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self.held = True

    def release(self) -> None:
        # Several paths may end one request (its stream ending, then the response closing it):
        # the first gives the slot back, the others find nothing to give.
        if self.held:
            self.held = False
            self._admission._give_back()


class Admission:
    """Bounded in-flight generations: one more is shed with 503 + Retry-After, never queued."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._inflight = 0

    @property
    def inflight(self) -> int:
        return self._inflight

    def acquire(self, count: int = 1) -> list[Slot]:
        """``count`` slots, all or none (a batch of prompts is admitted whole or not at all)."""
        if self._inflight + count > self.limit:
            raise Unavailable("the gateway is at capacity; retry shortly", retry_after_s=1.0)
        self._inflight += count
        return [Slot(self) for _ in range(count)]

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """One slot for the ``with`` block (a call that is not streamed, e.g. embeddings)."""
        (slot,) = self.acquire()
        try:
            yield
        finally:
            slot.release()

    def _give_back(self) -> None:
        self._inflight -= 1


class SlotStream(Generic[T]):
    """A generation's messages, holding its slot from the moment the stream is made.

    The slot is given back once the messages end, fail or are cancelled, or the stream is
    closed, whether it was ever started or not. An async generator alone cannot promise the
    last case (one never started never runs its ``finally``), which is why this is a class:
    whoever holds the stream closes it (``aclose`` or ``async with``) and that is enough.
    """

    def __init__(self, messages: AsyncGenerator[T, None], slot: Slot) -> None:
        self._messages = messages
        self._slot = slot

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> T:
        try:
            return await anext(self._messages)
        except BaseException:
            # The end, an error or a cancellation: the generator has finished (its own finally
            # ran), so closing costs nothing and gives the slot back now, not when closed.
            await self.aclose()
            raise

    async def aclose(self) -> None:
        try:
            await self._messages.aclose()
        finally:
            self._slot.release()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
