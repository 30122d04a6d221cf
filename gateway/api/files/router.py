"""``/v1/files``: upload (multipart), list, retrieve, content, delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, File, Form, Query, Request, UploadFile
from fastapi.responses import Response

from gateway.api.deps import Call, authenticated
from gateway.api.files import service
from gateway.api.files.protocol import MAX_LIST_LIMIT
from gateway.vector_stores.pages import Order

router = APIRouter()


@router.post("/v1/files", response_model=None)
async def create_file(
    request: Request,
    call: Annotated[Call, Depends(authenticated)],
    file: Annotated[UploadFile, File(description="the file: .txt, .md, .html or .pdf")],
    purpose: Annotated[str, Form(max_length=64)],
) -> Response:
    form = await request.form()
    data = await file.read()
    return await service.create_file(
        call,
        filename=file.filename or "",
        content_type=file.content_type,
        purpose=purpose,
        data=data,
        extra_fields=[str(k) for k in form],
    )


@router.get("/v1/files", response_model=None)
async def list_files(
    call: Annotated[Call, Depends(authenticated)],
    limit: Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT)] = MAX_LIST_LIMIT,
    order: Order = "desc",
    after: Annotated[str | None, Query(max_length=128)] = None,
    purpose: Annotated[str | None, Query(max_length=64)] = None,
) -> Response:
    return await service.list_files(call, limit=limit, order=order, after=after, purpose=purpose)


@router.get("/v1/files/{file_id}", response_model=None)
async def retrieve_file(file_id: str, call: Annotated[Call, Depends(authenticated)]) -> Response:
    return await service.retrieve_file(call, file_id)


@router.get("/v1/files/{file_id}/content", response_model=None)
async def file_content(file_id: str, call: Annotated[Call, Depends(authenticated)]) -> Response:
    return await service.file_content(call, file_id)


@router.delete("/v1/files/{file_id}", response_model=None)
async def delete_file(file_id: str, call: Annotated[Call, Depends(authenticated)]) -> Response:
    return await service.delete_file(call, file_id)
