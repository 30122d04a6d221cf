"""Tenants in Redis: create or replace, update some settings, read, list.

Layout (prefix ``llmesh:admin:``, at most :data:`~gateway.admin.records.MAX_TENANTS` tenants):
``tenant:<name>`` holds the :class:`~gateway.admin.records.TenantRecord` (JSON), ``tenants`` the
names. A stored tenant's settings replace the ones of the same name in the gateway's
configuration (``LLMESH_GATEWAY_TENANTS``); an update of a tenant that only the configuration
names starts from the configured settings. Each write publishes the new record on the change
channel in the same MULTI/EXEC, as the key store does.
"""

from __future__ import annotations

from typing import Any

from gateway.admin.keys import PREFIX, channel, optimistic
from gateway.admin.records import (
    MAX_TENANTS,
    TenantRecord,
    check_tenant_name,
    now_s,
    tenant_changed,
    tenant_settings,
)
from gateway.config import TenantSettings
from services.runtime.errors import FailedPrecondition, NotFound

ALL_TENANTS = PREFIX + "tenants"
_MGET_CHUNK = 500


def tenant_key(name: str) -> str:
    return f"{PREFIX}tenant:{name}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class TenantStore:
    """The tenants in Redis (see the module docstring)."""

    def __init__(self, redis: Any) -> None:
        self._redis = redis
        self._channel = channel(redis)

    async def get(self, name: str) -> TenantRecord | None:
        raw = await self._redis.get(tenant_key(check_tenant_name(name)))
        return None if raw is None else TenantRecord.model_validate_json(raw)

    async def put(self, name: str, values: dict[str, Any]) -> tuple[TenantRecord, bool]:
        """Creates the tenant or replaces all its settings (a field not given gets its default).
        Returns the record and whether it was created."""
        check_tenant_name(name)
        settings = tenant_settings(values)
        return await self._write(name, lambda _old: settings, create=True)

    async def patch(
        self, name: str, values: dict[str, Any], configured: TenantSettings | None = None
    ) -> TenantRecord:
        """Changes the given settings only; the others stay as stored, else as ``configured``
        (the gateway's configuration), else NotFound."""
        check_tenant_name(name)
        tenant_settings(values)  # the changes alone are valid before anything is read

        def merged(old: TenantSettings | None) -> TenantSettings:
            base = old if old is not None else configured
            if base is None:
                raise NotFound(f"no tenant named {name!r}: create it with PUT /v1/admin/tenants/{name}")
            return tenant_settings({**base.model_dump(mode="json"), **values})

        record, _created = await self._write(name, merged, create=configured is not None)
        return record

    async def _write(self, name: str, settings_from: Any, *, create: bool) -> tuple[TenantRecord, bool]:
        key = tenant_key(name)

        async def attempt(pipe: Any) -> tuple[TenantRecord, bool]:
            await pipe.watch(key, ALL_TENANTS)
            raw = await pipe.get(key)
            old = None if raw is None else TenantRecord.model_validate_json(raw)
            settings: TenantSettings = settings_from(None if old is None else old.settings)
            now = now_s()
            if old is None:
                if not create:
                    raise NotFound(f"no tenant named {name!r}")
                if await pipe.scard(ALL_TENANTS) >= MAX_TENANTS:
                    raise FailedPrecondition(f"the store already holds {MAX_TENANTS} tenants (the limit)")
                record = TenantRecord(name=name, settings=settings, created_at=now, updated_at=now)
            else:
                record = old.model_copy(
                    update={"settings": settings, "updated_at": now, "version": old.version + 1}
                )
            pipe.multi()
            pipe.set(key, record.model_dump_json())
            pipe.sadd(ALL_TENANTS, name)
            pipe.publish(self._channel, tenant_changed(record))
            await pipe.execute()
            return record, old is None

        return await optimistic(self._redis, attempt, f"writing tenant {name!r}")

    async def records(self) -> list[TenantRecord]:
        """Every stored tenant, by name."""
        names = sorted(_text(n) for n in await self._redis.smembers(ALL_TENANTS))
        out: list[TenantRecord] = []
        for start in range(0, len(names), _MGET_CHUNK):
            chunk = names[start : start + _MGET_CHUNK]
            for raw in await self._redis.mget([tenant_key(n) for n in chunk]):
                if raw is not None:
                    out.append(TenantRecord.model_validate_json(raw))
        return out
