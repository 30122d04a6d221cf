"""The semantic response cache: guarded nearest-neighbour lookup over past prompts.

Each cache replica keeps an in-process :class:`~cache.vectors.VectorIndex`. Adds
go to a Redis stream (the semantic log) as well; every replica tails that stream,
so all replicas' indexes converge, and a replica that starts replays it. The index
only says *which* exact entry might answer: that entry is then read from Redis and
judged like an exact hit, so an evicted, expired or invalidated entry is never
served from the index.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
from redis.exceptions import RedisError

from cache import defaults
from cache.backend import Backend
from cache.embedder import Embedder
from cache.guard import reject_reason
from cache.keys import SemanticKey
from cache.vectors import Hit, Vector, VectorIndex, normalize
from services.runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)

LOG_KEY = "llmesh:semlog"
_REPLAY_BATCH = 2000


class SemanticUnavailable(Exception):
    """The embedding service could not be used; the lookup goes on without semantics."""


@dataclass(slots=True)
class Candidates:
    """Neighbours above the threshold that passed the guard, and why others were rejected."""

    accepted: list[Hit] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    best: float = 0.0


class SemanticCache:
    """Embeds, searches and guards; replicates index adds through a Redis stream."""

    def __init__(
        self,
        backend: Backend,
        embedder: Embedder | None,
        index: VectorIndex | None = None,
        *,
        threshold: float = defaults.SEMANTIC_THRESHOLD,
        candidates: int = defaults.SEMANTIC_CANDIDATES,
        embed_timeout_s: float = 0.5,
        max_log_entries: int = defaults.SEMANTIC_MAX_ENTRIES,
    ) -> None:
        self._backend = backend
        self.embedder = embedder
        self.index = index or VectorIndex(max_entries=max_log_entries)
        self.threshold = threshold
        self.k = candidates
        self._embed_timeout_s = embed_timeout_s
        self._max_log = max_log_entries
        self.replica_id = uuid.uuid4().hex[:12]
        self._recent: OrderedDict[str, Vector] = OrderedDict()
        self._last_id = "0-0"
        self._task: asyncio.Task[None] | None = None
        self.caught_up = asyncio.Event()

    async def start(self, warm_up_s: float = 120.0) -> None:
        """Loads the embedder (a local model takes seconds) and starts following the log."""
        if self.embedder is not None:
            try:
                await asyncio.wait_for(self.embedder.embed(["warm up"]), warm_up_s)
            except Exception as exc:  # the embedder may come up later; lookups report it meanwhile
                log.warning("embedder not ready at start: %s", exc)
        if self._task is None:
            self._task = asyncio.create_task(self._tail(), name="cache-semantic-log")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _vector(self, text: str) -> Vector:
        cached = self._recent.get(text)
        if cached is not None:
            self._recent.move_to_end(text)
            return cached
        if self.embedder is None:
            raise SemanticUnavailable("semantic lookup skipped: no embedding service configured")
        try:
            vectors = await asyncio.wait_for(self.embedder.embed([text]), self._embed_timeout_s)
        except TimeoutError as exc:
            raise SemanticUnavailable("semantic lookup skipped: embedding service timed out") from exc
        except SemanticUnavailable:
            raise
        except Exception as exc:  # any failure of the remote embedder means: go on without it
            raise SemanticUnavailable(f"semantic lookup skipped: embedding service failed ({exc})") from exc
        vector: Vector = normalize(vectors)[0]
        self._recent[text] = vector
        if len(self._recent) > 1024:
            self._recent.popitem(last=False)
        return vector

    async def find(self, key: SemanticKey) -> Candidates:
        """Guarded neighbours of ``key.query`` in its partition, most similar first."""
        vector = await self._vector(key.query)
        out = Candidates()
        for hit in self.index.search(key.partition, vector, self.k):
            out.best = max(out.best, hit.similarity)
            if hit.similarity < self.threshold:
                continue
            reason = reject_reason(key.query, hit.text)
            if reason is None:
                out.accepted.append(hit)
            else:
                out.rejected.append(f"candidate {hit.similarity:.3f} rejected: {reason}")
        return out

    def forget(self, key: SemanticKey, digest: str) -> None:
        self.index.remove(key.partition, digest)

    async def add(self, key: SemanticKey, digest: str) -> None:
        """Indexes ``digest`` under ``key`` here and appends it to the shared log."""
        vector = await self._vector(key.query)
        self.index.add(key.partition, digest, key.query, vector)
        fields = {
            "p": key.partition,
            "d": digest,
            "q": key.query,
            "v": vector.astype(np.float16).tobytes(),
            "o": self.replica_id,
        }
        await self._backend.call(
            self._backend.redis.xadd(LOG_KEY, fields, maxlen=self._max_log, approximate=True)
        )

    def _apply(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        grouped: dict[str, list[tuple[str, str, Vector]]] = {}
        for entry_id, fields in entries:
            self._last_id = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
            if fields.get(b"o", b"").decode() == self.replica_id:
                continue
            vector = np.frombuffer(fields[b"v"], dtype=np.float16).astype(np.float32)
            grouped.setdefault(fields[b"p"].decode(), []).append(
                (fields[b"d"].decode(), fields[b"q"].decode(), vector)
            )
        for partition, items in grouped.items():
            try:
                self.index.add_many(partition, items)
            except ValueError as exc:
                log.warning("semantic log entry skipped: %s", exc)

    async def _replay(self) -> None:
        redis = self._backend.redis
        start = "-"
        while True:
            batch = await redis.xrange(LOG_KEY, min=start, max="+", count=_REPLAY_BATCH)
            if not batch:
                break
            self._apply(batch)
            if len(batch) < _REPLAY_BATCH:
                break
            start = "(" + self._last_id

    async def _tail(self) -> None:
        redis = self._backend.redis
        # Block for less than the socket timeout, so a quiet log is not mistaken for a dead Redis.
        block_ms = max(50, int(self._backend.timeout_s * 600))
        backoff = 0.05
        replayed = False
        while True:
            try:
                if not replayed:
                    await self._replay()
                    replayed = True
                    self.caught_up.set()
                reply = await redis.xread({LOG_KEY: self._last_id}, block=block_ms, count=_REPLAY_BATCH)
                for _, entries in reply or ():
                    self._apply(entries)
                backoff = 0.05
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError, TimeoutError) as exc:
                log.debug("semantic log tail: %s", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
