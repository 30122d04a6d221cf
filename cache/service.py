"""The cache's core: sessions, the response cache and versions under request-level consistency.

Every method reads the calling request's context (:func:`services.runtime.context.current`):
the tenant, the version floors, max-age, no-store and the semantic opt-in; it
reports the versions it read or wrote with ``ctx.observe`` and the cache outcome
with ``ctx.set_cache_status``. No gRPC here; :mod:`cache.servicer` adapts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from cache import defaults
from cache.backend import Backend
from cache.domain import (
    CacheEntry,
    LookupResult,
    ResponseKey,
    SessionSummary,
    SessionView,
    Status,
    StoreResult,
    Strategy,
    Turn,
)
from cache.keys import RedisKeys, is_cacheable, key_problem, response_namespace, semantic_key
from cache.responses import LeaseTerms, ResponseStore, Verdict, judge, version_prefix
from cache.semantic import SemanticCache, SemanticUnavailable
from cache.sessions import SessionStore, session_namespace
from cache.singleflight import Notifier
from cache.truncation import SYSTEM_ROLES, TokenCounter, truncate
from services.runtime import context as rc
from services.runtime import namespaces
from services.runtime.cache_status import describe_match
from services.runtime.errors import InvalidArgument, NotFound
from services.runtime.versions import Hold, VersionStore, slot_tag

log = logging.getLogger(__name__)

# Every entry carries this namespace's version: bumping it invalidates the whole tenant.
TENANT_NAMESPACE = namespaces.TENANT
MAX_STAMPS = 32
MAX_NAMESPACES_PER_CALL = 256
# How often a single-flight waiter re-checks while the wake-up subscription is down.
UNSUBSCRIBED_POLL_S = 0.1


@dataclass(frozen=True, slots=True)
class ResponseLimits:
    """The response cache's bounds (settings: :class:`cache.config.CacheSettings`)."""

    ttl_s: int
    ttl_jitter: float
    max_key_bytes: int
    max_entry_bytes: int
    lease_ms: int
    # How long after its lease ran out a producer may still store (when nobody took over).
    lease_grace_ms: int
    wait_ms: int
    # Version key lifetimes (services.runtime.versions): after a bump or a stamped store, and
    # after a read only.
    version_ttl_s: int = defaults.VERSION_TTL_S
    version_read_ttl_s: int = defaults.VERSION_READ_TTL_S

    @classmethod
    def default(cls) -> ResponseLimits:
        """The shipped defaults (:mod:`cache.defaults`), for a service built without settings."""
        return cls(
            ttl_s=defaults.RESPONSE_TTL_S,
            ttl_jitter=defaults.TTL_JITTER,
            max_key_bytes=defaults.MAX_KEY_BYTES,
            max_entry_bytes=defaults.MAX_ENTRY_BYTES,
            lease_ms=defaults.LEASE_MS,
            lease_grace_ms=defaults.LEASE_GRACE_MS,
            wait_ms=defaults.WAIT_MS,
        )


def _lease_token(tenant_version: int, scope_version: int) -> str:
    return f"{uuid.uuid4().hex}.{tenant_version}.{scope_version}"


def _token_versions(token: str) -> tuple[int, int] | None:
    parts = token.split(".")
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return int(parts[1]), int(parts[2])


