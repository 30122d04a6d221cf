"""Wake-ups for single-flight waiters: one Redis pub/sub subscription per process.

A producer's store (or lease release) publishes the response digest on
:data:`cache.responses.WAKE_CHANNEL` in the same Lua call that writes the entry.
Every cache replica holds one subscription and wakes its local waiters on that
digest, so waiters sleep on a future instead of polling. If the subscription drops
(Redis restarted), everyone waiting is woken to re-check, since messages may have
been lost meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from redis.asyncio.cluster import RedisCluster

from cache.responses import WAKE_CHANNEL
from services.runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)


class Notifier:
    """Dispatches wake-up messages to local waiters by digest."""

    def __init__(self, redis: Any) -> None:
        self._redis = redis
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def start(self) -> None:
        """Starts listening; returns once subscribed (or after the first failed attempt)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="cache-singleflight-notifier")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), 2.0)

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        self._wake_all()

    @property
    def subscribed(self) -> bool:
        return self._ready.is_set()

    def register(self, digest: str) -> asyncio.Future[None]:
        """A future resolved when ``digest`` is stored or released; register before checking."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(digest, set()).add(future)
        return future

    def discard(self, digest: str, future: asyncio.Future[None]) -> None:
        waiters = self._waiters.get(digest)
        if waiters is not None:
            waiters.discard(future)
            if not waiters:
                del self._waiters[digest]

    def waiting(self, digest: str) -> int:
        """How many local callers wait on ``digest`` (tests and metrics)."""
        return len(self._waiters.get(digest, ()))

    def wake(self, digest: str) -> None:
        for future in self._waiters.pop(digest, ()):
            if not future.done():
                future.set_result(None)

    def _on_reconnect(self, connection: Any) -> None:
        del connection
        self._wake_all()

    def _wake_all(self) -> None:
        for digest in list(self._waiters):
            self.wake(digest)

    def _pubsub(self, attempt: int) -> Any:
        """A pub/sub connection. On a cluster, to one node (rotating over the nodes on each
        retry): a plain PUBLISH reaches the subscribers of every node of the cluster."""
        if isinstance(self._redis, RedisCluster):
            nodes = sorted(self._redis.get_nodes(), key=lambda node: node.name)
            return self._redis.pubsub(node=nodes[attempt % len(nodes)], ignore_subscribe_messages=True)
        return self._redis.pubsub(ignore_subscribe_messages=True)

    async def _run(self) -> None:
        backoff = 0.05
        attempt = 0
        while True:
            pubsub = None
            try:
                if isinstance(self._redis, RedisCluster):
                    # The cluster client learns its nodes and slots lazily, on its first command.
                    await self._redis.initialize()
                pubsub = self._pubsub(attempt)
                await pubsub.subscribe(WAKE_CHANNEL)
                # redis-py may reconnect and resubscribe on its own: whatever was published
                # meanwhile is lost, so every waiter re-checks (a weakly held bound method).
                pubsub.connection.register_connect_callback(self._on_reconnect)
                if attempt:
                    # Subscribed again: wake-ups published while we were not are lost.
                    self._wake_all()
                self._ready.set()
                backoff = 0.05
                while True:
                    # Blocks on the socket until a message arrives (timeout=None).
                    message = await pubsub.get_message(timeout=None)
                    if message is not None and message.get("type") == "message":
                        data = message["data"]
                        self.wake(data.decode() if isinstance(data, bytes) else str(data))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # whatever fails, this loop must go on
                # Not only RedisError/OSError: the loop dying on anything else (e.g. a cluster
                # client not initialised yet) would leave every later waiter without wake-ups.
                if self._ready.is_set():
                    log.warning("single-flight subscription lost: %s", exc)
                else:
                    log.debug("single-flight subscription failed: %r", exc)
                self._ready.clear()
                self._wake_all()
                attempt += 1
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
            finally:
                if pubsub is not None:
                    if pubsub.connection is not None:
                        pubsub.connection.deregister_connect_callback(self._on_reconnect)
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(pubsub.aclose(), 2.0)
