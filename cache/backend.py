"""The Redis connection: bounded timeouts, errors as UNAVAILABLE, and a health state.

Every Redis call of the cache goes through :meth:`Backend.call` (or runs inside
:meth:`Backend.guard`), so a dead or hung Redis turns into
:class:`~services.runtime.errors.Unavailable` within the connect/read timeouts
instead of hanging the RPC, and flips the health state to not serving. A probe
loop (:meth:`Backend.watch`) pings Redis and flips it back when Redis returns;
the same client reconnects by itself, so recovery needs no restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from services.runtime import redis_client
from services.runtime.errors import Unavailable

log = logging.getLogger(__name__)

T = TypeVar("T")
HealthListener = Callable[[bool], Awaitable[None]]

RETRY_AFTER_S = 1.0


def connect(
    url: str,
    *,
    cluster: bool = False,
    connect_timeout_s: float = 0.25,
    timeout_s: float = 0.5,
    max_connections: int = 256,
) -> Any:
    """A Redis (or Redis Cluster) client with bounded timeouts and no silent retries; ``url`` may
    name a primary through Sentinel (:mod:`services.runtime.redis_client`), not a cluster."""
    if cluster:
        if redis_client.is_sentinel_url(url):
            raise ValueError(
                "a Redis Cluster is addressed by a redis:// URL of one of its nodes, not Sentinel"
            )
        return RedisCluster.from_url(
            url,
            socket_connect_timeout=connect_timeout_s,
            socket_timeout=timeout_s,
            max_connections=max_connections,
        )
    # A blocking pool: a burst of calls queues for a connection (bounded by the timeout)
    # instead of opening a connection storm that times out on a busy host.
    return redis_client.connect(
        url,
        pool_timeout_s=timeout_s,
        socket_connect_timeout=connect_timeout_s,
        socket_timeout=timeout_s,
        max_connections=max_connections,
        retry_on_timeout=False,
        health_check_interval=0,
    )


class Backend:
    """A Redis client plus whether it currently answers."""

    def __init__(self, redis: Any, *, timeout_s: float = 0.5) -> None:
        self.redis = redis
        self.timeout_s = timeout_s
        self.healthy = True
        self._listeners: list[HealthListener] = []

    def on_health_change(self, listener: HealthListener) -> None:
        self._listeners.append(listener)

    async def _set_healthy(self, healthy: bool) -> None:
        if healthy == self.healthy:
            return
        self.healthy = healthy
        log.warning("redis is %s", "back" if healthy else "down")
        for listener in self._listeners:
            await listener(healthy)

    @contextlib.asynccontextmanager
    async def guard(self) -> AsyncIterator[None]:
        """Maps Redis connection failures and timeouts inside the block to Unavailable."""
        try:
            yield
            if not self.healthy:
                await self._set_healthy(True)
        except (RedisConnectionError, RedisTimeoutError, OSError, TimeoutError) as exc:
            await self._set_healthy(False)
            raise Unavailable(f"redis is unavailable: {exc}", retry_after_s=RETRY_AFTER_S) from exc
        except RedisError as exc:
            # A server-side error (OOM with noeviction, a script error) is not a bad request either.
            # READONLY / NOREPLICAS: a Redis Cluster node demoted or cut off from its replicas (a
            # single Redis or Sentinel client raises those as connection errors, above).
            if any(word in str(exc) for word in ("OOM", "LOADING", "MASTERDOWN", "READONLY", "NOREPLICAS")):
                raise Unavailable(f"redis refused the command: {exc}", retry_after_s=RETRY_AFTER_S) from exc
            raise

    async def call(self, awaitable: Awaitable[T]) -> T:
        """Awaits one Redis operation under :meth:`guard` and an overall time bound."""
        async with self.guard():
            # asyncio.timeout, not wait_for: the same bound without a task of its own per call.
            async with asyncio.timeout(self.timeout_s * 2):
                return await awaitable

    async def probe(self) -> bool:
        """Pings Redis once and updates the health state."""
        try:
            await asyncio.wait_for(self.redis.ping(), self.timeout_s * 2)
        except (RedisError, OSError, TimeoutError):
            await self._set_healthy(False)
            return False
        await self._set_healthy(True)
        return True

    async def watch(self, interval_s: float) -> None:
        """Probes forever (run it as a task; cancel it to stop)."""
        while True:
            await self.probe()
            await asyncio.sleep(interval_s)

    async def close(self) -> None:
        await self.redis.aclose()
