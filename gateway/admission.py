"""Admission control: a bounded number of generations in flight, each holding a slot.

One tenant cannot take every slot: a tenant holds at most its own limit (a tenant's
``max_inflight``), else ``max(1, tenant_share x limit)``; past it the tenant gets 429 while
the others are still admitted.

Only :class:`~gateway.pipeline.ChatPipeline` acquires slots, and the request it
prepared gives its slot back: ``complete()`` in its ``finally``, a streamed request
through the :class:`SlotStream` that owns it from the moment it is made. The front
ends (HTTP routes, the gRPC servicer) never touch a slot.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from typing import Generic, Self, TypeVar

from services.runtime.errors import ResourceExhausted, Unavailable

T = TypeVar("T")


class Slot:
    """One admitted generation's place; giving it back more than once is harmless."""

    __slots__ = ("_admission", "held", "tenant")

    def __init__(self, admission: Admission, tenant: str | None) -> None:
        self._admission = admission
        self.tenant = tenant
        self.held = True

    def release(self) -> None:
        # Several paths may end one request (its stream ending, then the response closing it):
        # the first gives the slot back, the others find nothing to give.
        if self.held:
            self.held = False
            self._admission._give_back(self.tenant)


class Admission:
    """Bounded in-flight generations: one more is shed with 503 + Retry-After, never queued;
    one more than its tenant's share gets 429 + Retry-After."""

    def __init__(self, limit: int, tenant_share: float = 1.0) -> None:
        self.limit = limit
        self.tenant_share = tenant_share
        self._inflight = 0
        # Only tenants holding slots are here: the map is as small as the requests in flight.
        self._by_tenant: dict[str, int] = {}

    @property
    def inflight(self) -> int:
        return self._inflight

    def held_by(self, tenant: str) -> int:
        return self._by_tenant.get(tenant, 0)

    def tenant_limit(self, own: int = 0) -> int:
        """A tenant's bound: its own (``own`` > 0), else its share of the gateway's limit."""
        return own if own > 0 else max(1, int(self.tenant_share * self.limit))

    def acquire(self, count: int = 1, *, tenant: str | None = None, tenant_limit: int = 0) -> list[Slot]:
        """``count`` slots, all or none (a batch of prompts is admitted whole or not at all).

        ``tenant``: whose they are, bounded by :meth:`tenant_limit` of ``tenant_limit``
        (None: counted against the gateway's limit only).
        """
        if self._inflight + count > self.limit:
            raise Unavailable("the gateway is at capacity; retry shortly", retry_after_s=1.0)
        if tenant is not None:
            bound = self.tenant_limit(tenant_limit)
            if self.held_by(tenant) + count > bound:
                raise ResourceExhausted(
                    f"this tenant already has its limit of {bound} requests in flight; retry shortly",
                    retry_after_s=1.0,
                )
        self._inflight += count
        if tenant is not None:
            self._by_tenant[tenant] = self.held_by(tenant) + count
        return [Slot(self, tenant) for _ in range(count)]

    @contextlib.contextmanager
    def slot(self, *, tenant: str | None = None, tenant_limit: int = 0) -> Iterator[None]:
        """One slot for the ``with`` block (a call that is not streamed, e.g. embeddings)."""
        (slot,) = self.acquire(tenant=tenant, tenant_limit=tenant_limit)
        try:
            yield
        finally:
            slot.release()

    def _give_back(self, tenant: str | None) -> None:
        self._inflight -= 1
        if tenant is not None:
            left = self.held_by(tenant) - 1
            if left > 0:
                self._by_tenant[tenant] = left
            else:
                self._by_tenant.pop(tenant, None)


class SlotStream(Generic[T]):
    """A generation's messages, holding its slot from the moment the stream is made.

    The slot is given back once the messages end, fail or are cancelled, or the stream is
    closed, whether it was ever started or not. An async generator alone cannot promise the
    last case (one never started never runs its ``finally``), which is why this is a class:
    whoever holds the stream closes it (``aclose`` or ``async with``) and that is enough.
    """

    def __init__(
        self,
        messages: AsyncGenerator[T, None],
        slot: Slot,
        cleanup: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._messages = messages
        self._slot = slot
        # Also run on close (a generation started for a stream nobody read: gateway/pipeline.py).
        self._cleanup = cleanup

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
            try:
                await self._messages.aclose()
            finally:
                if self._cleanup is not None:
                    await self._cleanup()
        finally:
            self._slot.release()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
