"""Invalidations of version keys, pushed by Redis: what lets a process keep copies of cached data
and still prove, per request, that none of them is stale.

:class:`VersionWatch` holds one RESP3 connection to the Redis that keeps the versions
(:mod:`services.runtime.versions`) with ``CLIENT TRACKING ON BCAST PREFIX llmesh:ver:``. Redis then
pushes the name of every version key that changes (a bump, a key that expires or is evicted, one
that is created) on that connection, and a null when the database is flushed. A copy that
depends on some version keys stays valid exactly as long as none of them was pushed since the
copy's data was read (:meth:`VersionWatch.mark` before the read, :meth:`VersionWatch.changed_since`
after it).

Exactness. Pushes travel asynchronously: a bump acknowledged to someone else may still be on its
way. :meth:`VersionWatch.barrier` closes that gap. It sends a ``PING`` on the same connection;
Redis queues a connection's pushes and replies in the order it produces them, so once the
``PONG`` is read, every invalidation of a bump that completed before the ``PING`` was sent has
been applied. A copy served after a barrier that started after the request arrived is as fresh as
a read from Redis itself (barriers of concurrent requests share one ``PING``).

Whatever breaks that chain makes every copy invalid at once: a lost connection, a Redis restart,
a flush (each moves :attr:`VersionWatch.epoch`); while the watch is not connected
:meth:`barrier` answers False and the caller reads from the source.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from services.runtime import redis_client
from services.runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)

VERSION_PREFIX = "llmesh:ver:"
_PING = b"*1\r\n$4\r\nPING\r\n"
# The longest wait between two connection attempts while Redis does not answer.
MAX_RETRY_S = 5.0
# The watch connection's name in CLIENT LIST.
CLIENT_NAME = "llmesh-version-watch"

# Called with the invalidated keys, or None when everything is invalid (flush, lost connection).
Listener = Callable[[Sequence[str] | None], None]


@dataclass(frozen=True, slots=True)
class Mark:
    """Where the watch stood when a read started (:meth:`VersionWatch.mark`)."""

    epoch: int
    seq: int


class VersionWatch:
    """The invalidation connection of one process (module doc).

    ``remembered``: how many recently invalidated keys it remembers for :meth:`changed_since`
    (a read that started before the oldest forgotten one is judged changed).
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = VERSION_PREFIX,
        barrier_timeout_s: float = 0.1,
        connect_timeout_s: float = 2.0,
        retry_s: float = 0.5,
        remembered: int = 65536,
    ) -> None:
        self._url = url
        self._prefix = prefix
        self.barrier_timeout_s = barrier_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._retry_s = retry_s
        self._remembered = remembered
        self.epoch = 0
        self.seq = 0
        self.connected = False
        self._conn: Any = None
        self._last: OrderedDict[str, int] = OrderedDict()
        self._forgotten = 0
        self._listeners: list[Listener] = []
        self._open: asyncio.Future[bool] | None = None
        self._pending: list[asyncio.Future[bool]] = []
        self._task: asyncio.Task[None] | None = None
        self._up = asyncio.Event()
        self._closed = False
        # Counters for /metrics-style inspection and tests.
        self.pushes = 0
        self.barriers = 0
        self.connects = 0

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    async def start(self) -> None:
        """Starts connecting (in the background; :meth:`wait_connected` waits for it)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="version-watch")

    async def wait_connected(self, timeout_s: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._up.wait(), timeout_s)
        return self.connected

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            with contextlib.suppress(Exception):
                await cancel_and_wait(self._task)
            self._task = None
        self._lost("closed")

    # -- what callers use ------------------------------------------------------------------------

    def mark(self) -> Mark | None:
        """Where the watch stands now (None while not connected: nothing read now can be kept)."""
        return Mark(self.epoch, self.seq) if self.connected else None

    def changed_since(self, mark: Mark, keys: Iterable[str]) -> bool:
        """Whether any of ``keys`` may have changed since ``mark`` (or the watch lost track)."""
        if not self.connected or mark.epoch != self.epoch or self._forgotten > mark.seq:
            return True
        last = self._last
        return any(last.get(key, 0) > mark.seq for key in keys)

    async def barrier(self) -> bool:
        """True once every invalidation of a write completed before this call has been applied
        (module doc); False when that cannot be shown in ``barrier_timeout_s``."""
        if not self.connected:
            return False
        epoch = self.epoch
        future = self._open
        if future is None:
            loop = asyncio.get_running_loop()
            future = self._open = loop.create_future()
            # Sent after the current loop step: every barrier that starts in it shares the PING,
            # and one timer bounds them all (a wait_for each cost a timer and three futures).
            loop.call_soon(self._send)
            expiry = loop.call_later(self.barrier_timeout_s, _expire, future)
            future.add_done_callback(lambda _: expiry.cancel())
        ok = await asyncio.shield(future)  # a caller cancelled leaves the PING to the others
        return ok and self.connected and self.epoch == epoch

    # -- the connection --------------------------------------------------------------------------

    def _send(self) -> None:
        future, self._open = self._open, None
        if future is None or future.done():
            return
        conn = self._conn
        if conn is None or not self.connected:
            future.set_result(False)
            return
        self._pending.append(future)
        try:
            # One small write now, in the order of the FIFO above (redis-py's send is a coroutine).
            conn._writer.write(_PING)
        except Exception as exc:  # a broken transport: the reader sees it too
            log.warning("version watch: PING not sent: %s", exc)
            self._pending.remove(future)
            future.set_result(False)

    async def _run(self) -> None:
        # Retries back off from retry_s to MAX_RETRY_S; one warning per outage, not per try.
        delay, warned = self._retry_s, False
        while not self._closed:
            try:
                conn = await asyncio.wait_for(self._connect(), self._connect_timeout_s)
            except Exception as exc:  # Redis down, refused, too old for RESP3 tracking
                where = redis_client.redact(self._url)
                (log.debug if warned else log.warning)(
                    "version watch: cannot watch %s (%s); retrying, meanwhile every lookup is a call",
                    where,
                    exc,
                )
                warned = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, max(MAX_RETRY_S, self._retry_s))
                continue
            delay, warned = self._retry_s, False
            self._conn = conn
            self.epoch += 1
            self.connected = True
            self.connects += 1
            self._up.set()
            log.info("version watch: tracking %s* on %s", self._prefix, redis_client.redact(self._url))
            try:
                while True:
                    reply = await conn.read_response(timeout=math.inf, push_request=True)
                    self._reply(reply)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not self._closed:
                    log.warning("version watch: connection lost (%s); every local copy is dropped", exc)
            finally:
                self._lost("disconnected")
                with contextlib.suppress(Exception):
                    await conn.disconnect()
            await asyncio.sleep(self._retry_s if not self._closed else 0)

    async def _connect(self) -> Any:
        client = redis_client.connect(self._url, protocol=3, socket_timeout=None, client_name=CLIENT_NAME)
        conn: Any = client.connection_pool.make_connection()  # type: ignore[no-untyped-call]
        await conn.connect()
        if getattr(conn, "protocol", 3) not in (3, "3"):
            raise RuntimeError("the connection is not RESP3")

        async def push(message: list[Any]) -> list[Any]:
            return message

        # redis-py's async connection exposes no setter for it.
        conn._parser.set_invalidation_push_handler(push)
        tracking = ("CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", self._prefix)
        await conn.send_command(*tracking, check_health=False)
        reply = await conn.read_response(timeout=self._connect_timeout_s)
        if reply not in (b"OK", "OK"):
            raise RuntimeError(f"CLIENT TRACKING answered {reply!r}")
        return conn

    def _reply(self, reply: Any) -> None:
        if isinstance(reply, list) and reply and reply[0] in (b"invalidate", "invalidate"):
            self._invalidated(reply[1] if len(reply) > 1 else None)
            return
        if self._pending:
            future = self._pending.pop(0)
            if not future.done():  # else its barriers timed out (_expire)
                future.set_result(reply in (b"PONG", "PONG"))
            self.barriers += 1

    def _invalidated(self, keys: Any) -> None:
        self.pushes += 1
        self.seq += 1
        if keys is None:
            # FLUSHDB / FLUSHALL: every version may be gone.
            self.epoch += 1
            self._notify(None)
            return
        names = [k.decode() if isinstance(k, bytes) else str(k) for k in keys]
        last = self._last
        for name in names:
            last[name] = self.seq
            last.move_to_end(name)
        while len(last) > self._remembered:
            _, seq = last.popitem(last=False)
            self._forgotten = max(self._forgotten, seq)
        self._notify(names)

    def _lost(self, why: str) -> None:
        was = self.connected
        self.connected = False
        self._up.clear()
        self._conn = None
        self.epoch += 1
        for future in [*self._pending, *([self._open] if self._open else [])]:
            if not future.done():
                future.set_result(False)
        self._pending.clear()
        self._open = None
        if was:
            self._notify(None)

    def _notify(self, keys: Sequence[str] | None) -> None:
        for listener in self._listeners:
            try:
                listener(keys)
            except Exception:  # a listener's bug must not stop the watch
                log.exception("version watch listener failed")


def _expire(future: asyncio.Future[bool]) -> None:
    """A PING not answered in ``barrier_timeout_s``: its barriers cannot show freshness."""
    if not future.done():
        future.set_result(False)
