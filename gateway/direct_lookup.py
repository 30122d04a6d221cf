"""Exact misses decided in Redis by the gateway, without the cache service's call.

Most remote lookups miss (a gateway answers most hits from its own copies), and a miss through
the cache service costs a gRPC call on both sides, each several thread wake-ups, for one Redis
script. Where the cache offers it (it publishes its lease terms, ``llmesh:cache:direct``, only
when entries and versions share one plain Redis and no tenant list is set: cache/app.py), the
gateway runs that decision itself (:class:`cache.responses.DirectAcquire`): when there is no
entry, the tenant's and the scope's versions exist and need no longer life, and nobody holds
the lease, it takes the lease with the token the cache's own lookup would have made, and the
request generates and stores through the cache service as it would have. Anything else (an
entry to judge, a version to create, another producer, a key the cache would refuse or not
store, a semantic lookup, Redis slow or down, no terms) changes nothing in Redis and goes to
the cache service as before. The gateway's Redis user reads entries and versions and writes
leases only (deploy/redis/users.acl).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from llmesh.v1 import cache_pb2
from prometheus_client import Counter
from redis.exceptions import RedisError

from cache.convert import key_from_pb
from cache.keys import RedisKeys, is_cacheable, key_problem, response_namespace
from cache.responses import DirectAcquire, LeaseTerms
from services.runtime.errors import LlmeshError
from services.runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)

OUTCOMES = Counter(
    "llmesh_gateway_direct_lookups_total",
    "Exact lookups this gateway tried in Redis itself, by outcome: acquired (a miss, its lease "
    "taken), or sent to the cache service: entry (one to judge), versions (one to create or "
    "extend), busy (another producer), key (one the cache would refuse or not store), error "
    "(Redis failed or was slow; off until the terms are read again).",
    ["outcome"],
)


class DirectLookups:
    """Takes a miss's lease in Redis where the cache offers it (module doc)."""

    def __init__(self, redis: Any, *, timeout_s: float = 0.3, refresh_s: float = 5.0) -> None:
        self._redis = redis
        self._acquire = DirectAcquire(redis)
        self._timeout_s = timeout_s
        self._refresh_s = refresh_s
        # The cache's current terms; None = not offered (or Redis failed since they were read).
        self.terms: LeaseTerms | None = None
        self._task: asyncio.Task[None] | None = None
        self._outcomes = {name: OUTCOMES.labels(name) for name in OUTCOME_NAMES}

    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._run(), name="gateway-direct-terms")

    async def close(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        with contextlib.suppress(RedisError, OSError):
            await self._redis.aclose()

    async def refresh(self) -> None:
        """Reads the cache's terms (None when absent, garbled or unreadable)."""
        try:
            async with asyncio.timeout(self._timeout_s):
                self.terms = await self._acquire.terms()
        except (RedisError, OSError, TimeoutError) as exc:
            log.debug("direct lookups off: terms not read (%s)", exc)
            self.terms = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            await self.refresh()

    async def acquire(self, tenant: str, key: cache_pb2.ResponseKey) -> str:
        """The lease token of a miss decided here, or "" (ask the cache service)."""
        terms = self.terms
        if terms is None:
            return ""
        try:
            domain = key_from_pb(key)
            if not is_cacheable(domain) or key_problem(domain, terms.max_key_bytes):
                self._outcomes["key"].inc()
                return ""
            keys = RedisKeys.of(tenant, domain)
            namespace = response_namespace(domain)
        except LlmeshError:
            self._outcomes["key"].inc()
            return ""  # the cache service says what is wrong with it
        try:
            async with asyncio.timeout(self._timeout_s):
                outcome, token = await self._acquire(tenant, keys, namespace, terms)
        except (RedisError, OSError, TimeoutError) as exc:
            # Off until the next refresh reads the terms again: a Redis that fails or stalls
            # must not add its timeout to every request.
            log.warning("direct lookups off until Redis answers again: %s", exc)
            self.terms = None
            self._outcomes["error"].inc()
            return ""
        counter = self._outcomes.get(outcome)
        if counter is not None:
            counter.inc()
        return token if outcome == "acquired" else ""


OUTCOME_NAMES = ("acquired", "entry", "versions", "busy", "key", "error")
