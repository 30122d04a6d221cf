"""``POST /v1/chat/completions``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from gateway.api.chat.protocol import ChatCompletionRequest
from gateway.api.chat.service import create_chat_completion
from gateway.api.deps import Call, authenticated

router = APIRouter()


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(
    call: Annotated[Call, Depends(authenticated)], body: ChatCompletionRequest
) -> Response:
    return await create_chat_completion(body, call)
