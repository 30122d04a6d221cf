"""API keys in Redis: create (the key shown once), list, rotate, revoke, look up by digest.

Layout (prefix ``llmesh:admin:``; bounded by :data:`~gateway.admin.records.MAX_KEYS_PER_TENANT`
records per tenant, and tenants are bounded by the tenant store):

* ``key:<id>``: the :class:`~gateway.admin.records.KeyRecord` (JSON), no secret in it;
* ``digest:<sha256 hex>``: the id of the key with that digest (a presented key's lookup);
* ``tenant-keys:<tenant>``: the ids of the tenant's keys;
* ``keys``: every id (a gateway loads its snapshot from it).

Each write is one MULTI/EXEC (optimistic: WATCH on what it read) that also publishes the new
record on the change channel (:func:`channel`), so a gateway that sees the message can trust the record in it.
Revoking keeps the record (and its digest), so a revoked key is refused as revoked; rotating
drops the old digest, so the old key is then unknown.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from redis.exceptions import WatchError

from gateway.admin.records import (
    MAX_EXPIRY_S,
    MAX_KEYS_PER_TENANT,
    KeyRecord,
    KeyStatus,
    check_key_id,
    check_key_name,
    check_tenant_name,
    digest,
    key_changed,
    key_deleted,
    new_key_id,
    new_secret,
    now_s,
)
from services.runtime.errors import Aborted, FailedPrecondition, InvalidArgument, NotFound

log = logging.getLogger(__name__)

PREFIX = "llmesh:admin:"
ALL_KEYS = PREFIX + "keys"
# Optimistic transactions retried this many times before the caller is told to retry.
WRITE_ATTEMPTS = 8
_MGET_CHUNK = 500

T = TypeVar("T")


def channel(redis: Any) -> str:
    """The change channel of the database ``redis`` uses. Pub/sub ignores database numbers, so
    the channel names it: meshes that share a Redis server on different databases must not
    see each other's keys."""
    db = redis.connection_pool.connection_kwargs.get("db") or 0
    return f"{PREFIX}changes:{db}"


def record_key(key_id: str) -> str:
    return f"{PREFIX}key:{key_id}"


def digest_key(hex_digest: str) -> str:
    return f"{PREFIX}digest:{hex_digest}"


def tenant_keys(tenant: str) -> str:
    return f"{PREFIX}tenant-keys:{tenant}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def optimistic(redis: Any, attempt: Callable[[Any], Awaitable[T]], what: str) -> T:
    """Runs ``attempt(pipe)`` (WATCH, read, MULTI, write) until no watched key moved under it."""
    for _ in range(WRITE_ATTEMPTS):
        async with redis.pipeline(transaction=True) as pipe:
            try:
                return await attempt(pipe)
            except WatchError:
                continue
    raise Aborted(f"{what} raced with other writes {WRITE_ATTEMPTS} times; retry")


async def load_records(redis: Any, ids: Iterable[str]) -> list[KeyRecord]:
    """The records of ``ids`` that exist (MGET in chunks)."""
    names = sorted(set(ids))
    out: list[KeyRecord] = []
    for start in range(0, len(names), _MGET_CHUNK):
        chunk = names[start : start + _MGET_CHUNK]
        for raw in await redis.mget([record_key(i) for i in chunk]):
            if raw is not None:
                out.append(KeyRecord.model_validate_json(raw))
    return out


