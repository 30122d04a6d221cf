"""A client-side stand-in for a Kubernetes Service / L4 balancer in front of several gateways.

Every ``period_s`` each gateway's ``/readyz`` is polled; a new request goes (round
robin) to a gateway whose latest poll answered 200. A draining gateway answers 503
from its SIGTERM on, so it stops getting new requests while its streams finish. A
connection refused before any byte was sent may be tried on another gateway (what
a balancer does); nothing else is retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools

import httpx

POLL_PERIOD_S = 0.2
POLL_TIMEOUT_S = 2.0


class GatewayBalancer:
    """Chooses a ready gateway for each request from the latest ``/readyz`` of each."""

    def __init__(
        self,
        base_urls: list[str],
        period_s: float = POLL_PERIOD_S,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not base_urls:
            raise ValueError("no gateway to balance over")
        self.base_urls = [u.rstrip("/") for u in base_urls]
        self.period_s = period_s
        self._transport = transport
        self.ready: dict[str, bool] = dict.fromkeys(self.base_urls, False)
        self.refused_retries = 0
        self._changed = asyncio.Event()
        self._turn = itertools.count()
        self._tasks: list[asyncio.Task[None]] = []

    async def _poll(self, url: str) -> None:
        async with httpx.AsyncClient(timeout=POLL_TIMEOUT_S, transport=self._transport) as http:
            while True:
                ok = False
                with contextlib.suppress(httpx.HTTPError):
                    ok = (await http.get(url + "/readyz")).status_code == 200
                if self.ready[url] != ok:
                    self.ready[url] = ok
                    self._changed.set()
                await asyncio.sleep(self.period_s)  # the poll period itself

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._poll(u), name=f"readyz {u}") for u in self.base_urls]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def choose(self, avoid: frozenset[str] = frozenset(), limit_s: float = 60.0) -> str:
        """A ready gateway (not in ``avoid``), waiting for one if none is ready right now."""
        async with asyncio.timeout(limit_s):
            while True:
                ready = [u for u in self.base_urls if self.ready[u] and u not in avoid]
                if ready:
                    return ready[next(self._turn) % len(ready)]
                self._changed.clear()
                await self._changed.wait()

    def refused(self, url: str) -> None:
        """A connection to ``url`` was refused: out of the rotation until its next poll says ready."""
        self.refused_retries += 1
        if self.ready.get(url):
            self.ready[url] = False
            self._changed.set()
