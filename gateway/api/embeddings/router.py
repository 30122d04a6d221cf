"""``POST /v1/embeddings``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from gateway.api.deps import Call, authenticated
from gateway.api.embeddings.protocol import EmbeddingRequest
from gateway.api.embeddings.service import create_embeddings

router = APIRouter()


@router.post("/v1/embeddings", response_model=None)
async def embeddings(call: Annotated[Call, Depends(authenticated)], body: EmbeddingRequest) -> Response:
    return await create_embeddings(body, call)
