"""Dynamic batching: concurrent embed calls share model batches.

Callers submit texts; one collector task forms batches of at most ``max_batch``
texts and runs them, one at a time, in a single worker thread (the model uses
every core on its own, and the event loop stays free). When the model is idle the
collector waits at most ``max_wait_s`` for more callers before it starts a batch
that is not full; while the model is busy, arriving calls queue up and form the
next batch without any extra wait. A call larger than a batch is split across
batches and reassembled, so every caller gets exactly its own vectors back.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from prometheus_client import Histogram

from services.embeddings.encoder import Encoded
from services.runtime.errors import ResourceExhausted, Unavailable
from services.runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)

_T = TypeVar("_T")

BATCH_SIZE = Histogram(
    "llmesh_embeddings_batch_size",
    "Texts per model batch.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
BATCH_SECONDS = Histogram(
    "llmesh_embeddings_batch_seconds",
    "Model time per batch.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
QUEUE_SECONDS = Histogram(
    "llmesh_embeddings_queue_seconds",
    "Time texts wait for a batch to start.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)


@dataclass(slots=True)
class _Piece:
    """Up to ``max_batch`` texts of one call, waiting for the model."""

    texts: list[str]
    future: asyncio.Future[Encoded]
    queued_at: float = field(default_factory=time.monotonic)


class DynamicBatcher:
    """Coalesces concurrent ``embed`` calls into model batches run in one worker thread."""

    def __init__(
        self,
        run_batch: Callable[[Sequence[str]], Encoded],
        *,
        max_batch: int = 64,
        max_wait_s: float = 0.004,
        max_queued: int = 16384,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._run_batch = run_batch
        self._max_batch = max_batch
        self._max_wait_s = max_wait_s
        self._max_queued = max_queued
        self._queue: deque[_Piece] = deque()
        self._queued_texts = 0
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed-model")
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def queued_texts(self) -> int:
        return self._queued_texts

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._collect(), name="embed-batcher")

    async def close(self) -> None:
        """Fails queued calls with UNAVAILABLE, waits for the batch in flight, stops the thread."""
        self._closed = True
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        while self._queue:
            piece = self._queue.popleft()
            if not piece.future.done():
                piece.future.set_exception(Unavailable("the embedding service is shutting down"))
        self._queued_texts = 0
        await asyncio.to_thread(self._executor.shutdown, wait=True)

    async def run(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Runs other blocking work that needs the model's tokenizer on the model's thread
        (tokenizers are not safe to share across threads)."""
        if self._closed:
            raise Unavailable("the embedding service is shutting down")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    async def embed(self, texts: Sequence[str]) -> Encoded:
        """Vectors and token counts of ``texts``, in order (batched with other callers)."""
        if self._closed:
            raise Unavailable("the embedding service is shutting down")
        if not texts:
            return Encoded(vectors=np.zeros((0, 0), dtype=np.float32), token_counts=[])
        if self._queued_texts + len(texts) > self._max_queued:
            raise ResourceExhausted(
                f"embedding queue is full ({self._queued_texts} texts waiting, limit {self._max_queued})",
                retry_after_s=1.0,
            )
        self.start()
        loop = asyncio.get_running_loop()
        pieces = [
            _Piece(list(texts[i : i + self._max_batch]), loop.create_future())
            for i in range(0, len(texts), self._max_batch)
        ]
        self._queue.extend(pieces)
        self._queued_texts += len(texts)
        self._wakeup.set()
        try:
            results = [await piece.future for piece in pieces]
        except asyncio.CancelledError:
            # A cancelled caller's pieces that have not started are dropped, not computed.
            self._drop(pieces)
            raise
        if len(results) == 1:
            return results[0]
        return Encoded(
            vectors=np.concatenate([r.vectors for r in results]),
            token_counts=[n for r in results for n in r.token_counts],
        )

    def _drop(self, pieces: list[_Piece]) -> None:
        for piece in pieces:
            if piece in self._queue:
                self._queue.remove(piece)
                self._queued_texts -= len(piece.texts)
            piece.future.cancel()

    def _take_batch(self) -> list[_Piece]:
        batch: list[_Piece] = []
        size = 0
        while self._queue and size + len(self._queue[0].texts) <= self._max_batch:
            piece = self._queue.popleft()
            self._queued_texts -= len(piece.texts)
            if piece.future.done():  # cancelled while queued
                continue
            batch.append(piece)
            size += len(piece.texts)
        return batch

    def _queued_size(self) -> int:
        return self._queued_texts

    async def _collect(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
            # The model is idle here: give concurrent callers a short, bounded chance to join.
            deadline = loop.time() + self._max_wait_s
            while self._queued_size() < self._max_batch:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                self._wakeup.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
            batch = self._take_batch()
            if batch:
                await self._run(batch)

    async def _run(self, batch: list[_Piece]) -> None:
        texts = [t for piece in batch for t in piece.texts]
        now = time.monotonic()
        for piece in batch:
            QUEUE_SECONDS.observe(now - piece.queued_at)
        BATCH_SIZE.observe(len(texts))
        loop = asyncio.get_running_loop()
        try:
            with BATCH_SECONDS.time():
                encoded = await loop.run_in_executor(self._executor, self._run_batch, texts)
        except Exception as exc:
            log.exception("embedding batch of %d texts failed", len(texts))
            for piece in batch:
                if not piece.future.done():
                    piece.future.set_exception(exc)
            return
        start = 0
        for piece in batch:
            end = start + len(piece.texts)
            if not piece.future.done():
                piece.future.set_result(
                    Encoded(vectors=encoded.vectors[start:end], token_counts=encoded.token_counts[start:end])
                )
            start = end
