"""``GET /v1/models`` and ``GET /v1/models/{model}``: the served models the caller may use."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel

from gateway.api.deps import Call, authenticated
from gateway.upstream_inference import ModelInfo
from services.runtime.errors import NotFound

router = APIRouter()
CREATED = 1_700_000_000


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = CREATED
    owned_by: str = "llmesh"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def _card(info: ModelInfo) -> ModelCard:
    return ModelCard(id=info.name, max_model_len=info.max_model_len or None)


@router.get("/v1/models")
async def list_models(call: Annotated[Call, Depends(authenticated)]) -> ModelList:
    allowed = call.principal.settings.models
    infos = await call.gateway.inference.list_models()
    return ModelList(data=[_card(i) for i in infos if not allowed or i.name in allowed])


@router.get("/v1/models/{model:path}")
async def get_model(model: str, call: Annotated[Call, Depends(authenticated)]) -> ModelCard:
    info = await call.gateway.inference.model_info(model)
    allowed = call.principal.settings.models
    if allowed and info.name not in allowed and model not in allowed:
        raise NotFound(f"the model {model!r} does not exist")
    return _card(info)
