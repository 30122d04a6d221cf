"""The admin API: ``/v1/admin/keys``, ``/v1/admin/tenants``, ``/v1/admin/rulesets/reload``.

Authenticated by :class:`~gateway.api.guard.RequestGuard` with the gateway's admin token (never
an API key), before the body is read; left out of the public OpenAPI schema.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query
from fastapi.responses import JSONResponse

from gateway.api.admin import service
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
from gateway.api.deps import admin
from gateway.mesh import Gateway
from services.runtime.limits import MAX_IDENTIFIER_CHARS

router = APIRouter(prefix="/v1/admin", include_in_schema=False)
Admin = Annotated[Gateway, Depends(admin)]
Settings = Annotated[dict[str, Any], Body()]


@router.post("/keys", status_code=201)
async def create_key(gateway: Admin, body: KeyCreateRequest) -> NewApiKey:
    return await service.create_key(gateway, body)


@router.get("/keys")
async def list_keys(
    gateway: Admin, tenant: Annotated[str | None, Query(max_length=MAX_IDENTIFIER_CHARS)] = None
) -> ApiKeyList:
    return await service.list_keys(gateway, tenant)


@router.get("/keys/{key_id}")
async def get_key(gateway: Admin, key_id: str) -> ApiKey:
    return await service.get_key(gateway, key_id)


@router.post("/keys/{key_id}/rotate")
async def rotate_key(gateway: Admin, key_id: str) -> NewApiKey:
    return await service.rotate_key(gateway, key_id)


@router.delete("/keys/{key_id}")
async def revoke_key(gateway: Admin, key_id: str) -> ApiKey:
    return await service.revoke_key(gateway, key_id)


@router.get("/tenants")
async def list_tenants(gateway: Admin) -> TenantList:
    return await service.list_tenants(gateway)


@router.get("/tenants/{name}")
async def get_tenant(gateway: Admin, name: str) -> Tenant:
    return await service.get_tenant(gateway, name)


@router.put("/tenants/{name}", response_model=None)
async def put_tenant(gateway: Admin, name: str, settings: Settings) -> JSONResponse:
    tenant, created = await service.put_tenant(gateway, name, settings)
    return JSONResponse(tenant.model_dump(), status_code=201 if created else 200)


@router.patch("/tenants/{name}")
async def patch_tenant(gateway: Admin, name: str, settings: Settings) -> Tenant:
    return await service.patch_tenant(gateway, name, settings)


@router.post("/rulesets/reload")
async def reload_rulesets(
    gateway: Admin, body: Annotated[RulesetReloadRequest | None, Body()] = None
) -> RulesetReloadResponse:
    return await service.reload_rulesets(gateway, body or RulesetReloadRequest())