class CacheService:
    """Sessions, exact and semantic response cache, versions, invalidation."""

    def __init__(
        self,
        backend: Backend,
        *,
        sessions: SessionStore | None = None,
        semantic: SemanticCache | None = None,
        counter: TokenCounter | None = None,
        limits: ResponseLimits | None = None,
        tenants: Sequence[str] = (),
        cluster: bool = False,
        responses_backend: Backend | None = None,
        responses_cluster: bool = False,
    ) -> None:
        # ``backend``: the main Redis (versions, sessions; shared with policy and embeddings,
        # which bump their versions there). ``responses_backend``: where entries, leases,
        # wake-ups and the semantic log live; None = the main Redis (the split is off).
        self.backend = backend
        self.responses_backend = responses_backend or backend
        self.split = self.responses_backend is not backend
        self.limits = limits or ResponseLimits.default()
        self.versions = VersionStore(
            backend.redis, ttl_s=self.limits.version_ttl_s, read_ttl_s=self.limits.version_read_ttl_s
        )
        self.sessions = sessions or SessionStore(backend)
        # Split: the one-call read of entry + versions is impossible (two Redis), so the
        # versions are read from the main Redis after the entry (see :meth:`_read`).
        self.responses = ResponseStore(
            self.responses_backend,
            cluster=responses_cluster if self.split else cluster,
            versions_here=not self.split,
        )
        self.lease_terms = LeaseTerms(
            read_ttl_s=self.versions.read_ttl_s,
            lease_ms=self.limits.lease_ms,
            grace_ms=self.limits.lease_grace_ms,
            max_key_bytes=self.limits.max_key_bytes,
        )
        self.notifier = Notifier(self.responses_backend.redis)
        self.semantic = semantic
        self.counter = counter
        self._tenants = frozenset(tenants)

    @property
    def direct_lookups(self) -> bool:
        """Whether callers may decide an exact miss and take its lease in Redis themselves
        (cache.responses.DirectAcquire): entries and versions in one plain Redis, as the one-call
        lookup needs, and no tenant list for them to skip."""
        return self.responses.one_call_lookup and not self._tenants

    async def publish_direct_terms(self, ttl_ms: int) -> None:
        """Offers :attr:`direct_lookups` for ``ttl_ms`` (the caller renews it while it holds)."""
        await self.responses.publish_terms(self.lease_terms, ttl_ms)

    async def start(self) -> None:
        await self.notifier.start()
        if self.semantic is not None:
            await self.semantic.start()

    async def stop(self) -> None:
        await self.notifier.stop()
        if self.semantic is not None:
            await self.semantic.stop()

    # -- context -----------------------------------------------------------------------------

    def _ctx(self) -> rc.RequestContext:
        ctx = rc.current()
        if self._tenants and ctx.tenant not in self._tenants:
            raise InvalidArgument(f"unknown tenant {ctx.tenant!r}")
        return ctx

    # -- sessions ----------------------------------------------------------------------------

    async def get_session(
        self,
        session_id: str,
        token_budget: int = 0,
        strategy: Strategy = Strategy.SYSTEM_TAIL,
        model: str = "",
    ) -> SessionView:
        """The session's turns (truncated to ``token_budget`` tokens when > 0) and its version.

        Under a budget only the newest turns are read (and the first one, when it is a system
        turn the strategy keeps): pages from the end, each one atomic and larger than the last,
        until the turns read hold more tokens than the budget or reach the first turn. The
        ``pinned`` strategy may keep any turn, so it reads the whole session (bounded by
        ``max_session_bytes``).
        """
        ctx = self._ctx()
        if token_budget < 0:
            raise InvalidArgument("token_budget must be >= 0")
        namespace = session_namespace(session_id)
        floor = ctx.floor_for(namespace)
        if token_budget == 0 or strategy is Strategy.PINNED:
            turns, version = await self.sessions.read(ctx.tenant, session_id, floor)
            ctx.observe(namespace, version)
            if not turns:
                raise NotFound(f"session {session_id!r} not found")
            if token_budget == 0:
                return SessionView(session_id, tuple(turns), version, total_turns=len(turns))
            counts = await self._count(turns, model, {})
            return self._truncated(
                session_id,
                turns,
                counts,
                version=version,
                total=len(turns),
                token_budget=token_budget,
                strategy=strategy,
            )
        want = defaults.SESSION_PAGE_TURNS
        counted: dict[str, int] = {}
        while True:
            tail = await self.sessions.tail(ctx.tenant, session_id, want, floor)
            ctx.observe(namespace, tail.version)
            if not tail.total_turns:
                # Never created, deleted or expired — or another tenant's id: all look the same.
                # The version still goes back in the trailing metadata (monotonic reads hold).
                raise NotFound(f"session {session_id!r} not found")
            fetched = list(tail.turns)
            first = tail.first
            if strategy is Strategy.SYSTEM_TAIL and first is not None and first.role in SYSTEM_ROLES:
                fetched.insert(0, first)
            counts = await self._count(fetched, model, counted)
            if tail.start == 0 or sum(counts) > token_budget:
                # Any older turn lies beyond one that already does not fit: truncating these
                # turns is truncating the whole session.
                return self._truncated(
                    session_id,
                    fetched,
                    counts,
                    version=tail.version,
                    total=tail.total_turns,
                    token_budget=token_budget,
                    strategy=strategy,
                )
            want *= 4

    async def _count(self, turns: Sequence[Turn], model: str, known: dict[str, int]) -> list[int]:
        """Token counts of ``turns``, counting only those not in ``known`` (by their JSON; a turn's
        count does not depend on its neighbours)."""
        if self.counter is None:
            raise InvalidArgument("token_budget needs a tokenizer, and this cache has none configured")
        keys = [t.to_json() for t in turns]
        new = {k: t for k, t in zip(keys, turns, strict=True) if k not in known}
        if new:
            known.update(zip(new, await self.counter.count_turns(list(new.values()), model), strict=True))
        return [known[k] for k in keys]

    @staticmethod
    def _truncated(
        session_id: str,
        turns: Sequence[Turn],
        counts: Sequence[int],
        *,
        version: int,
        total: int,
        token_budget: int,
        strategy: Strategy,
    ) -> SessionView:
        """The view of ``turns`` (the whole session, or its first system turn and newest turns)
        cut to ``token_budget``; ``total``: the turns in the whole session."""
        cut = truncate(turns, counts, token_budget, strategy)
        kept = tuple(turns[i] for i in cut.kept)
        return SessionView(
            session_id=session_id,
            turns=kept,
            version=version,
            total_turns=total,
            truncated=len(kept) < total,
            dropped_turns=total - len(kept),
            token_count=cut.token_count,
        )

    async def append_turns(
        self, session_id: str, turns: Sequence[Turn], expected_version: int | None = None, ttl_s: int = 0
    ) -> tuple[int, int]:
        ctx = self._ctx()
        appended = await self.sessions.append(ctx.tenant, session_id, turns, expected_version, ttl_s)
        ctx.observe(session_namespace(session_id), appended.version)
        if appended.dropped_turns:
            log.info(
                "session %s/%s: dropped its %d oldest turns to stay within its bounds",
                ctx.tenant,
                session_id,
                appended.dropped_turns,
            )
        return appended.version, appended.total_turns

    async def delete_session(self, session_id: str) -> tuple[bool, int]:
        ctx = self._ctx()
        deleted, version = await self.sessions.delete(ctx.tenant, session_id)
        ctx.observe(session_namespace(session_id), version)
        return deleted, version

    async def list_sessions(self, page_size: int, page_token: str) -> tuple[list[SessionSummary], str]:
        """A page of the calling tenant's sessions and the next page's token ('' on the last).
        Their versions are not observed: a page of them would swell the trailer."""
        ctx = self._ctx()
        return await self.sessions.listing(ctx.tenant, page_size, page_token)

    # -- versions ----------------------------------------------------------------------------

    @staticmethod
    def _check_namespaces(namespaces: Sequence[str]) -> None:
        if len(namespaces) > MAX_NAMESPACES_PER_CALL:
            raise InvalidArgument(f"at most {MAX_NAMESPACES_PER_CALL} namespaces per call")
        for namespace in namespaces:
            slot_tag("t", namespace)  # raises InvalidArgument on a malformed namespace

    async def _current(
        self, tenant: str, names: Sequence[str], hold: Literal["read", "keep"]
    ) -> dict[str, int]:
        """Current versions: the cache's own namespaces held as ``hold`` says (created if missing),
        the others peeked (their owners create them: :func:`namespaces.created_by_cache`)."""
        holds: dict[str, Hold] = {ns: hold if namespaces.created_by_cache(ns) else "peek" for ns in names}
        return await self.backend.call(self.versions.get_held(tenant, holds))

    async def get_versions(self, namespaces: Sequence[str]) -> dict[str, int]:
        ctx = self._ctx()
        self._check_namespaces(namespaces)
        versions = await self._current(ctx.tenant, namespaces, "read")
        for namespace, version in versions.items():
            ctx.observe(namespace, version)
        return versions

    async def invalidate_namespace(self, namespace: str, *, only_existing: bool = False) -> dict[str, int]:
        """Bumps one namespace: entries derived from its older versions stop being served.
        ``only_existing``: a namespace without a version is read (peeked), not created."""
        ctx = self._ctx()
        self._check_namespaces([namespace])
        bump = self.versions.bump_existing if only_existing else self.versions.bump
        version = await self.backend.call(bump(ctx.tenant, namespace))
        ctx.observe(namespace, version)
        return {namespace: version}

    async def invalidate_tenant(self, *, only_existing: bool = False) -> dict[str, int]:
        """Bumps the tenant-wide namespace every entry is stamped with (no scan)."""
        return await self.invalidate_namespace(TENANT_NAMESPACE, only_existing=only_existing)

    async def invalidate_key(self, key: ResponseKey) -> dict[str, int]:
        """Drops one exact entry (a single DEL of a known key), then bumps ``entry:<id>`` so that
        copies kept elsewhere (the gateways' local hits) are dropped too."""
        ctx = self._ctx()
        self._check_key(key)
        keys = RedisKeys.of(ctx.tenant, key)
        await self.responses.delete(keys.entry)
        namespace = namespaces.entry(keys.digest)
        version = await self.backend.call(self.versions.bump(ctx.tenant, namespace))
        ctx.observe(namespace, version)
        return {namespace: version}

    # -- response cache ----------------------------------------------------------------------

    def _check_key(self, key: ResponseKey) -> None:
        problem = key_problem(key, self.limits.max_key_bytes)
        if problem:
            raise InvalidArgument(problem)

    async def _judge_entry(
        self, ctx: rc.RequestContext, entry: CacheEntry, now_ms: int, current: Mapping[str, int] | None = None
    ) -> Verdict:
        # Cheap checks first: no version read for an entry that is too old anyway.
        quick = judge(entry, now_ms, ctx.floor_for, {}, ctx.max_age_ms)
        if not quick.fresh:
            return quick
        missing = [ns for ns in entry.derived_from if current is None or ns not in current]
        if missing:
            current = {
                **(current or {}),
                # Peeked: the store made the entry's stamps outlive it (:meth:`store`).
                **await self.backend.call(self.versions.get_many(ctx.tenant, missing, hold="peek")),
            }
        return judge(entry, now_ms, ctx.floor_for, current or {}, ctx.max_age_ms)

    async def _read(
        self, ctx: rc.RequestContext, entry_key: str
    ) -> tuple[CacheEntry | None, int, dict[str, int] | None]:
        """The entry, the clock of its Redis, and (single Redis, no cluster) the current
        versions of its namespaces read in the same atomic call.

        With the split (entries in a responses Redis, versions in the main one), this returns
        no versions and :meth:`_judge_entry` reads them from the main Redis *after* the entry
        read, hence after the lookup started. That order is what keeps it consistent:

        * an invalidation (or session write) acknowledged before the lookup started bumped the
          version in the main Redis before our version read, so we see at least that version
          (versions are monotonic, across a main Redis restart too: HLC clock readings);
        * a store checks its stamps against the main Redis's current versions, then writes the
          entry; an invalidation that lands between that check and the write leaves an entry
          whose stamp is below the bumped version, and every later lookup reads at least the
          bumped version, so that entry is judged stale every time, never served;
        * a flush or restart of the responses Redis only loses entries/leases (misses); one of
          the main Redis re-initialises versions from the clock, above every stamp (stale).
        """
        return await self.responses.read_fresh(entry_key, version_prefix(ctx.tenant))

    def _hit(
        self, ctx: rc.RequestContext, entry: CacheEntry, verdict: Verdict, **extra: object
    ) -> LookupResult:
        for namespace, version in entry.derived_from.items():
            ctx.observe(namespace, version)
        ctx.set_cache_status(Status.HIT, verdict.age_ms)
        ttl_ms = max(0, entry.expires_at_ms - entry.created_at_ms - verdict.age_ms)
        result = LookupResult(
            Status.HIT,
            entry=entry,
            age_ms=verdict.age_ms,
            ttl_ms=ttl_ms,
            **extra,  # type: ignore[arg-type]
        )
        ctx.cache_match = describe_match(
            result.semantic, result.similarity, result.verifier, result.verifier_score
        )
        return result

    async def lookup(self, key: ResponseKey, single_flight: bool = False, wait_ms: int = 0) -> LookupResult:
        """Exact, then (if the request opted in) guarded semantic lookup; on a miss with
        ``single_flight``, either elects the caller producer (a lease token) or waits for
        the current producer's result."""
        ctx = self._ctx()
        self._check_key(key)
        if wait_ms < 0:
            raise InvalidArgument("wait_ms must be >= 0")
        if not is_cacheable(key):
            ctx.set_cache_status(Status.BYPASS)
            return LookupResult(Status.BYPASS, detail="not cacheable: needs temperature 0 or a seed")
        keys = RedisKeys.of(ctx.tenant, key)
        semantic = ctx.semantic and self.semantic is not None
        current: dict[str, int] | None
        if single_flight and not semantic and self.responses.one_call_lookup:
            # A miss (the usual case when the gateway asks: it answers most hits itself) decided
            # and its lease taken in one Redis call instead of three.
            entry, now_ms, current, got, token = await self.responses.read_or_acquire(
                ctx.tenant, keys, response_namespace(key), self.lease_terms
            )
            if got is not None and got.outcome == "acquired":
                ctx.set_cache_status(Status.MISS)
                return LookupResult(Status.MISS, lease_token=token)
            # An entry to judge, or another producer at work: the steps below, as ever.
        else:
            entry, now_ms, current = await self._read(ctx, keys.entry)
        status, details = Status.MISS, []
        if entry is not None:
            verdict = await self._judge_entry(ctx, entry, now_ms, current)
            if verdict.fresh:
                return self._hit(ctx, entry, verdict, entry_id=keys.digest)
            status = Status.STALE
            details.append("exact entry " + verdict.reason)
        if semantic:
            hit, detail = await self._semantic(ctx, key)
            if hit is not None:
                return hit
            if detail:
                details.append(detail)
        lease = ""
        if single_flight:
            elected = await self._elect(ctx, key, keys, entry, wait_ms or self.limits.wait_ms)
            if isinstance(elected, LookupResult):
                return elected
            lease = elected
        ctx.set_cache_status(status)
        return LookupResult(status, lease_token=lease, detail="; ".join(details))

    async def _semantic(self, ctx: rc.RequestContext, key: ResponseKey) -> tuple[LookupResult | None, str]:
        assert self.semantic is not None
        skey = semantic_key(ctx.tenant, key)
        if skey is None:
            return None, "semantic lookup skipped: no trailing user message"
        try:
            found = await self.semantic.find(skey)
        except SemanticUnavailable as exc:
            return None, str(exc)
        notes = list(found.rejected)
        for match in found.accepted:
            hit = match.hit
            entry_key = "llmesh:resp:" + slot_tag(ctx.tenant, "r:" + hit.digest)
            entry, now_ms, current = await self._read(ctx, entry_key)
            if entry is None:
                self.semantic.forget(skey, hit.digest, found.language)
                continue
            verdict = await self._judge_entry(ctx, entry, now_ms, current)
            if verdict.fresh:
                return (
                    self._hit(
                        ctx,
                        entry,
                        verdict,
                        semantic=True,
                        similarity=hit.similarity,
                        verifier=match.verifier,
                        verifier_score=match.score,
                    ),
                    "",
                )
            notes.append(f"semantic candidate {hit.similarity:.3f} {verdict.reason}")
        if not notes:
            notes.append(f"semantic: no candidate above {self.semantic.threshold} (best {found.best:.3f})")
        return None, "; ".join(notes)

    async def _elect(
        self, ctx: rc.RequestContext, key: ResponseKey, keys: RedisKeys, seen: CacheEntry | None, wait_ms: int
    ) -> str | LookupResult:
        """A lease token (the caller produces), a HIT (another producer finished), or ""."""
        remaining_s = ctx.time_remaining()
        budget_s = (
            wait_ms / 1000 if remaining_s is None else min(wait_ms / 1000, max(0.0, remaining_s - 0.05))
        )
        deadline = time.monotonic() + budget_s
        seen_created = seen.created_at_ms if seen is not None else None
        scope = response_namespace(key)
        while True:
            waiter = self.notifier.register(keys.digest)
            try:
                # Created if missing (with a short TTL): the store checks the token's versions
                # against them, so they must not move while the producer works.
                versions = await self.backend.call(
                    self.versions.get_many(ctx.tenant, [TENANT_NAMESPACE, scope], hold="read")
                )
                token = _lease_token(versions[TENANT_NAMESPACE], versions[scope])
                got = await self.responses.acquire(
                    keys, token, self.limits.lease_ms, seen_created, self.limits.lease_grace_ms
                )
                if got.outcome == "acquired":
                    return token
                if got.outcome == "changed":
                    entry, now_ms, current = await self._read(ctx, keys.entry)
                    if entry is not None:
                        verdict = await self._judge_entry(ctx, entry, now_ms, current)
                        if verdict.fresh:
                            return self._hit(ctx, entry, verdict, entry_id=keys.digest)
                        seen_created = entry.created_at_ms
                    else:
                        seen_created = None
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    return ""
                # Woken by the producer's store/release, or when its lease runs out. Without a
                # subscription (Redis restarting) a wake-up can be lost: re-check every 100 ms.
                timeout = min(left, got.ttl_ms / 1000 + 0.01) if got.ttl_ms > 0 else min(left, 0.05)
                if not self.notifier.subscribed:
                    timeout = min(timeout, UNSUBSCRIBED_POLL_S)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(waiter), timeout)
            finally:
                self.notifier.discard(keys.digest, waiter)

    async def store(
        self,
        key: ResponseKey,
        payload: bytes,
        derived_from: Mapping[str, int],
        *,
        model: str = "",
        lease_token: str = "",
        ttl_s: int = 0,
    ) -> StoreResult:
        """Stores a produced response (and releases the lease). A stamp of version 0 means
        "the namespace's current version"; an already outdated stamp stores nothing."""
        ctx = self._ctx()
        self._check_key(key)
        keys = RedisKeys.of(ctx.tenant, key)
        if ctx.no_store or not is_cacheable(key):
            if lease_token:
                await self.responses.release(keys, lease_token)
            return StoreResult(False, "no-store requested" if ctx.no_store else "not cacheable")
        if len(payload) > self.limits.max_entry_bytes:
            raise InvalidArgument(
                f"entry is {len(payload)} bytes, over the limit of {self.limits.max_entry_bytes}"
            )
        if len(derived_from) > MAX_STAMPS:
            raise InvalidArgument(f"at most {MAX_STAMPS} derived_from versions")
        if ttl_s < 0:
            raise InvalidArgument("ttl_seconds must be >= 0")
        self._check_namespaces(list(derived_from))
        scope = response_namespace(key)
        stamps = dict(derived_from)
        from_token = _token_versions(lease_token) if lease_token else None
        if from_token is not None:
            stamps[TENANT_NAMESPACE], stamps[scope] = from_token
        else:
            stamps.setdefault(TENANT_NAMESPACE, 0)
            stamps.setdefault(scope, 0)
        # Current versions from the main Redis (where policy/embeddings bump theirs); with the
        # split, an invalidation between this check and the write below leaves an entry that
        # every later lookup judges stale (see :meth:`_read`). ``keep``: the entry is stamped
        # with them, so the keys the cache owns must outlive it; another service's version that
        # does not exist reads as the clock, so an entry derived from it is never served.
        current = await self._current(ctx.tenant, list(stamps), "keep")
        for namespace, version in list(stamps.items()):
            if version == 0:
                stamps[namespace] = current[namespace]
            elif version > current[namespace]:
                raise InvalidArgument(
                    f"derived_from {namespace} version {version} is ahead of the current {current[namespace]}"
                )
        outdated = sorted(ns for ns, v in stamps.items() if v < current[ns])
        if outdated:
            if lease_token:
                await self.responses.release(keys, lease_token)
            return StoreResult(False, "derived from outdated versions of " + ", ".join(outdated))
        base = (ttl_s or self.limits.ttl_s) * 1000
        jitter = self.limits.ttl_jitter
        ttl_ms = max(1, int(base * (1 + random.uniform(-jitter, jitter))))
        created = await self.responses.write(
            keys,
            payload=payload,
            stamps=stamps,
            model=model or key.model,
            ttl_ms=ttl_ms,
            token=lease_token,
        )
        if created is None:
            return StoreResult(
                False, "lease lost: it expired and another producer took over, or an entry was stored since"
            )
        for namespace, version in stamps.items():
            ctx.observe(namespace, version)
        if ctx.semantic and self.semantic is not None:
            skey = semantic_key(ctx.tenant, key)
            if skey is not None:
                try:
                    await self.semantic.add(skey, keys.digest)
                except SemanticUnavailable as exc:
                    return StoreResult(True, f"stored; not indexed semantically: {exc}")
        return StoreResult(True)

    async def release(self, key: ResponseKey, lease_token: str) -> bool:
        """Gives up a lease without storing; waiters are woken and one of them takes over."""
        ctx = self._ctx()
        self._check_key(key)
        if not lease_token:
            raise InvalidArgument("lease_token must be set")
        keys = RedisKeys.of(ctx.tenant, key)
        return await self.responses.release(keys, lease_token)
