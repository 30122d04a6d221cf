"""Ingestion jobs: an attached file's text, checked by the policy, into the store's collection.

Each attach starts one job, an asyncio task of the gateway that accepted it
(:class:`Ingestor`, opened and closed with the :class:`~gateway.mesh.Gateway`). At most
``ingest_concurrency`` jobs run at once; the others wait their turn, at most
``ingest_max_queued`` in all (an attach past that is a 429). A job:

1. reads the file's text (extracted at upload);
2. has the policy check all of it as documents (:mod:`gateway.vector_stores.policy`);
3. records how many documents it will write (so anyone can delete them), then writes them
   with UpsertDocuments, each call all-or-nothing in the embeddings service;
4. sets the outcome: ``completed``, or ``failed`` with ``last_error`` {code, message}
   (``invalid_file`` for what is wrong with the file, ``server_error`` for the mesh).

Nothing half-written stays: a failed write deletes every document of the attempt, and so
does a job that finds it no longer owns its file (detached, store deleted, attached again).
While it lives, the gateway renews every job's lease in Redis; a gateway that dies leaves
leases that run out, and the next gateway reading the tenant's stores fails those jobs
("ingestion interrupted") and deletes what they wrote (:meth:`StoreRepo.expired`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

import grpc

from gateway.vector_stores.collections import Chunking, CollectionClient
from gateway.vector_stores.documents import (
    Attribute,
    batches,
    part_ids,
    parts,
    split_text,
    text_batches,
)
from gateway.vector_stores.files import FileStore
from gateway.vector_stores.policy import POLICY_DOCUMENT_CHARS, DocumentBlocked, DocumentPolicy
from gateway.vector_stores.settings import VectorStoreSettings
from gateway.vector_stores.stores import StoreRepo
from services.runtime import context as rc
from services.runtime.errors import LlmeshError, ResourceExhausted
from services.runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)

INTERRUPTED = (
    "ingestion interrupted: the gateway running it stopped before it finished; attach the file again"
)
STOPPED = "ingestion interrupted: the gateway stopped; attach the file again"
# Time a stopping gateway gives each job to delete what it wrote and record why it stopped.
ABANDON_TIMEOUT_S = 5.0


@dataclass
class Job:
    """One attempt at ingesting one file into one store."""

    tenant: str
    store_id: str
    file_id: str
    job: str
    attributes: dict[str, Attribute]
    chunking: Chunking | None
    fail_open: bool
    # Documents this attempt writes (known before the first write), and whether it lost its file.
    parts: int = 0
    lost: bool = False
    task: asyncio.Task[None] | None = field(default=None, repr=False)


def error_of(exc: BaseException) -> tuple[str, str]:
    """``last_error`` {code, message} for what stopped a job."""
    if isinstance(exc, grpc.aio.AioRpcError):
        details = exc.details() or exc.code().name
        if exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
            return "invalid_file", details
        return "server_error", f"the embeddings service answered {exc.code().name}: {details}"
    if isinstance(exc, TimeoutError):
        return "server_error", "ingestion took longer than the gateway's ingest_timeout_s"
    if isinstance(exc, LlmeshError):
        return "server_error", exc.message
    return "server_error", f"internal error ({type(exc).__name__})"


class Ingestor:
    """Runs the gateway's ingestion jobs and keeps their leases (see the module docstring)."""

    def __init__(
        self,
        repo: StoreRepo,
        files: FileStore,
        collections: CollectionClient,
        policy: DocumentPolicy,
        settings: VectorStoreSettings,
    ) -> None:
        self._repo = repo
        self._files = files
        self._collections = collections
        self._policy = policy
        self._settings = settings
        self._turns = asyncio.Semaphore(settings.ingest_concurrency)
        self._jobs: dict[str, Job] = {}
        self._reserved = 0
        self._renewer: asyncio.Task[None] | None = None

    @property
    def running(self) -> int:
        return len(self._jobs)

    def start(self) -> None:
        if self._renewer is None:
            self._renewer = asyncio.create_task(self._renew(), name="ingest lease renewer")

    async def close(self) -> None:
        """Stops every job: each deletes what it wrote and records that it was interrupted."""
        if self._renewer is not None:
            await cancel_and_wait(self._renewer)
            self._renewer = None
        tasks = [j.task for j in self._jobs.values() if j.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- admission ----------------------------------------------------------------------------

    def reserve(self) -> None:
        """Holds a place for one job; ResourceExhausted (429) when the queue is full."""
        if len(self._jobs) + self._reserved >= self._settings.ingest_max_queued:
            raise ResourceExhausted(
                f"this gateway already has {self._settings.ingest_max_queued} files waiting to be "
                "ingested; retry shortly",
                retry_after_s=5.0,
            )
        self._reserved += 1

    def release(self) -> None:
        """Gives back a place :meth:`reserve` held (the attach did not start a job)."""
        self._reserved -= 1

    def submit(self, job: Job) -> None:
        """Starts ``job`` in the place :meth:`reserve` held."""
        self._reserved -= 1
        self._jobs[job.job] = job
        job.task = asyncio.create_task(self._run(job), name=f"ingest {job.store_id}/{job.file_id}")

    # -- leases -------------------------------------------------------------------------------

    async def _renew(self) -> None:
        interval = self._settings.ingest_lease_s / 3
        while True:
            await asyncio.sleep(interval)  # a period, not a wait for readiness
            for job in list(self._jobs.values()):
                try:
                    owned = await self._repo.heartbeat(job.tenant, job.store_id, job.file_id, job.job)
                except LlmeshError as exc:
                    log.warning("cannot renew the lease of ingestion job %s: %s", job.job, exc)
                    continue
                if not owned and job.task is not None and not job.lost:
                    log.info(
                        "ingestion job %s lost its file (detached or store deleted): stopping it", job.job
                    )
                    job.lost = True
                    job.task.cancel()

    # -- one job ------------------------------------------------------------------------------

    async def _run(self, job: Job) -> None:
        # The task's own context: the embeddings service scopes collections by its tenant.
        rc.activate(rc.new_context(tenant=job.tenant))
        try:
            async with self._turns:
                rc.current().deadline = time.monotonic() + self._settings.ingest_timeout_s
                async with asyncio.timeout(self._settings.ingest_timeout_s):
                    await self._ingest(job)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._abandon(job), ABANDON_TIMEOUT_S)
            raise
        except Exception as exc:
            if not isinstance(exc, LlmeshError | grpc.aio.AioRpcError | TimeoutError):
                log.exception("ingestion job %s failed", job.job)
            await self._delete_written(job)
            await self._fail(job, *error_of(exc))
        finally:
            self._jobs.pop(job.job, None)

    async def _ingest(self, job: Job) -> None:
        found = await self._files.text(job.tenant, job.file_id)
        if found is None:
            await self._fail(
                job, "invalid_file", f"the file {job.file_id!r} was deleted before it was ingested"
            )
            return
        meta, text = found
        settings = self._settings
        try:
            # Checked as retrieved documents are: pieces of a few chunks each (a ruleset's
            # max_length rule applies to each document, as to each retrieved chunk).
            pieces = split_text(text, POLICY_DOCUMENT_CHARS)
            for texts in text_batches(pieces, settings.ingest_policy_chars):
                await self._policy.check(texts, job.fail_open)
        except DocumentBlocked as exc:
            await self._fail(job, "invalid_file", exc.message)
            return
        documents = parts(
            text,
            file_id=job.file_id,
            filename=meta.filename,
            job=job.job,
            attributes=job.attributes,
            max_chars=settings.ingest_part_chars,
        )
        # Recorded before the first write: whoever fails or detaches this attempt deletes them.
        if not await self._repo.heartbeat(job.tenant, job.store_id, job.file_id, job.job, len(documents)):
            return  # the file was detached (or the store deleted) meanwhile: nothing written
        job.parts = len(documents)
        for group in batches(documents, settings.ingest_call_chars):
            await self._collections.upsert(job.store_id, group, job.chunking)
        owned = await self._repo.finish(
            job.tenant, job.store_id, job.file_id, job.job, "completed", usage_bytes=len(text.encode())
        )
        if not owned:
            job.lost = True
            await self._delete_written(job)

    async def _fail(self, job: Job, code: str, message: str) -> None:
        try:
            await self._repo.finish(
                job.tenant, job.store_id, job.file_id, job.job, "failed", error=(code, message[:1000])
            )
        except LlmeshError as exc:
            # Its lease runs out and the next reader fails it as interrupted.
            log.warning("cannot record the failure of ingestion job %s: %s", job.job, exc)

    async def _delete_written(self, job: Job) -> None:
        if not job.parts:
            return
        try:
            await self._collections.delete(job.store_id, part_ids(job.file_id, job.job, job.parts))
        except Exception as exc:
            # Kept in the file's record (job, parts): detaching it or deleting the store retries.
            log.warning("cannot delete what ingestion job %s wrote: %s", job.job, exc)

    async def _abandon(self, job: Job) -> None:
        await self._delete_written(job)
        if not job.lost:
            await self._fail(job, "server_error", STOPPED)
