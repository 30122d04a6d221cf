"""The admin API's logic: keys and tenants in the admin store, ruleset reloads on the policy service.

Every change goes to Redis and is published to every gateway (:mod:`gateway.admin.directory`),
so it takes effect mesh-wide at once. A store that cannot be reached is a 503, never a 500.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from llmesh.v1 import policy_pb2_grpc
from redis.exceptions import RedisError

from gateway.admin.directory import Directory
from gateway.admin.records import check_tenant_name
from gateway.api.admin.protocol import (
    ApiKey,
    ApiKeyList,
    KeyCreateRequest,
    NewApiKey,
    RulesetReloadRequest,
    RulesetReloadResponse,
    Tenant,
    TenantList,
)
from gateway.mesh import Gateway
from services.runtime import context as rc
from services.runtime.errors import FailedPrecondition, NotFound, Unavailable

RELOAD_TIMEOUT_S = 30.0


@contextlib.contextmanager
def _store() -> Iterator[None]:
    try:
        yield
    except (RedisError, OSError) as exc:
        raise Unavailable(f"the admin store (Redis) is unreachable: {exc}", retry_after_s=1.0) from None


def _directory(gateway: Gateway) -> Directory:
    directory = gateway.auth.directory
    if directory is None:
        raise Unavailable("this gateway has no admin store")
    return directory


# -- keys -----------------------------------------------------------------------------------------


async def create_key(gateway: Gateway, body: KeyCreateRequest) -> NewApiKey:
    directory = _directory(gateway)
    check_tenant_name(body.tenant)
    with _store():
        if body.tenant not in gateway.settings.tenants and await directory.tenants.get(body.tenant) is None:
            raise NotFound(
                f"no tenant named {body.tenant!r}: create it first (PUT /v1/admin/tenants/{body.tenant})"
            )
        record, secret = await directory.keys.create(body.tenant, body.name, body.expires_in)
    return NewApiKey.with_secret(record, secret)


async def list_keys(gateway: Gateway, tenant: str | None) -> ApiKeyList:
    with _store():
        records = await _directory(gateway).keys.records(tenant)
    return ApiKeyList(data=[ApiKey.from_record(r) for r in records])


async def get_key(gateway: Gateway, key_id: str) -> ApiKey:
    with _store():
        return ApiKey.from_record(await _directory(gateway).keys.require(key_id))


async def rotate_key(gateway: Gateway, key_id: str) -> NewApiKey:
    with _store():
        record, secret = await _directory(gateway).keys.rotate(key_id)
    return NewApiKey.with_secret(record, secret)


async def revoke_key(gateway: Gateway, key_id: str) -> ApiKey:
    with _store():
        return ApiKey.from_record(await _directory(gateway).keys.revoke(key_id))


# -- tenants --------------------------------------------------------------------------------------


async def put_tenant(gateway: Gateway, name: str, values: dict[str, Any]) -> tuple[Tenant, bool]:
    """Creates or replaces the tenant; returns it and whether it was created."""
    with _store():
        record, created = await _directory(gateway).tenants.put(name, values)
    return Tenant.from_record(record), created


async def patch_tenant(gateway: Gateway, name: str, values: dict[str, Any]) -> Tenant:
    with _store():
        record = await _directory(gateway).tenants.patch(name, values, gateway.settings.tenants.get(name))
    return Tenant.from_record(record)


async def get_tenant(gateway: Gateway, name: str) -> Tenant:
    check_tenant_name(name)
    with _store():
        record = await _directory(gateway).tenants.get(name)
    if record is not None:
        return Tenant.from_record(record)
    configured = gateway.settings.tenants.get(name)
    if configured is None:
        raise NotFound(f"no tenant named {name!r}")
    return Tenant.configured(name, configured)


async def list_tenants(gateway: Gateway) -> TenantList:
    """The stored tenants and the configured ones not stored, by name."""
    with _store():
        stored = {r.name: Tenant.from_record(r) for r in await _directory(gateway).tenants.records()}
    for name, settings in gateway.settings.tenants.items():
        stored.setdefault(name, Tenant.configured(name, settings))
    return TenantList(data=[stored[name] for name in sorted(stored)])


# -- rulesets -------------------------------------------------------------------------------------


async def reload_rulesets(gateway: Gateway, body: RulesetReloadRequest) -> RulesetReloadResponse:
    """The policy service's ReloadRules, with the policy admin token the gateway holds."""
    channel = gateway.channels.get("policy")
    if channel is None:
        raise FailedPrecondition("this gateway has no policy service (LLMESH_GATEWAY_POLICY_ADDRESS)")
    token = gateway.settings.policy_admin_token.get_secret_value()
    if not token:
        raise FailedPrecondition(
            "the gateway holds no policy admin token: set LLMESH_GATEWAY_POLICY_ADMIN_TOKEN to the "
            "policy service's LLMESH_POLICY_ADMIN_TOKEN (llmesh up does)"
        )
    # No tenant: the reload is the mesh's, not a tenant's.
    marker = rc.activate(rc.new_context(tenant=rc.NO_TENANT))
    try:
        reply = await policy_pb2_grpc.PolicyServiceStub(channel).ReloadRules(
            body.to_pb(), metadata=[("authorization", f"Bearer {token}")], timeout=RELOAD_TIMEOUT_S
        )
    finally:
        rc.deactivate(marker)
    return RulesetReloadResponse.from_pb(reply)
