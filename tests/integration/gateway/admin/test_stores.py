"""The key and tenant stores on the real Redis: what is stored, rotation, revocation, bounds."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from gateway.admin.keys import KeyStore, channel, digest_key, record_key
from gateway.admin.records import MAX_KEYS_PER_TENANT, Change, KeyStatus, digest
from gateway.admin.tenants import TenantStore
from gateway.config import TenantSettings
from services.runtime.errors import FailedPrecondition, InvalidArgument, NotFound


@pytest_asyncio.fixture
async def redis(redis_url: str) -> AsyncIterator[Any]:
    client: Any = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def _stored_values(redis: Any) -> list[bytes]:
    values: list[bytes] = []
    async for name in redis.scan_iter(match="llmesh:admin:*"):
        kind = (await redis.type(name)).decode()
        if kind == "string":
            values.append(await redis.get(name))
        elif kind == "set":
            values.extend(await redis.smembers(name))
    return values


async def test_a_key_is_stored_as_its_hash_and_shown_only_at_creation(
    redis: Any, new_tenant: Callable[[], str]
) -> None:
    tenant = new_tenant()
    keys = KeyStore(redis)
    record, secret = await keys.create(tenant, "ci", expires_in_s=3600)
    assert record.tenant == tenant and record.name == "ci" and record.digest == digest(secret)
    assert record.expires_at == record.created_at + 3600 and record.status() is KeyStatus.ACTIVE
    # Nothing in Redis holds the key itself.
    assert all(secret.encode() not in value for value in await _stored_values(redis))
    assert await keys.require(record.id) == record
    assert await keys.by_digest(digest(secret)) == record
    assert [r.id for r in await keys.records(tenant)] == [record.id]
    assert record.id in {r.id for r in await keys.records()}


async def test_every_write_publishes_the_new_record(redis: Any, new_tenant: Callable[[], str]) -> None:
    tenant = new_tenant()
    pubsub = redis.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(channel(redis))
    try:
        record, _ = await KeyStore(redis).create(tenant)
        revoked = await KeyStore(redis).revoke(record.id)
        seen: list[Change] = []
        deadline = time.monotonic() + 5.0
        while len(seen) < 2 and time.monotonic() < deadline:
            # None: the subscription's confirmation (ignored), or nothing yet.
            message = await pubsub.get_message(timeout=1.0)
            if message is not None:
                seen.append(Change.model_validate_json(message["data"]))
    finally:
        await pubsub.aclose()
    assert [(c.kind, c.key) for c in seen] == [("key", record), ("key", revoked)]
    assert revoked.version == record.version + 1


async def test_the_change_channel_names_the_database(redis_url: str) -> None:
    # Pub/sub ignores database numbers: two meshes on one Redis server must not share changes.
    base = redis_url.rsplit("/", 1)[0]
    one: Any = aioredis.Redis.from_url(f"{base}/1")
    two: Any = aioredis.Redis.from_url(f"{base}/2")
    try:
        assert channel(one) != channel(two)
    finally:
        await one.aclose()
        await two.aclose()


async def test_rotation_keeps_the_id_and_retires_the_old_key(
    redis: Any, new_tenant: Callable[[], str]
) -> None:
    keys = KeyStore(redis)
    record, old = await keys.create(new_tenant())
    rotated, new = await keys.rotate(record.id)
    assert rotated.id == record.id and new != old and rotated.rotated_at is not None
    assert await keys.by_digest(digest(old)) is None
    assert await redis.get(digest_key(digest(old))) is None
    assert await keys.by_digest(digest(new)) == rotated


async def test_revocation_is_kept_and_idempotent(redis: Any, new_tenant: Callable[[], str]) -> None:
    keys = KeyStore(redis)
    record, secret = await keys.create(new_tenant())
    revoked = await keys.revoke(record.id)
    assert revoked.status() is KeyStatus.REVOKED
    # The record and its digest stay: a revoked key is refused as revoked, not as unknown.
    assert await keys.by_digest(digest(secret)) == revoked
    assert await keys.revoke(record.id) == revoked
    with pytest.raises(FailedPrecondition, match="revoked"):
        await keys.rotate(record.id)


async def test_unknown_and_malformed_ids(redis: Any) -> None:
    keys = KeyStore(redis)
    with pytest.raises(NotFound):
        await keys.revoke("key_0000000000000000")
    with pytest.raises(NotFound):
        await keys.rotate("key_0000000000000000")
    with pytest.raises(InvalidArgument):
        await keys.get("llmesh:admin:tenants")


@pytest.mark.parametrize(
    ("tenant", "name", "expires"), [("a:b", "", None), ("t", "x" * 200, None), ("t", "", 0), ("t", "", -5)]
)
async def test_create_checks_its_arguments(redis: Any, tenant: str, name: str, expires: int | None) -> None:
    with pytest.raises(InvalidArgument):
        await KeyStore(redis).create(tenant, name, expires)


async def test_keys_per_tenant_are_bounded_and_spent_records_make_room(
    redis: Any, new_tenant: Callable[[], str]
) -> None:
    tenant = new_tenant()
    keys = KeyStore(redis)
    made = [(await keys.create(tenant))[0] for _ in range(MAX_KEYS_PER_TENANT)]
    with pytest.raises(FailedPrecondition, match=f"{MAX_KEYS_PER_TENANT} active keys"):
        await keys.create(tenant)
    # A revoked record is dropped to make room for a new key; the active ones all stay.
    spent = {made[5].id, made[2].id}
    for key_id in spent:
        await keys.revoke(key_id)
    new, _ = await keys.create(tenant)
    ids = {r.id for r in await keys.records(tenant)}
    assert len(ids) == MAX_KEYS_PER_TENANT and new.id in ids
    assert len(spent - ids) == 1 and {r.id for r in made} - spent <= ids
    (dropped,) = spent - ids
    assert await redis.get(record_key(dropped)) is None


async def test_tenants_put_patch_get(redis: Any, new_tenant: Callable[[], str]) -> None:
    tenants = TenantStore(redis)
    name = new_tenant()
    created, was_new = await tenants.put(name, {"models": ["m1"], "requests_per_minute": 5})
    assert was_new and created.settings == TenantSettings(models=["m1"], requests_per_minute=5)
    patched = await tenants.patch(name, {"token_budget_per_day": 1000})
    assert patched.settings.models == ["m1"] and patched.settings.token_budget_per_day == 1000
    assert patched.version == created.version + 1 and patched.created_at == created.created_at
    replaced, was_new = await tenants.put(name, {"models": ["m2"]})
    # PUT replaces every setting: the ones not given are back to their defaults.
    assert not was_new and replaced.settings == TenantSettings(models=["m2"])
    assert await tenants.get(name) == replaced
    assert name in {r.name for r in await tenants.records()}


async def test_patching_a_tenant_only_the_configuration_knows_starts_from_its_settings(
    redis: Any, new_tenant: Callable[[], str]
) -> None:
    tenants = TenantStore(redis)
    name = new_tenant()
    with pytest.raises(NotFound, match="PUT /v1/admin/tenants/"):
        await tenants.patch(name, {"requests_per_minute": 1})
    configured = TenantSettings(models=["m1"], rag_collections=["docs"])
    record = await tenants.patch(name, {"requests_per_minute": 1}, configured)
    assert record.settings == TenantSettings(models=["m1"], rag_collections=["docs"], requests_per_minute=1)


async def test_tenant_writes_are_validated_before_anything_is_stored(
    redis: Any, new_tenant: Callable[[], str]
) -> None:
    tenants = TenantStore(redis)
    name = new_tenant()
    with pytest.raises(InvalidArgument, match="unknown tenant setting"):
        await tenants.put(name, {"rpm": 5})
    with pytest.raises(InvalidArgument, match="tenant name"):
        await tenants.put("a:b", {})
    assert await tenants.get(name) is None
