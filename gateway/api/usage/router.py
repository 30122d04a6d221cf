"""``GET /v1/usage`` (the calling tenant) and ``GET /v1/admin/usage`` (every tenant; admin token)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse, Response

from gateway.api.context import response_headers
from gateway.api.deps import Call, admin, authenticated
from gateway.api.usage import service
from gateway.api.usage.protocol import UsageReportList
from gateway.mesh import Gateway
from services.runtime.errors import InvalidArgument
from services.runtime.limits import KEY_IDENTIFIER_CHARS

router = APIRouter()


@router.get("/v1/usage", response_model=None)
async def usage(
    call: Annotated[Call, Depends(authenticated)],
    start: Annotated[dt.date | None, Query(description="first UTC day (YYYY-MM-DD); default: end")] = None,
    end: Annotated[dt.date | None, Query(description="last UTC day (YYYY-MM-DD); default: today")] = None,
) -> Response:
    report = await service.tenant_report(call.gateway, call.principal.tenant, start, end)
    return JSONResponse(report.model_dump(), headers=response_headers(call.ctx))


@router.get("/v1/admin/usage")
async def admin_usage(
    gateway: Annotated[Gateway, Depends(admin)],
    start: Annotated[dt.date | None, Query()] = None,
    end: Annotated[dt.date | None, Query()] = None,
    tenant: Annotated[str | None, Query(min_length=1, max_length=128)] = None,
) -> UsageReportList:
    if tenant is not None and not KEY_IDENTIFIER_CHARS.issuperset(tenant):
        raise InvalidArgument("tenant must be 1-128 characters of [A-Za-z0-9-_.]")
    return await service.all_reports(gateway, start, end, tenant)