class KeyStore:
    """The API keys in Redis (see the module docstring)."""

    def __init__(self, redis: Any) -> None:
        self._redis = redis
        self._channel = channel(redis)

    async def create(
        self, tenant: str, name: str = "", expires_in_s: int | None = None
    ) -> tuple[KeyRecord, str]:
        """A new key for ``tenant``: its record and the key itself (returned only here)."""
        check_tenant_name(tenant)
        check_key_name(name)
        if expires_in_s is not None and not 0 < expires_in_s <= MAX_EXPIRY_S:
            raise InvalidArgument(f"expires_in must be between 1 and {MAX_EXPIRY_S} seconds")
        secret = new_secret()
        created = now_s()
        record = KeyRecord(
            id=new_key_id(),
            tenant=tenant,
            name=name,
            digest=digest(secret),
            hint=secret[-4:],
            created_at=created,
            expires_at=None if expires_in_s is None else created + expires_in_s,
        )
        owned = tenant_keys(tenant)

        async def attempt(pipe: Any) -> KeyRecord:
            await pipe.watch(owned)
            ids = [_text(i) for i in await pipe.smembers(owned)]
            dropped: list[KeyRecord] = []
            missing: set[str] = set()
            if len(ids) >= MAX_KEYS_PER_TENANT:
                records = await load_records(pipe, ids)
                missing = set(ids) - {r.id for r in records}
                need = len(records) + 1 - MAX_KEYS_PER_TENANT
                if need > 0:
                    spent = sorted(
                        (r for r in records if r.status() is not KeyStatus.ACTIVE),
                        key=lambda r: (r.created_at, r.id),
                    )
                    if len(spent) < need:
                        raise FailedPrecondition(
                            f"tenant {tenant!r} already has {MAX_KEYS_PER_TENANT} active keys (the "
                            "limit): revoke one it no longer uses first"
                        )
                    dropped = spent[:need]
                    await pipe.watch(*(record_key(r.id) for r in dropped))
            pipe.multi()
            for gone in dropped:
                pipe.delete(record_key(gone.id), digest_key(gone.digest))
                pipe.srem(owned, gone.id)
                pipe.srem(ALL_KEYS, gone.id)
                pipe.publish(self._channel, key_deleted(gone))
            for gone_id in missing:
                pipe.srem(owned, gone_id)
                pipe.srem(ALL_KEYS, gone_id)
            pipe.set(record_key(record.id), record.model_dump_json())
            pipe.set(digest_key(record.digest), record.id)
            pipe.sadd(owned, record.id)
            pipe.sadd(ALL_KEYS, record.id)
            pipe.publish(self._channel, key_changed(record))
            await pipe.execute()
            if dropped:
                log.info("tenant %s: dropped %d revoked or expired key records", tenant, len(dropped))
            return record

        return await optimistic(self._redis, attempt, "creating a key"), secret

    async def get(self, key_id: str) -> KeyRecord | None:
        check_key_id(key_id)
        raw = await self._redis.get(record_key(key_id))
        return None if raw is None else KeyRecord.model_validate_json(raw)

    async def require(self, key_id: str) -> KeyRecord:
        record = await self.get(key_id)
        if record is None:
            raise NotFound(f"no API key with id {key_id!r}")
        return record

    async def records(self, tenant: str | None = None) -> list[KeyRecord]:
        """The keys of ``tenant`` (every key without one), oldest first."""
        if tenant is None:
            ids = await self._redis.smembers(ALL_KEYS)
        else:
            ids = await self._redis.smembers(tenant_keys(check_tenant_name(tenant)))
        records = await load_records(self._redis, (_text(i) for i in ids))
        return sorted(records, key=lambda r: (r.created_at, r.id))

    async def any(self) -> bool:
        """Whether the store holds any key record (active, expired or revoked)."""
        return bool(await self._redis.scard(ALL_KEYS))

    async def by_digest(self, hex_digest: str) -> KeyRecord | None:
        """The record of the key whose SHA-256 is ``hex_digest``, if any."""
        key_id = await self._redis.get(digest_key(hex_digest))
        if key_id is None:
            return None
        raw = await self._redis.get(record_key(_text(key_id)))
        if raw is None:
            return None
        record = KeyRecord.model_validate_json(raw)
        # The index may briefly outlive a rotation read half-way; the record decides.
        return record if record.digest == hex_digest else None

    async def rotate(self, key_id: str) -> tuple[KeyRecord, str]:
        """A new key for the same id; the old key stops working. Returns the record and the key."""
        check_key_id(key_id)
        secret = new_secret()

        async def attempt(pipe: Any) -> KeyRecord:
            await pipe.watch(record_key(key_id))
            raw = await pipe.get(record_key(key_id))
            if raw is None:
                raise NotFound(f"no API key with id {key_id!r}")
            old = KeyRecord.model_validate_json(raw)
            status = old.status()
            if status is not KeyStatus.ACTIVE:
                raise FailedPrecondition(f"API key {key_id!r} is {status.value}: create a new key instead")
            new = old.model_copy(
                update={
                    "digest": digest(secret),
                    "hint": secret[-4:],
                    "rotated_at": now_s(),
                    "version": old.version + 1,
                }
            )
            pipe.multi()
            pipe.set(record_key(key_id), new.model_dump_json())
            pipe.delete(digest_key(old.digest))
            pipe.set(digest_key(new.digest), key_id)
            pipe.publish(self._channel, key_changed(new))
            await pipe.execute()
            return new

        return await optimistic(self._redis, attempt, "rotating a key"), secret

    async def revoke(self, key_id: str) -> KeyRecord:
        """Revokes the key (idempotent); the record stays, so the key is refused as revoked."""
        check_key_id(key_id)

        async def attempt(pipe: Any) -> KeyRecord:
            await pipe.watch(record_key(key_id))
            raw = await pipe.get(record_key(key_id))
            if raw is None:
                raise NotFound(f"no API key with id {key_id!r}")
            old = KeyRecord.model_validate_json(raw)
            if old.revoked_at is not None:
                await pipe.unwatch()
                return old
            new = old.model_copy(update={"revoked_at": now_s(), "version": old.version + 1})
            pipe.multi()
            pipe.set(record_key(key_id), new.model_dump_json())
            pipe.publish(self._channel, key_changed(new))
            await pipe.execute()
            return new

        return await optimistic(self._redis, attempt, "revoking a key")
