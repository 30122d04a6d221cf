"""The semantic response cache: nearest neighbours of past prompts, then verification.

Two stages. The vector index proposes up to ``k`` candidates whose cosine similarity
reaches a recall-oriented ``threshold``; the guard vetoes what it can prove differs
(numbers, negations, named entities, opposite terms, swapped roles); an English
candidate that says the same content words in the same order (:func:`cache.guard.same_words`:
typos, inflections, fillers) answers without a model; a verifier (:mod:`cache.verify`)
scores the rest as one batch and only a candidate at or above its threshold may answer.
The index is partitioned by language (:mod:`cache.language`), so a prompt is never
compared with a cached prompt in another language.

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
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
from redis.exceptions import RedisError

from cache import defaults
from cache.backend import Backend
from cache.embedder import Embedder
from cache.guard import core_question, reject_reason, same_words
from cache.keys import SemanticKey
from cache.language import LanguageId
from cache.metrics import SEMANTIC_CANDIDATES, SEMANTIC_SKIPPED, VERIFY_SECONDS
from cache.vectors import Hit, Vector, VectorIndex, normalize
from cache.verify import Verifier
from services.runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)

LOG_KEY = "llmesh:semlog"
ENGLISH = "en"
# What decided a match that ``same_words`` proved (no model asked); reported like a verifier.
SAME_WORDS = "same-words"
_REPLAY_BATCH = 2000


class SemanticUnavailable(Exception):
    """No semantic step for this prompt (its language is not enabled, or the embedding service
    could not be used); the lookup goes on without semantics. ``reason`` (and ``language``, for a
    language not enabled) labels ``llmesh_cache_semantic_skipped_total``."""

    def __init__(self, message: str, reason: str = "embeddings_failed", language: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.language = language


@dataclass(frozen=True, slots=True)
class Match:
    """A candidate that passed both stages; ``score`` is the verifier's (1.0 without one), and
    ``verifier`` names what decided: the verifier model, or :data:`SAME_WORDS`."""

    hit: Hit
    score: float
    verifier: str = ""


@dataclass(slots=True)
class Candidates:
    """Verified neighbours, best score first, and why the others were rejected."""

    accepted: list[Match] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    best: float = 0.0
    language: str = ""


class _Count:
    """Adds to ``llmesh_cache_semantic_candidates_total`` for one lookup's language."""

    def __init__(self, language: str) -> None:
        self.language = language or "any"

    def __call__(self, decision: str, n: int) -> None:
        if n:
            SEMANTIC_CANDIDATES.labels(self.language, decision).inc(n)


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
        verifier: Verifier | None = None,
        language: LanguageId | None = None,
        languages: frozenset[str] = frozenset(),
        other_verifier: Verifier | None = None,
    ) -> None:
        self._backend = backend
        self.embedder = embedder
        self.index = index or VectorIndex(max_entries=max_log_entries)
        self.threshold = threshold
        self.k = candidates
        self.verifier = verifier
        # Verifies prompts in languages other than English; None = ``verifier`` does.
        self.other_verifier = other_verifier if verifier is not None else None
        self.language = language
        # Languages looked up semantically; empty = every language.
        self.languages = languages
        self._embed_timeout_s = embed_timeout_s
        self._max_log = max_log_entries
        self.replica_id = uuid.uuid4().hex[:12]
        self._recent: OrderedDict[str, Vector] = OrderedDict()
        self._last_id = "0-0"
        self._task: asyncio.Task[None] | None = None
        self.caught_up = asyncio.Event()

    async def start(self, warm_up_s: float = 120.0) -> None:
        """Loads the language model, the embedder and the verifier (a local model takes
        seconds) and starts following the log, so the first lookup pays for none of them."""
        if self.language is not None:
            await asyncio.to_thread(self.language.detect, "warm up")
        if self.embedder is not None:
            try:
                await asyncio.wait_for(self.embedder.embed(["warm up"]), warm_up_s)
            except Exception as exc:  # the embedder may come up later; lookups report it meanwhile
                log.warning("embedder not ready at start: %s", exc)
            for verifier in (self.verifier, self.other_verifier):
                if verifier is None:
                    continue
                try:
                    await asyncio.wait_for(verifier.scores("warm up", ["warm up"]), warm_up_s)
                except Exception as exc:  # as above: lookups report a verifier that is not there
                    log.warning("verifier %s not ready at start: %s", verifier.name, exc)
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
            raise SemanticUnavailable(
                "semantic lookup skipped: no embedding service configured", "no_embeddings"
            )
        try:
            vectors = await asyncio.wait_for(self.embedder.embed([text]), self._embed_timeout_s)
        except TimeoutError as exc:
            raise SemanticUnavailable(
                "semantic lookup skipped: embedding service timed out", "embeddings_timeout"
            ) from exc
        except SemanticUnavailable:
            raise
        except Exception as exc:  # any failure of the remote embedder means: go on without it
            raise SemanticUnavailable(f"semantic lookup skipped: embedding service failed ({exc})") from exc
        vector: Vector = normalize(vectors)[0]
        self._recent[text] = vector
        if len(self._recent) > 1024:
            self._recent.popitem(last=False)
        return vector

    def _language(self, query: str) -> str:
        """The query's language; raises SemanticUnavailable for one not looked up semantically."""
        if self.language is None:
            return ""
        language = self.language.detect(query)
        if self.languages and language not in self.languages:
            raise SemanticUnavailable(
                f"semantic lookup skipped: language {language!r} is not enabled", "language_off", language
            )
        return language

    def verifier_for(self, language: str) -> Verifier | None:
        """English prompts go to ``verifier``, the others to ``other_verifier`` when there is one."""
        if language == ENGLISH or self.other_verifier is None:
            return self.verifier
        return self.other_verifier

    @staticmethod
    def _partition(key: SemanticKey, language: str) -> str:
        return f"{key.partition}:{language}" if language else key.partition

    async def find(self, key: SemanticKey) -> Candidates:
        """Verified neighbours of ``key.query`` in its partition and language, best first.
        Prompts are compared without the greetings and thanks around them (:func:`core_question`)."""
        query = core_question(key.query)
        try:
            language = self._language(query)
            vector = await self._vector(query)
        except SemanticUnavailable as exc:
            SEMANTIC_SKIPPED.labels(exc.reason, exc.language).inc()
            raise
        out = Candidates(language=language)
        survivors: list[Hit] = []
        for hit in self.index.search(self._partition(key, language), vector, self.k):
            out.best = max(out.best, hit.similarity)
            if hit.similarity < self.threshold:
                continue
            reason = reject_reason(query, hit.text, language)
            if reason is None:
                survivors.append(hit)
            else:
                out.rejected.append(f"candidate {hit.similarity:.3f} rejected: {reason}")
        count = _Count(language)
        count("guard", len(out.rejected))
        if self.verifier is not None and language == ENGLISH:
            # The same content words in the same order need no model to say they ask the same.
            worded = [hit for hit in survivors if same_words(query, hit.text)]
            out.accepted = [Match(hit, 1.0, SAME_WORDS) for hit in worded]
            survivors = [hit for hit in survivors if hit not in worded]
            count("same_words", len(worded))
        if not survivors:
            return out
        verifier = self.verifier_for(language)
        if verifier is None:
            out.accepted = [Match(hit, 1.0) for hit in survivors]
            count("unverified", len(survivors))
            return out
        started = time.perf_counter()
        try:
            scores = await verifier.scores(query, [h.text for h in survivors])
        except Exception as exc:  # verification unavailable: no semantic hit (never unverified)
            out.rejected.append(f"semantic candidates not verified ({type(exc).__name__}); no semantic hit")
            count("unverifiable", len(survivors))
            return out
        VERIFY_SECONDS.labels(verifier.name).observe(time.perf_counter() - started)
        for hit, score in zip(survivors, scores, strict=True):
            if score >= verifier.threshold:
                out.accepted.append(Match(hit, score, verifier.name))
            else:
                out.rejected.append(
                    f"candidate {hit.similarity:.3f} rejected: verifier {verifier.name} "
                    f"scored {score:.3f} < {verifier.threshold}"
                )
        verified = sum(score >= verifier.threshold for score in scores)
        count("verified", verified)
        count("not_verified", len(survivors) - verified)
        out.accepted.sort(key=lambda m: m.score, reverse=True)
        return out

    def forget(self, key: SemanticKey, digest: str, language: str = "") -> None:
        self.index.remove(self._partition(key, language), digest)

    async def add(self, key: SemanticKey, digest: str) -> None:
        """Indexes ``digest`` under ``key`` here and appends it to the shared log."""
        query = core_question(key.query)
        partition = self._partition(key, self._language(query))
        vector = await self._vector(query)
        self.index.add(partition, digest, query, vector)
        fields = {
            "p": partition,
            "d": digest,
            "q": query,
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
