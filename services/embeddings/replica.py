"""This replica's in-memory view of each collection, kept in step with Redis.

A search first brings the collection's view up to date: the change log in Redis
says which documents changed after the version the view holds, and one atomic
read returns them as they are now. Concurrent searches share one sync (a search
that arrives while a sync is running waits for it, and one that started after it
arrived is good enough). The version a search reports is the log entry its view
reflects.

The consistency bound: a caller whose version floor is ahead of the view makes
the search sync even when ``sync_interval_s`` would let it skip, and if the sync
cannot finish within ``catchup_timeout_s`` (Redis down, a large rebuild under
way) the search fails UNAVAILABLE rather than answer from an older view. With a
floor the view already meets, a search whose sync fails (Redis down) is served
from the view it has.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from redis.exceptions import RedisError

from services.embeddings.encoder import ModelInfo, Vectors
from services.embeddings.index import Hit, IndexParams, VectorIndex
from services.embeddings.store import CollectionMeta, CollectionStore, DocumentState
from services.runtime.errors import FailedPrecondition, NotFound, Unavailable

log = logging.getLogger(__name__)

_APPLY_BATCH = 500
_REBUILD_ATTEMPTS = 3


@dataclass(slots=True)
class _View:
    # Held while the index is read (a search) or changed (applying a delta, swapping a rebuild).
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    index: VectorIndex | None = None
    epoch: str = ""
    version: int = 0
    # The sync in flight (at most one per view; it outlives the searches that wait for it).
    sync: asyncio.Task[None] | None = None
    # time.monotonic() when the sync in flight, or else the last successful one, started.
    sync_started: float = float("-inf")
    synced_at: float = float("-inf")
    used_at: float = 0.0


@dataclass(frozen=True, slots=True)
class SearchResult:
    hits: list[Hit]
    version: int


class Replicas:
    """Per (tenant, collection) views of the collections this replica has searched."""

    def __init__(
        self,
        store: CollectionStore,
        model: ModelInfo,
        params: IndexParams,
        *,
        sync_interval_s: float = 0.0,
        catchup_timeout_s: float = 2.0,
        max_resident_chunks: int = 2_000_000,
    ) -> None:
        self._store = store
        self._model = model
        self._params = params
        self._sync_interval_s = sync_interval_s
        self._catchup_timeout_s = catchup_timeout_s
        self._max_resident_chunks = max_resident_chunks
        self._views: dict[tuple[str, str], _View] = {}

    def held_version(self, tenant: str, collection: str) -> int:
        """The version this replica's view of a collection reflects (0 = none)."""
        view = self._views.get((tenant, collection))
        return view.version if view is not None and view.index is not None else 0

    async def close(self) -> None:
        for view in self._views.values():
            if view.sync is not None and not view.sync.done():
                view.sync.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await view.sync

    async def search(
        self,
        tenant: str,
        collection: str,
        query: Vectors,
        k: int,
        *,
        filters: Mapping[str, str],
        min_score: float,
        floor: int,
        time_remaining: float | None = None,
    ) -> SearchResult:
        """Top-k hits from a view at least as new as ``floor`` (and as Redis, when reachable)."""
        view = self._views.setdefault((tenant, collection), _View())
        arrived = view.used_at = time.monotonic()
        budget = self._catchup_timeout_s
        if time_remaining is not None:
            budget = min(budget, time_remaining)
        deadline = arrived + budget
        if view.index is None or floor > view.version or arrived - view.synced_at >= self._sync_interval_s:
            await self._catch_up(
                view, tenant=tenant, collection=collection, floor=floor, arrived=arrived, deadline=deadline
            )
            self._evict(keep=view)
        async with view.lock:
            assert view.index is not None
            hits = view.index.search(query, k, filters=filters, min_score=min_score)
            return SearchResult(hits, view.version)

    async def _catch_up(
        self, view: _View, *, tenant: str, collection: str, floor: int, arrived: float, deadline: float
    ) -> None:
        """Waits (until ``deadline``) for a sync that started after ``arrived``: the one in flight if
        it did, else a new one once the one in flight ends. Concurrent searches share syncs."""
        try:
            while True:
                task = view.sync
                if task is None or task.done():
                    task = view.sync = asyncio.get_running_loop().create_task(
                        self._sync(view, tenant, collection), name=f"sync {tenant}/{collection}"
                    )
                    task.add_done_callback(_retrieve)
                    view.sync_started = time.monotonic()
                mine = view.sync_started >= arrived
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await asyncio.shield(task)
                if mine:
                    return
        except (TimeoutError, RedisError, OSError) as exc:
            if view.index is not None and floor <= view.version:
                log.warning(
                    "collection %s/%s: no fresh sync (%s); serving version %d, which meets the floor %d",
                    tenant,
                    collection,
                    type(exc).__name__,
                    view.version,
                    floor,
                )
                return
            if view.index is None and isinstance(exc, TimeoutError):
                raise Unavailable(
                    f"collection {collection!r} is being loaded on this replica; retry shortly",
                    retry_after_s=1.0,
                ) from None
            raise Unavailable(
                f"collection {collection!r} cannot be brought up to date on this replica "
                f"(holds version {view.version}, caller needs {floor}): {type(exc).__name__}",
                retry_after_s=1.0,
            ) from exc

    async def _sync(self, view: _View, tenant: str, collection: str) -> None:
        started = time.monotonic()
        rebuild = view.index is None
        for _ in range(_REBUILD_ATTEMPTS):
            if rebuild:
                index, epoch, version = await self._build(tenant, collection)
            else:
                assert view.index is not None
                index, epoch, version = view.index, view.epoch, view.version
            changes = await self._store.changes(tenant, collection, version, epoch)
            if changes.kind == "missing":
                self._views.pop((tenant, collection), None)
                raise NotFound(f"collection {collection!r} does not exist")
            if changes.kind == "rebuild":
                rebuild = True  # the old view keeps serving floors it meets until the new one is ready
                continue
            async with view.lock:
                if changes.kind == "delta":
                    await self._apply(index, changes.documents)
                    version = changes.version
                view.index, view.epoch, view.version = index, epoch, version
            view.synced_at = started
            return
        raise Unavailable(f"collection {collection!r} changes faster than this replica can rebuild it")

    async def _build(self, tenant: str, collection: str) -> tuple[VectorIndex, str, int]:
        """A new index from a scan of Redis, built off the view's lock."""
        meta, documents = await self._store.snapshot(tenant, collection)
        if meta is None:
            self._views.pop((tenant, collection), None)
            raise NotFound(f"collection {collection!r} does not exist")
        self.check_model(meta)
        index = VectorIndex(meta.dimension, self._params)
        batch: list[DocumentState] = []
        async for document in documents:
            batch.append(document)
            if len(batch) >= _APPLY_BATCH:
                await self._apply(index, batch)
                batch = []
        await self._apply(index, batch)
        log.info(
            "collection %s/%s rebuilt from Redis at version %d: %d chunks (%s)",
            tenant,
            collection,
            meta.version,
            index.chunk_count,
            "hnsw" if index.uses_hnsw else "exact",
        )
        return index, meta.epoch, meta.version

    def _evict(self, keep: _View) -> None:
        """Drops the least recently searched views while the resident chunks exceed the limit (an
        evicted collection is rebuilt from Redis when it is searched again)."""
        total = sum(v.index.chunk_count for v in self._views.values() if v.index is not None)
        if total <= self._max_resident_chunks:
            return
        idle = sorted(
            (
                (view.used_at, key)
                for key, view in self._views.items()
                if view is not keep and view.index is not None and (view.sync is None or view.sync.done())
            ),
        )
        for _, key in idle:
            if total <= self._max_resident_chunks:
                break
            view = self._views.pop(key)
            assert view.index is not None
            total -= view.index.chunk_count
            log.info("evicted collection %s/%s (%d chunks) from this replica", *key, view.index.chunk_count)

    def check_model(self, meta: CollectionMeta) -> None:
        if meta.model != self._model.name or meta.dimension != self._model.dimension:
            raise FailedPrecondition(
                f"collection {meta.name!r} holds vectors of model {meta.model!r} (dimension "
                f"{meta.dimension}); this service embeds with {self._model.name!r} (dimension "
                f"{self._model.dimension}). Search it with a service running that model, or re-ingest."
            )

    @staticmethod
    async def _apply(index: VectorIndex | None, documents: Sequence[DocumentState]) -> None:
        if index is None or not documents:
            return

        changes = [(doc.document_id, doc.records, doc.vectors) for doc in documents]

        await asyncio.to_thread(index.apply, changes)


def _retrieve(task: asyncio.Task[None]) -> None:
    """Marks a sync's failure as seen: the searches that waited for it got it already, or timed out."""
    if not task.cancelled():
        task.exception()
