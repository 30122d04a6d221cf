"""What the gateway keeps for tenants: files, vector stores, and the jobs that fill them.

One :class:`Library` per gateway (opened in :meth:`gateway.mesh.Gateway.open`, closed in
``close``). Every call takes the tenant from the authenticated principal: ids of another
tenant are simply not found (404, never 403), because every key and collection is the
tenant's own. Reads of a tenant's stores first fail the jobs whose gateway died
(:meth:`Library.sweep`), so no file stays ``in_progress`` once its lease is gone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis
from llmesh.v1 import embeddings_pb2_grpc, policy_pb2_grpc

from gateway.vector_stores.collections import Chunking, CollectionClient, GrpcCollections, Hit
from gateway.vector_stores.documents import (
    FILE_ID_KEY,
    FILENAME_KEY,
    Attribute,
    decode_attributes,
    part_ids,
)
from gateway.vector_stores.extract import clean_filename, detect, extract
from gateway.vector_stores.files import FileStore, StoredFile
from gateway.vector_stores.ingest import INTERRUPTED, Ingestor, Job
from gateway.vector_stores.pages import PageQuery, new_id
from gateway.vector_stores.policy import DocumentPolicy, GrpcDocumentPolicy
from gateway.vector_stores.settings import VectorStoreSettings
from gateway.vector_stores.stores import FileRecord, FileStatus, Refs, StoreRecord, StoreRepo
from services.runtime import redis_client
from services.runtime.errors import FailedPrecondition, InvalidArgument, NotFound

log = logging.getLogger(__name__)

# Purposes a file may be uploaded with: what vector stores read. Batch and fine-tuning files
# have no use here, so they are refused rather than kept.
PURPOSES = frozenset({"assistants", "user_data"})
# Extraction runs in worker threads (PDF parsing is CPU work); at most this many at once.
EXTRACT_THREADS = 2


@dataclass(frozen=True, slots=True)
class Found:
    """One search result: a chunk, its score, and the file it came from."""

    file_id: str
    filename: str
    score: float
    text: str
    attributes: dict[str, Attribute]


class Library:
    """Files and vector stores of every tenant (see the module docstring)."""

    def __init__(
        self,
        settings: VectorStoreSettings,
        redis: aioredis.Redis,
        collections: CollectionClient | None,
        policy: DocumentPolicy,
    ) -> None:
        self.settings = settings
        self._redis = redis
        self.files = FileStore(
            redis, quota_bytes=settings.files_tenant_quota_bytes, max_files=settings.files_tenant_max_files
        )
        self.stores = StoreRepo(
            redis,
            max_stores=settings.vector_stores_tenant_max,
            max_files=settings.vector_stores_max_files,
            lease_s=settings.ingest_lease_s,
        )
        self._collections = collections
        self.ingestor = (
            None if collections is None else Ingestor(self.stores, self.files, collections, policy, settings)
        )
        self._extracting = asyncio.Semaphore(EXTRACT_THREADS)

    @classmethod
    def open(
        cls,
        settings: VectorStoreSettings,
        redis_url: str,
        embeddings: embeddings_pb2_grpc.EmbeddingServiceAsyncStub | None,
        policy: policy_pb2_grpc.PolicyServiceAsyncStub | None,
    ) -> Library:
        """The library over Redis at ``redis_url`` (connected on first use), with its jobs running."""
        redis = redis_client.connect(redis_url, socket_connect_timeout=1.0, socket_timeout=5.0)
        library = cls(
            settings,
            redis,
            None if embeddings is None else GrpcCollections(embeddings),
            GrpcDocumentPolicy(policy),
        )
        library.start()
        return library

    def start(self) -> None:
        if self.ingestor is not None:
            self.ingestor.start()

    async def close(self) -> None:
        if self.ingestor is not None:
            await self.ingestor.close()
        await self._redis.aclose()

    def _require_collections(self) -> CollectionClient:
        if self._collections is None:
            raise FailedPrecondition(
                "vector stores need the embeddings service, and this gateway has none "
                "(LLMESH_GATEWAY_EMBEDDINGS_ADDRESS)"
            )
        return self._collections

    # -- files --------------------------------------------------------------------------------

    async def upload(
        self, tenant: str, *, filename: str, content_type: str | None, purpose: str, data: bytes
    ) -> StoredFile:
        """Checks, extracts and stores an upload (400 naming what is wrong with it)."""
        if purpose not in PURPOSES:
            raise InvalidArgument(
                f"purpose: {purpose!r} is not supported here; files are kept for vector stores "
                f"({', '.join(sorted(PURPOSES))})"
            )
        name = clean_filename(filename)
        kind = detect(name, content_type)
        settings = self.settings
        async with self._extracting:
            extracted = await asyncio.to_thread(
                extract,
                data,
                kind,
                max_chars=settings.files_max_text_chars,
                max_pages=settings.files_max_pdf_pages,
            )
        return await self.files.create(
            tenant,
            filename=name,
            purpose=purpose,
            data=data,
            kind=kind,
            text=extracted.text,
            pages=extracted.pages,
        )

    # -- stores -------------------------------------------------------------------------------

    async def sweep(self, tenant: str) -> None:
        """Fails the tenant's jobs whose gateway died, and deletes what they wrote."""
        for store_id, refs in await self.stores.expired(tenant, INTERRUPTED):
            log.warning("ingestion of %s into %s was interrupted: marked failed", refs.file_id, store_id)
            await self._delete_refs(store_id, [refs], strict=False)

    async def create_store(
        self,
        tenant: str,
        *,
        name: str,
        metadata: dict[str, str],
        file_ids: Sequence[str],
        chunking: Chunking | None,
        fail_open: bool,
    ) -> StoreRecord:
        self._require_collections()
        found = await self.files.find(tenant, file_ids)
        for file_id, meta in zip(file_ids, found, strict=True):
            if meta is None:
                raise NotFound(f"file_ids: no such file: {file_id!r}")
        store = await self.stores.create(tenant, name, metadata)
        for file_id in dict.fromkeys(file_ids):
            await self.attach(
                tenant, store.id, file_id, attributes={}, chunking=chunking, fail_open=fail_open
            )
        return await self.stores.get(tenant, store.id)

    async def get_store(self, tenant: str, store_id: str) -> StoreRecord:
        await self.sweep(tenant)
        return await self.stores.get(tenant, store_id)

    async def list_stores(self, tenant: str, query: PageQuery) -> tuple[list[StoreRecord], bool]:
        await self.sweep(tenant)
        return await self.stores.page(tenant, query)

    async def update_store(
        self, tenant: str, store_id: str, *, name: str | None, metadata: dict[str, str] | None
    ) -> StoreRecord:
        fields: dict[str, str] = {"last_active_at": str(int(time.time()))}
        if name is not None:
            fields["name"] = name
        if metadata is not None:
            fields["metadata"] = json.dumps(metadata)
        await self.stores.update(tenant, store_id, fields)
        return await self.get_store(tenant, store_id)

    async def delete_store(self, tenant: str, store_id: str) -> None:
        """Deletes the store's documents from its collection, then the store (503 and nothing
        changed when the embeddings service cannot delete them now)."""
        await self.stores.get(tenant, store_id)
        before = await self.stores.delete_refs(tenant, store_id)
        if before:
            await self._delete_refs(store_id, before, strict=True)
        removed = await self.stores.delete(tenant, store_id)
        if removed is None:
            raise NotFound(f"no such vector store: {store_id!r}")
        # Attempts that started or finished between the two reads.
        later = [r for r in removed if r not in before]
        if later:
            await self._delete_refs(store_id, later, strict=False)

    async def _delete_refs(self, store_id: str, refs: Sequence[Refs], *, strict: bool) -> None:
        ids = [i for r in refs for i in part_ids(r.file_id, r.job, r.parts)]
        if not ids or self._collections is None:
            return
        try:
            await self._collections.delete(store_id, ids)
        except Exception as exc:
            if strict:
                raise
            log.warning("cannot delete %d documents of %s: %s", len(ids), store_id, exc)

    # -- attached files -----------------------------------------------------------------------

    async def attach(
        self,
        tenant: str,
        store_id: str,
        file_id: str,
        *,
        attributes: dict[str, Attribute],
        chunking: Chunking | None,
        fail_open: bool,
    ) -> FileRecord:
        """Attaches a file and starts its ingestion; an attached file is returned as it is,
        a failed one is ingested again."""
        self._require_collections()
        ingestor = self.ingestor
        assert ingestor is not None
        await self.stores.get(tenant, store_id)
        await self.files.get(tenant, file_id)
        try:
            previous = await self.stores.get_file(tenant, store_id, file_id)
        except NotFound:
            previous = None
        if previous is not None and previous.status in ("failed", "cancelled"):
            # What the failed attempt may have left must go before a new attempt starts.
            await self._delete_refs(store_id, [Refs(file_id, previous.job, previous.parts)], strict=True)
        ingestor.reserve()
        job = new_id("")[-8:]
        try:
            outcome = await self.stores.attach(
                tenant,
                store_id,
                file_id,
                job=job,
                attributes=attributes,
                chunking=None
                if chunking is None
                else {
                    "max_chunk_size_tokens": chunking.max_tokens,
                    "chunk_overlap_tokens": chunking.overlap_tokens,
                },
            )
        except BaseException:
            ingestor.release()
            raise
        if outcome == "exists":
            ingestor.release()
        else:
            ingestor.submit(Job(tenant, store_id, file_id, job, attributes, chunking, fail_open))
        return await self.stores.get_file(tenant, store_id, file_id)

    async def get_attached(self, tenant: str, store_id: str, file_id: str) -> FileRecord:
        await self.sweep(tenant)
        await self.stores.get(tenant, store_id)
        return await self.stores.get_file(tenant, store_id, file_id)

    async def list_attached(
        self, tenant: str, store_id: str, query: PageQuery, status: FileStatus | None
    ) -> tuple[list[FileRecord], bool]:
        await self.sweep(tenant)
        await self.stores.get(tenant, store_id)
        return await self.stores.list_files(tenant, store_id, query, status)

    async def detach(self, tenant: str, store_id: str, file_id: str) -> None:
        """Deletes the file's documents from the store's collection, then its record."""
        await self.stores.get(tenant, store_id)
        record = await self.stores.get_file(tenant, store_id, file_id)
        first = Refs(file_id, record.job, record.parts)
        await self._delete_refs(store_id, [first], strict=True)
        removed = await self.stores.detach(tenant, store_id, file_id)
        if removed is None:
            raise NotFound(f"no such file in vector store {store_id!r}: {file_id!r}")
        if removed != first:
            await self._delete_refs(store_id, [removed], strict=False)

    # -- search -------------------------------------------------------------------------------

    async def search(
        self,
        tenant: str,
        store_id: str,
        queries: Sequence[str],
        *,
        top_k: int,
        min_score: float,
        filters: Mapping[str, str],
    ) -> list[Found]:
        """The best chunks for any of ``queries`` (each chunk once, with its best score)."""
        collections = self._require_collections()
        await self.sweep(tenant)
        await self.stores.update(tenant, store_id, {"last_active_at": str(int(time.time()))})
        replies = await asyncio.gather(
            *(collections.search(store_id, q, top_k, min_score, filters) for q in queries)
        )
        best: dict[tuple[str, str], Hit] = {}
        for hits in replies:
            for hit in hits:
                key = (hit.document_id, hit.text)
                if key not in best or hit.score > best[key].score:
                    best[key] = hit
        ranked = sorted(best.values(), key=lambda h: h.score, reverse=True)[:top_k]
        return [
            Found(
                file_id=h.metadata.get(FILE_ID_KEY, ""),
                filename=h.metadata.get(FILENAME_KEY, ""),
                score=h.score,
                text=h.text,
                attributes=decode_attributes(h.metadata),
            )
            for h in ranked
        ]
