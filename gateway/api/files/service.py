"""Files: upload, list, retrieve, content, delete (the tenant's own, in :mod:`gateway.vector_stores`)."""

from __future__ import annotations

from urllib.parse import quote

from fastapi.responses import JSONResponse, Response

from gateway.api.context import response_headers
from gateway.api.deps import Call
from gateway.api.files.protocol import FileDeleted, FileList, FileObject
from gateway.errors import openai_body
from gateway.vector_stores.extract import MEDIA_TYPES
from gateway.vector_stores.library import Library
from gateway.vector_stores.pages import Order, PageQuery
from services.runtime.errors import FailedPrecondition, InvalidArgument


def library_of(call: Call) -> Library:
    library = call.gateway.library
    if library is None:
        raise FailedPrecondition("files and vector stores are off on this gateway")
    return library


def _json(payload: object, call: Call, status: int = 200, **headers: str) -> JSONResponse:
    return JSONResponse(payload, status_code=status, headers={**response_headers(call.ctx), **headers})


def too_large(size: int, limit: int, call: Call) -> Response:
    """413 with OpenAI's error body, naming the file's size and the limit."""
    body = openai_body(
        f"file: the file is {size} bytes, over the limit of {limit} bytes",
        "invalid_request_error",
        "file",
        "file_too_large",
    )
    return _json(body, call, 413)


async def create_file(
    call: Call, *, filename: str, content_type: str | None, purpose: str, data: bytes, extra_fields: list[str]
) -> Response:
    library = library_of(call)
    if any(name.startswith("expires_after") for name in extra_fields):
        raise InvalidArgument("expires_after: not supported; files are kept until deleted")
    limit = library.settings.files_max_bytes
    if len(data) > limit:
        return too_large(len(data), limit, call)
    stored = await library.upload(
        call.principal.tenant, filename=filename, content_type=content_type, purpose=purpose, data=data
    )
    return _json(FileObject.of(stored).model_dump(), call)


async def list_files(
    call: Call, *, limit: int, order: Order, after: str | None, purpose: str | None
) -> Response:
    files, more = await library_of(call).files.page(
        call.principal.tenant, PageQuery(limit, order, after=after), purpose
    )
    return _json(FileList.of(files, more).model_dump(), call)


async def retrieve_file(call: Call, file_id: str) -> Response:
    stored = await library_of(call).files.get(call.principal.tenant, file_id)
    return _json(FileObject.of(stored).model_dump(), call)


async def file_content(call: Call, file_id: str) -> Response:
    stored, data = await library_of(call).files.content(call.principal.tenant, file_id)
    headers = {
        **response_headers(call.ctx),
        "content-disposition": f"attachment; filename*=UTF-8''{quote(stored.filename, safe='')}",
    }
    return Response(data, media_type=MEDIA_TYPES[stored.kind], headers=headers)


async def delete_file(call: Call, file_id: str) -> Response:
    await library_of(call).files.delete(call.principal.tenant, file_id)
    return _json(FileDeleted(id=file_id).model_dump(), call)
