"""Vector stores: OpenAI requests -> the tenant's :class:`~gateway.vector_stores.library.Library`."""

from __future__ import annotations

from fastapi.responses import JSONResponse, Response

from gateway.api.context import response_headers
from gateway.api.deps import Call
from gateway.api.files.service import library_of
from gateway.api.vector_stores.protocol import (
    CreateVectorStoreFileRequest,
    CreateVectorStoreRequest,
    CursorPage,
    FileContentPage,
    SearchPage,
    SearchRequest,
    SearchResult,
    TextContent,
    UpdateVectorStoreRequest,
    VectorStoreDeleted,
    VectorStoreFileDeleted,
    VectorStoreFileObject,
    VectorStoreObject,
)
from gateway.vector_stores.pages import Order, PageQuery
from gateway.vector_stores.stores import FileStatus
from services.runtime.errors import NotFound

# How soon the SDK's poll helpers (create_and_poll, upload_and_poll) ask again while a file
# is in progress (OpenAI's openai-poll-after-ms header).
POLL_AFTER_MS = 250


def _json(payload: object, call: Call, **headers: str) -> JSONResponse:
    return JSONResponse(payload, headers={**response_headers(call.ctx), **headers})


def _file(record: VectorStoreFileObject, call: Call) -> JSONResponse:
    extra = {"openai-poll-after-ms": str(POLL_AFTER_MS)} if record.status == "in_progress" else {}
    return _json(record.model_dump(), call, **extra)


async def create_store(body: CreateVectorStoreRequest, call: Call) -> Response:
    chunking = body.chunking_strategy.to_chunking() if body.chunking_strategy else None
    store = await library_of(call).create_store(
        call.principal.tenant,
        name=body.name,
        metadata=body.metadata or {},
        file_ids=body.file_ids,
        chunking=chunking,
        fail_open=call.principal.settings.policy_fail_open,
    )
    return _json(VectorStoreObject.of(store).model_dump(), call)


async def list_stores(
    call: Call, *, limit: int, order: Order, after: str | None, before: str | None
) -> Response:
    stores, more = await library_of(call).list_stores(
        call.principal.tenant, PageQuery(limit, order, after, before)
    )
    return _json(CursorPage.of([VectorStoreObject.of(s) for s in stores], more).model_dump(), call)


async def retrieve_store(call: Call, store_id: str) -> Response:
    store = await library_of(call).get_store(call.principal.tenant, store_id)
    return _json(VectorStoreObject.of(store).model_dump(), call)


async def update_store(body: UpdateVectorStoreRequest, call: Call, store_id: str) -> Response:
    store = await library_of(call).update_store(
        call.principal.tenant, store_id, name=body.name, metadata=body.metadata
    )
    return _json(VectorStoreObject.of(store).model_dump(), call)


async def delete_store(call: Call, store_id: str) -> Response:
    await library_of(call).delete_store(call.principal.tenant, store_id)
    return _json(VectorStoreDeleted(id=store_id).model_dump(), call)


async def attach_file(body: CreateVectorStoreFileRequest, call: Call, store_id: str) -> Response:
    record = await library_of(call).attach(
        call.principal.tenant,
        store_id,
        body.file_id,
        attributes=body.checked_attributes(),
        chunking=body.chunking_strategy.to_chunking() if body.chunking_strategy else None,
        fail_open=call.principal.settings.policy_fail_open,
    )
    return _file(VectorStoreFileObject.of(record), call)


async def list_files(
    call: Call,
    store_id: str,
    *,
    limit: int,
    order: Order,
    after: str | None,
    before: str | None,
    status: FileStatus | None,
) -> Response:
    records, more = await library_of(call).list_attached(
        call.principal.tenant, store_id, PageQuery(limit, order, after, before), status
    )
    page = CursorPage.of([VectorStoreFileObject.of(r) for r in records], more)
    return _json(page.model_dump(), call)


async def retrieve_file(call: Call, store_id: str, file_id: str) -> Response:
    record = await library_of(call).get_attached(call.principal.tenant, store_id, file_id)
    return _file(VectorStoreFileObject.of(record), call)


async def file_content(call: Call, store_id: str, file_id: str) -> Response:
    """The attached file's text, as it was ingested (while the file itself is kept)."""
    library = library_of(call)
    tenant = call.principal.tenant
    await library.get_attached(tenant, store_id, file_id)
    found = await library.files.text(tenant, file_id)
    if found is None:
        raise NotFound(f"the file {file_id!r} was deleted: its text is only in the store's chunks now")
    return _json(FileContentPage(data=[TextContent(text=found[1])]).model_dump(), call)


async def detach_file(call: Call, store_id: str, file_id: str) -> Response:
    await library_of(call).detach(call.principal.tenant, store_id, file_id)
    return _json(VectorStoreFileDeleted(id=file_id).model_dump(), call)


async def search(body: SearchRequest, call: Call, store_id: str) -> Response:
    library = library_of(call)
    tenant = call.principal.tenant
    await library.get_store(tenant, store_id)
    queries = body.queries()
    filters = body.metadata_filters()
    found = []
    if filters is not None:
        threshold = body.ranking_options.score_threshold if body.ranking_options else 0.0
        found = await library.search(
            tenant, store_id, queries, top_k=body.max_num_results, min_score=threshold, filters=filters
        )
    page = SearchPage(search_query=queries, data=[SearchResult.of(f) for f in found])
    return _json(page.model_dump(), call)
