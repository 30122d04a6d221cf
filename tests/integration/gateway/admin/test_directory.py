"""Live reload: two gateways' authenticators on one Redis see each other's changes at once,
and a gateway whose subscription is down checks keys in Redis instead of its snapshot."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
import pytest_asyncio

from gateway.admin.directory import Directory
from gateway.admin.keys import record_key
from gateway.admin.records import key_changed, now_s
from gateway.auth import Authenticator, hash_key
from gateway.config import GatewaySettings, TenantSettings
from services.runtime.errors import Unauthenticated, Unavailable

# Bounded waits on the directory's change condition (never a sleep): a message takes milliseconds.
WAIT_S = 2.0


@pytest_asyncio.fixture
async def pair(redis_url: str) -> AsyncIterator[tuple[Authenticator, Authenticator]]:
    """Two gateways' authenticators (A writes, B reads) on the test's Redis."""
    settings = GatewaySettings(redis_url=redis_url)
    a = await Authenticator.start(settings)
    b = await Authenticator.start(settings)
    assert _dir(a).fresh and _dir(b).fresh
    yield a, b
    await a.close()
    await b.close()


def _dir(auth: Authenticator) -> Directory:
    assert auth.directory is not None
    return auth.directory


async def _kill_subscriber(directory: Directory) -> None:
    """Drops the directory's pub/sub connection on the server side (CLIENT KILL)."""
    redis = directory.redis
    clients = [
        c for c in await redis.client_list(_type="pubsub") if c.get("name") == directory.subscriber_name
    ]
    assert len(clients) == 1, clients
    assert await redis.client_kill_filter(_id=clients[0]["id"]) == 1


def _revoked(directory: Directory, hex_digest: str) -> bool:
    held = directory.cached_key(hex_digest)
    return held is not None and held.revoked_at is not None


async def _refused(auth: Authenticator, key: str) -> str:
    with pytest.raises(Unauthenticated) as caught:
        await auth.authenticate(f"Bearer {key}")
    return caught.value.message


async def test_a_key_created_on_one_gateway_works_on_the_other_at_once(
    pair: tuple[Authenticator, Authenticator], new_tenant: Callable[[], str]
) -> None:
    a, b = pair
    tenant = new_tenant()
    await _dir(a).tenants.put(tenant, {"models": ["m1"], "requests_per_minute": 7})
    record, secret = await _dir(a).keys.create(tenant, "ci")
    # At once: B's snapshot may not have it yet, and a key it does not know is looked up in Redis.
    principal = await b.authenticate(f"Bearer {secret}")
    assert (principal.tenant, principal.key_id) == (tenant, record.id)
    assert principal.settings == TenantSettings(models=["m1"], requests_per_minute=7)
    # And the change message brings it into B's snapshot (the fast path from then on).
    await _dir(b).wait_for(lambda: _dir(b).cached_key(record.digest) is not None, WAIT_S)


async def test_revocation_rotation_and_tenant_changes_reach_the_other_gateway(
    pair: tuple[Authenticator, Authenticator], new_tenant: Callable[[], str]
) -> None:
    a, b = pair
    directory = _dir(b)
    tenant = new_tenant()
    await _dir(a).tenants.put(tenant, {})
    first, first_key = await _dir(a).keys.create(tenant)
    second, second_key = await _dir(a).keys.create(tenant)
    await directory.wait_for(
        lambda: None not in (directory.cached_key(first.digest), directory.cached_key(second.digest)), WAIT_S
    )

    await _dir(a).keys.revoke(first.id)
    await directory.wait_for(lambda: _revoked(directory, first.digest), WAIT_S)
    assert await _refused(b, first_key) == "API key revoked"
    assert await _refused(a, first_key) == "API key revoked"

    rotated, new_key = await _dir(a).keys.rotate(second.id)
    await directory.wait_for(lambda: directory.cached_key(rotated.digest) is not None, WAIT_S)
    assert await _refused(b, second_key) == "invalid API key"
    assert (await b.authenticate(f"Bearer {new_key}")).key_id == second.id

    await _dir(a).tenants.patch(tenant, {"models": ["only-this"]})
    await directory.wait_for(
        lambda: directory.cached_tenant(tenant) == TenantSettings(models=["only-this"]), WAIT_S
    )
    assert (await b.authenticate(f"Bearer {new_key}")).settings.models == ["only-this"]


async def test_an_expired_key_is_refused_as_expired(
    pair: tuple[Authenticator, Authenticator], new_tenant: Callable[[], str]
) -> None:
    a, b = pair
    tenant = new_tenant()
    await _dir(a).tenants.put(tenant, {})
    record, secret = await _dir(a).keys.create(tenant, expires_in_s=3600)
    # The hour passed: the record as it will read then (written and published as the store does).
    expired = record.model_copy(update={"expires_at": now_s() - 1, "version": record.version + 1})
    redis = _dir(a).redis
    async with redis.pipeline(transaction=True) as pipe:
        pipe.set(record_key(record.id), expired.model_dump_json())
        pipe.publish(_dir(a).channel, key_changed(expired))
        await pipe.execute()
    await _dir(b).wait_for(lambda: _dir(b).cached_key(record.digest) == expired, WAIT_S)
    assert await _refused(b, secret) == "API key expired"


