"""``POST /v1/cache/purge``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends
from fastapi.responses import Response

from gateway.api.cache.protocol import PurgeRequest
from gateway.api.cache.service import purge_cache
from gateway.api.deps import Call, authenticated

router = APIRouter()


@router.post("/v1/cache/purge", response_model=None)
async def purge(
    call: Annotated[Call, Depends(authenticated)], body: Annotated[PurgeRequest | None, Body()] = None
) -> Response:
    return await purge_cache(body or PurgeRequest(), call)
