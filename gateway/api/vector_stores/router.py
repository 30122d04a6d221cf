"""``/v1/vector_stores``: stores, their files, and search (OpenAI's paths and shapes)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response

from gateway.api.deps import Call, authenticated
from gateway.api.vector_stores import service
from gateway.api.vector_stores.protocol import (
    MAX_LIST_LIMIT,
    CreateVectorStoreFileRequest,
    CreateVectorStoreRequest,
    SearchRequest,
    UpdateVectorStoreRequest,
)
from gateway.vector_stores.pages import Order
from gateway.vector_stores.stores import FileStatus

router = APIRouter()
Caller = Annotated[Call, Depends(authenticated)]
Limit = Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT)]
Cursor = Annotated[str | None, Query(max_length=128)]


@router.post("/v1/vector_stores", response_model=None)
async def create_store(body: CreateVectorStoreRequest, call: Caller) -> Response:
    return await service.create_store(body, call)


@router.get("/v1/vector_stores", response_model=None)
async def list_stores(
    call: Caller, limit: Limit = 20, order: Order = "desc", after: Cursor = None, before: Cursor = None
) -> Response:
    return await service.list_stores(call, limit=limit, order=order, after=after, before=before)


@router.get("/v1/vector_stores/{store_id}", response_model=None)
async def retrieve_store(store_id: str, call: Caller) -> Response:
    return await service.retrieve_store(call, store_id)


@router.post("/v1/vector_stores/{store_id}", response_model=None)
async def update_store(store_id: str, body: UpdateVectorStoreRequest, call: Caller) -> Response:
    return await service.update_store(body, call, store_id)


@router.delete("/v1/vector_stores/{store_id}", response_model=None)
async def delete_store(store_id: str, call: Caller) -> Response:
    return await service.delete_store(call, store_id)


@router.post("/v1/vector_stores/{store_id}/files", response_model=None)
async def attach_file(store_id: str, body: CreateVectorStoreFileRequest, call: Caller) -> Response:
    return await service.attach_file(body, call, store_id)


@router.get("/v1/vector_stores/{store_id}/files", response_model=None)
async def list_files(
    store_id: str,
    call: Caller,
    *,
    limit: Limit = 20,
    order: Order = "desc",
    after: Cursor = None,
    before: Cursor = None,
    filter: FileStatus | None = None,
) -> Response:
    return await service.list_files(
        call, store_id, limit=limit, order=order, after=after, before=before, status=filter
    )


@router.get("/v1/vector_stores/{store_id}/files/{file_id}", response_model=None)
async def retrieve_file(store_id: str, file_id: str, call: Caller) -> Response:
    return await service.retrieve_file(call, store_id, file_id)


@router.get("/v1/vector_stores/{store_id}/files/{file_id}/content", response_model=None)
async def file_content(store_id: str, file_id: str, call: Caller) -> Response:
    return await service.file_content(call, store_id, file_id)


@router.delete("/v1/vector_stores/{store_id}/files/{file_id}", response_model=None)
async def detach_file(store_id: str, file_id: str, call: Caller) -> Response:
    return await service.detach_file(call, store_id, file_id)


@router.post("/v1/vector_stores/{store_id}/search", response_model=None)
async def search(store_id: str, body: SearchRequest, call: Caller) -> Response:
    return await service.search(body, call, store_id)
