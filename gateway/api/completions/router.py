"""``POST /v1/completions``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from gateway.api.completions.protocol import CompletionRequest
from gateway.api.completions.service import create_completion
from gateway.api.deps import Call, authenticated

router = APIRouter()


@router.post("/v1/completions", response_model=None)
async def completions(call: Annotated[Call, Depends(authenticated)], body: CompletionRequest) -> Response:
    return await create_completion(body, call)