async def test_with_the_subscription_down_keys_are_checked_in_redis(
    redis_url: str, pair: tuple[Authenticator, Authenticator], new_tenant: Callable[[], str]
) -> None:
    a, _ = pair
    # A gateway that will not resubscribe during the test (a minute of backoff).
    cut = Directory(redis_url, min_backoff_s=60, max_backoff_s=60)
    await cut.start()
    auth = Authenticator(GatewaySettings(redis_url=redis_url), cut)
    try:
        tenant = new_tenant()
        await _dir(a).tenants.put(tenant, {"requests_per_minute": 1})
        record, secret = await _dir(a).keys.create(tenant)
        await cut.wait_for(lambda: cut.cached_key(record.digest) is not None, WAIT_S)

        await _kill_subscriber(cut)
        await cut.wait_for(lambda: not cut.fresh, WAIT_S)
        # Published while nobody listens on this gateway: the messages are lost.
        await _dir(a).keys.revoke(record.id)
        await _dir(a).tenants.patch(tenant, {"requests_per_minute": 2})
        new, new_secret = await _dir(a).keys.create(tenant)

        # The snapshot still holds the key as active; the gateway does not trust it.
        cached = cut.cached_key(record.digest)
        assert cached is not None and cached.revoked_at is None
        assert await _refused(auth, secret) == "API key revoked"
        principal = await auth.authenticate(f"Bearer {new_secret}")
        assert principal.key_id == new.id and principal.settings.requests_per_minute == 2
        assert not cut.fresh
    finally:
        await cut.close()


async def test_a_resubscribed_gateway_reloads_what_it_missed(
    redis_url: str, pair: tuple[Authenticator, Authenticator], new_tenant: Callable[[], str]
) -> None:
    a, _ = pair
    directory = Directory(redis_url, min_backoff_s=0.01, max_backoff_s=0.05)
    await directory.start()
    auth = Authenticator(GatewaySettings(redis_url=redis_url), directory)
    try:
        tenant = new_tenant()
        await _dir(a).tenants.put(tenant, {})
        record, secret = await _dir(a).keys.create(tenant)
        await directory.wait_for(lambda: directory.cached_key(record.digest) is not None, WAIT_S)
        # A revocation whose message is lost: written to Redis, never published.
        revoked = record.model_copy(update={"revoked_at": now_s(), "version": record.version + 1})
        await _dir(a).redis.set(record_key(record.id), revoked.model_dump_json())

        def reloaded() -> bool:
            return directory.fresh and _revoked(directory, record.digest)

        assert not reloaded()
        await _kill_subscriber(directory)
        # Resubscribed and reloaded: only the reload can have brought the revocation.
        await directory.wait_for(reloaded, 5.0)
        assert await _refused(auth, secret) == "API key revoked"
    finally:
        await directory.close()


async def test_the_first_stored_key_closes_an_open_gateway_and_revoking_never_reopens_it(
    pair: tuple[Authenticator, Authenticator], new_tenant: Callable[[], str]
) -> None:
    a, b = pair
    directory = _dir(b)
    if directory.has_keys:
        pytest.fail("this Redis database holds API key records of another run: the open case needs none")
    assert b.open and (await b.authenticate(None)).tenant == "default"
    tenant = new_tenant()
    await _dir(a).tenants.put(tenant, {})
    record, secret = await _dir(a).keys.create(tenant)
    await directory.wait_for(lambda: directory.has_keys, WAIT_S)
    assert not b.open
    with pytest.raises(Unauthenticated, match="missing API key"):
        await b.authenticate(None)
    assert (await b.authenticate(f"Bearer {secret}")).tenant == tenant
    await _dir(a).keys.revoke(record.id)
    await directory.wait_for(lambda: _revoked(directory, record.digest), WAIT_S)
    assert not b.open
    with pytest.raises(Unauthenticated):
        await b.authenticate(None)


async def test_configured_keys_work_without_redis() -> None:
    # Bootstrap keys (LLMESH_GATEWAY_API_KEYS) need no store; a Redis that does not answer
    # makes a stored key a 503, never an open door.
    settings = GatewaySettings(redis_url="redis://127.0.0.1:1/0", api_keys={hash_key("sk-boot"): "boot"})
    auth = await Authenticator.start(settings)
    try:
        assert auth.directory is not None and not auth.directory.fresh
        assert (await auth.authenticate("Bearer sk-boot")).tenant == "boot"
        with pytest.raises(Unavailable, match="key store is unreachable"):
            await auth.authenticate("Bearer sk-llmesh-unknown")
    finally:
        await auth.close()
