"""A gateway's live view of the stored keys and tenants: a snapshot kept current by pub/sub.

Each gateway holds every key record and tenant record in memory, so authenticating a request
is a dict lookup. The snapshot is loaded after subscribing to the change channel
(:func:`~gateway.admin.keys.channel`), and every write to the store publishes the new record
there in the same transaction, so from then on each change reaches every gateway within a
message's delivery (milliseconds), with no restart and no polling. A record is applied only if
its version is newer than the one held, so a message that arrives after the reload it raced
with cannot roll an entry back.

While the subscription is down (Redis restarted, the connection dropped or went silent) the
snapshot is not trusted: :attr:`Directory.fresh` is false and the caller looks each key up in
Redis (:meth:`Directory.lookup`) until the subscription is back and the snapshot reloaded;
changes published meanwhile were lost, and a revoked key must never keep working because a
message was. redis-py's own reconnection is off on the subscriber connection for that reason:
a reconnect happens here, followed by a reload.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.admin.keys import KeyStore, channel
from gateway.admin.records import Change, KeyRecord, TenantRecord
from gateway.admin.tenants import TenantStore
from gateway.config import TenantSettings
from services.runtime import redis_client
from services.runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)

# How long start() waits for the first subscription and load before serving without them.
START_WAIT_S = 2.0
# A silent subscription is pinged after this long; no answer within twice as long = down.
PING_INTERVAL_S = 5.0


class Directory:
    """The stores (:attr:`keys`, :attr:`tenants`) and the live snapshot of both (module doc)."""

    def __init__(
        self,
        url: str,
        *,
        min_backoff_s: float = 0.05,
        max_backoff_s: float = 1.0,
        ping_interval_s: float = PING_INTERVAL_S,
    ) -> None:
        self.redis: Any = redis_client.connect(url, socket_connect_timeout=1.0, socket_timeout=1.0)
        # The subscriber: no read timeout (it waits for messages), no silent reconnection.
        self.subscriber_name = f"llmesh-admin-{uuid.uuid4().hex[:12]}"
        self._sub: Any = redis_client.connect(
            url,
            socket_connect_timeout=1.0,
            socket_timeout=None,
            retry=Retry(NoBackoff(), 0),
            client_name=self.subscriber_name,
        )
        self.channel = channel(self.redis)
        self.keys = KeyStore(self.redis)
        self.tenants = TenantStore(self.redis)
        self._min_backoff = min_backoff_s
        self._max_backoff = max_backoff_s
        self._ping_interval = ping_interval_s
        self._keys: dict[str, KeyRecord] = {}
        self._by_digest: dict[str, str] = {}
        self._tenants: dict[str, TenantRecord] = {}
        self._fresh = False
        self._resync = False
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self, wait_s: float = START_WAIT_S) -> None:
        """Subscribes and loads; returns once fresh, or after ``wait_s`` (Redis down: the
        directory keeps trying, and until then every lookup goes to Redis)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="gateway-admin-directory")
            with contextlib.suppress(TimeoutError):
                await self.wait_for(lambda: self._fresh, wait_s)

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        self._fresh = False
        await self._sub.aclose()
        await self.redis.aclose()

    # -- the snapshot -----------------------------------------------------------------------------

    @property
    def fresh(self) -> bool:
        """Subscribed, and the snapshot loaded since: it can be trusted."""
        return self._fresh

    @property
    def has_keys(self) -> bool:
        """Whether the snapshot holds any key record (meaningful only while :attr:`fresh`)."""
        return bool(self._keys)

    def cached_key(self, hex_digest: str) -> KeyRecord | None:
        key_id = self._by_digest.get(hex_digest)
        return None if key_id is None else self._keys.get(key_id)

    def cached_tenant(self, name: str) -> TenantSettings | None:
        record = self._tenants.get(name)
        return None if record is None else record.settings

    async def lookup(self, hex_digest: str) -> KeyRecord | None:
        """The key's record read from Redis (RedisError/OSError when it cannot be)."""
        return await self.keys.by_digest(hex_digest)

    async def lookup_tenant(self, name: str) -> TenantSettings | None:
        record = await self.tenants.get(name)
        return None if record is None else record.settings

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> None:
        """Returns once ``predicate()`` holds, checked after every change the directory applies
        (TimeoutError after ``timeout_s``)."""
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(predicate), timeout_s)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _put_key(self, record: KeyRecord) -> bool:
        held = self._keys.get(record.id)
        if held is not None and held.version >= record.version:
            return False
        if held is not None and held.digest != record.digest:
            self._by_digest.pop(held.digest, None)
        self._keys[record.id] = record
        self._by_digest[record.digest] = record.id
        return True

    def _drop_key(self, record: KeyRecord) -> bool:
        held = self._keys.pop(record.id, None)
        if held is None:
            return False
        self._by_digest.pop(held.digest, None)
        return True

    def _put_tenant(self, record: TenantRecord) -> bool:
        held = self._tenants.get(record.name)
        if held is not None and held.version >= record.version:
            return False
        self._tenants[record.name] = record
        return True

    def _apply(self, data: bytes | str) -> None:
        try:
            change = Change.model_validate_json(data)
        except ValidationError:
            # A record this gateway cannot read (a newer gateway wrote it): trust nothing cached.
            log.warning("unreadable admin change message: reloading the key and tenant snapshot")
            self._resync = True
            return
        if change.kind == "key" and change.key is not None:
            self._put_key(change.key)
        elif change.kind == "key_deleted" and change.key is not None:
            self._drop_key(change.key)
        elif change.kind == "tenant" and change.tenant is not None:
            self._put_tenant(change.tenant)

    async def _reload(self) -> None:
        """Replaces the snapshot with what Redis holds (subscribed already: nothing is missed)."""
        keys = await self.keys.records()
        tenants = await self.tenants.records()
        self._keys = {r.id: r for r in keys}
        self._by_digest = {r.digest: r.id for r in keys}
        self._tenants = {r.name: r for r in tenants}
        log.info("admin snapshot loaded: %d keys, %d tenants", len(keys), len(tenants))

    # -- the subscription -------------------------------------------------------------------------

    def _on_reconnect(self, connection: Any) -> None:
        del connection
        # Should redis-py reconnect on its own after all: messages may have been lost meanwhile.
        self._fresh = False
        self._resync = True

    async def _run(self) -> None:
        backoff = self._min_backoff
        while True:
            pubsub: Any = None
            try:
                pubsub = self._sub.pubsub(ignore_subscribe_messages=True)
                await pubsub.subscribe(self.channel)
                pubsub.connection.register_connect_callback(self._on_reconnect)
                await self._reload()
                self._fresh, self._resync = True, False
                await self._notify()
                backoff = self._min_backoff
                await self._listen(pubsub)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # whatever fails, the gateway must go on (on Redis lookups)
                if self._fresh:
                    log.warning("admin change subscription lost (%s): looking keys up in Redis", exc)
                else:
                    log.debug("admin change subscription failed: %r", exc)
                self._fresh = False
                await self._notify()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)
            finally:
                if pubsub is not None:
                    if pubsub.connection is not None:
                        pubsub.connection.deregister_connect_callback(self._on_reconnect)
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(pubsub.aclose(), 2.0)

    async def _listen(self, pubsub: Any) -> None:
        last_heard = time.monotonic()
        pinged = False
        while True:
            message = await pubsub.get_message(timeout=min(1.0, self._ping_interval))
            now = time.monotonic()
            if message is not None:
                last_heard, pinged = now, False
                if message.get("type") == "message":
                    self._apply(message["data"])
                    await self._notify()
            elif now - last_heard > 3 * self._ping_interval:
                raise ConnectionError(
                    f"no answer from Redis on the subscription for {now - last_heard:.0f} s"
                )
            elif now - last_heard > self._ping_interval and not pinged:
                await pubsub.ping()
                pinged = True
            if self._resync:
                self._fresh = False
                await self._reload()
                self._fresh, self._resync = True, False
                await self._notify()
