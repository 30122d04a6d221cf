"""Cache purge: HTTP body -> :class:`gateway.tenant_cache.TenantCache` -> JSON + ``X-Cache-Version``."""

from __future__ import annotations

from fastapi.responses import JSONResponse, Response

from gateway.api.cache.protocol import PurgeRequest, PurgeResponse
from gateway.api.context import response_headers
from gateway.api.deps import Call


async def purge_cache(body: PurgeRequest, call: Call) -> Response:
    reply = await call.gateway.tenant_cache.purge(body.to_pb(), call.principal)
    # The header is the body's cache_version: the caller's floors merged with the new version.
    return JSONResponse(PurgeResponse.from_pb(reply).model_dump(), headers=response_headers(call.ctx))
