"""A streamed generation started beside the response-cache lookup, before its answer is known.

Where nothing but the lookup stands between a request and its generation (no session history,
no retrieval), waiting for the cache to answer MISS before the inference call starts puts the
cache's round trip (the gateway, the cache service and Redis each woken in turn) in front of the
first token. A speculation starts the generation as the lookup leaves for the cache service (with
a policy service: once the input check, which runs beside the lookup, passed the messages
unchanged while the lookup is still out; no engine sees unchecked input) and keeps it only if the
lookup answers that nothing is stored. An operator may trade that last rule for the check's
round trip (``LLMESH_GATEWAY_GENERATE_BEFORE_INPUT_CHECK``): the generation then starts beside
the check on the input as sent, nothing it generates is read before the check passed that input
unchanged, and a block, a redaction or a failed check stops it (outcome ``refused``).

* a hit (or a single-flight follower, which the cache answers as a hit once its leader stored)
  cancels it: the cancel aborts the engine request, usually before the engine has scheduled it;
* a lookup still out ``grace_s`` after the first token arrived cancels it: the lookup may be a
  follower waiting for its leader's whole answer, and the engine must not generate that answer
  a second time meanwhile (single flight exists to save it), only its first few tokens. The
  request then generates after the lookup as it would have without speculation;
* an error of the generation is kept and raised where the stream is read, as it would have been.

:class:`SpeculationGate` decides whether to speculate at all: only while most recent remote
lookups missed and their speculations were used, since every hit (or follower) that
speculated cost an inference call and its cancel.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Generic, TypeVar

from prometheus_client import Counter

T = TypeVar("T")

OUTCOMES = Counter(
    "llmesh_gateway_speculations_total",
    "Generations started beside the cache lookup, by outcome: used (a miss streamed it), hit "
    "(cancelled: the cache answered), late (stopped: the lookup was still out after its first token), "
    "refused (stopped: started before the input check, which blocked or changed that input).",
    ["outcome"],
)


class SpeculationGate:
    """Speculate while the recent remote lookups mostly missed (an exponentially weighted mean
    of the last ~``1 / weight`` outcomes; it starts at "all missed")."""

    def __init__(self, enabled: bool = True, *, min_miss_ratio: float = 0.5, weight: float = 0.05) -> None:
        self.enabled = enabled
        self.min_miss_ratio = min_miss_ratio
        self.weight = weight
        self.miss_ratio = 1.0

    def open(self) -> bool:
        return self.enabled and self.miss_ratio >= self.min_miss_ratio

    def record(self, missed: bool) -> None:
        """One remote lookup's outcome: ``missed`` when the request had to generate and a
        speculation (if one ran) was used."""
        self.miss_ratio += self.weight * ((1.0 if missed else 0.0) - self.miss_ratio)


class Speculation(Generic[T]):
    """A stream's first message read ahead while the lookup is out (see the module doc)."""

    def __init__(self, messages: AsyncGenerator[T, None], grace_s: float = 0.05) -> None:
        self._messages = messages
        self._grace_s = grace_s
        self._lookup_out = True
        self._timer: asyncio.TimerHandle | None = None
        self._closing: asyncio.Task[None] | None = None
        self.abandoned = False
        self._first: asyncio.Task[T | None] = asyncio.ensure_future(self._read_first())
        self._first.add_done_callback(self._arrived)

    async def _read_first(self) -> T | None:
        return await anext(self._messages, None)

    def _arrived(self, _: asyncio.Future[T | None]) -> None:
        if self._lookup_out:
            # Generating while the lookup is out: a follower's lookup answers only when its
            # leader's answer is stored, so the engine stops unless the lookup answers soon.
            self._timer = asyncio.get_running_loop().call_later(self._grace_s, self._give_up)

    def _give_up(self) -> None:
        if self._lookup_out:
            self.abandoned = True
            self._close()

    def _close(self) -> asyncio.Task[None]:
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._messages.aclose())
        return self._closing

    def looked_up(self) -> None:
        """The lookup answered while something else (the input check) still decides: the
        generation runs on without the lookup's grace limit until :meth:`settle` or
        :meth:`cancel`."""
        self._stop_waiting()

    def settle(self) -> bool:
        """The lookup has answered a miss: whether the generation is still running to be used."""
        self._stop_waiting()
        return not self.abandoned

    def _stop_waiting(self) -> None:
        self._lookup_out = False
        if self._timer is not None:
            self._timer.cancel()

    async def cancel(self) -> None:
        """Stops the generation (idempotent): the engine request is aborted."""
        self._stop_waiting()
        self._first.cancel()
        await asyncio.gather(self._first, return_exceptions=True)
        await self._close()

    async def messages(self) -> AsyncIterator[T]:
        """The stream from its first message (an error of the generation is raised here)."""
        try:
            first = await self._first
            if first is None:
                return
            yield first
            async for message in self._messages:
                yield message
        finally:
            await self.cancel()
