"""``GET /v1/sessions``, ``GET /v1/sessions/{id}``, ``DELETE /v1/sessions/{id}``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response

from gateway.api.deps import Call, authenticated
from gateway.api.sessions import service

router = APIRouter()


@router.get("/v1/sessions", response_model=None)
async def list_sessions(
    call: Annotated[Call, Depends(authenticated)],
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    page_token: Annotated[str, Query(max_length=512)] = "",
) -> Response:
    return await service.list_sessions(call, limit, page_token)


@router.get("/v1/sessions/{session_id}", response_model=None)
async def get_session(session_id: str, call: Annotated[Call, Depends(authenticated)]) -> Response:
    return await service.get_session(call, session_id)


@router.delete("/v1/sessions/{session_id}", response_model=None)
async def delete_session(session_id: str, call: Annotated[Call, Depends(authenticated)]) -> Response:
    return await service.delete_session(call, session_id)
