"""The consistency checker through two gateways with local hits on (gateway/local_cache.py).

Each gateway is the gateway's own cache stage (``CacheStage`` with ``LocalCopies`` and a
``VersionWatch`` on the real Redis, and ``DirectLookups`` deciding misses in that Redis), calling
its own cache replica through the runtime's client interceptors, exactly as ``gateway.mesh``
wires it. A worker looks up through one gateway and
writes (session appends, stores, invalidations) through the other, so every invalidation a
local copy must honour arrives by Redis' push, never through the gateway that holds the copy.

Every history has a reset a third of the way in (Redis killed and restarted, or flushed) and,
two thirds of the way in, both gateways' invalidation connections cut by ``CLIENT KILL``.
The checker's rules (tests/integration/cache/checker.py) hold over at least 10,000 operations.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
import redis.asyncio as aioredis
from llmesh.v1 import cache_pb2_grpc

from cache import app as cache_app
from gateway.direct_lookup import OUTCOME_NAMES as DIRECT_NAMES
from gateway.direct_lookup import OUTCOMES as DIRECT_OUTCOMES
from gateway.direct_lookup import DirectLookups
from gateway.local_cache import LocalCopies
from gateway.stages.cache import CacheStage
from services.runtime import context as rc
from services.runtime import redis_client
from services.runtime.interceptors import client_interceptors
from services.runtime.invalidations import CLIENT_NAME, VersionWatch
from tests.integration.cache import checker
from tests.integration.cache.checker import History, check
from tests.integration.cache.conftest import Served, serve_cache
from tests.integration.cache.redis_proc import RedisProcess
from tests.integration.cache.test_consistency_grpc import KEYS, GrpcTarget

log = logging.getLogger(__name__)

OPERATIONS = int(os.environ.get("LOCAL_OPS", "10000"))
HISTORIES = -(-OPERATIONS // (checker.WORKERS * checker.OPS_PER_WORKER))
HISTORY_TIMEOUT_S = 120.0


@dataclass
class Gateway:
    stage: CacheStage
    watch: VersionWatch
    copies: LocalCopies[object]
    channel: grpc.aio.Channel
    direct: DirectLookups


@dataclass
class Progress:
    """Operations started across a history's targets; ``reached`` is set at ``due``."""

    due: int
    started: int = 0
    reached: asyncio.Event = field(default_factory=asyncio.Event)

    def tick(self) -> None:
        self.started += 1
        if self.started >= self.due:
            self.reached.set()


class LocalTarget(GrpcTarget):
    """Lookups through one gateway's cache stage (local copies first); writes through another
    cache replica (the other gateway's)."""

    def __init__(self, gateway: Gateway, writes: Served, tenant: str, progress: Progress) -> None:
        super().__init__(writes, tenant)
        self.gateway = gateway
        self.progress = progress

    async def _call(self, *args: Any, **kwargs: Any) -> tuple[Any, dict[str, int]]:
        self.progress.tick()
        return await super()._call(*args, **kwargs)

    async def lookup(
        self, key_index: int, floors: dict[str, int], max_age_ms: int | None
    ) -> tuple[str, str, dict[str, int], int]:
        self.progress.tick()
        ctx = rc.new_context(tenant=self.tenant, floors=dict(floors), max_age_ms=max_age_ms)
        token = rc.activate(ctx)
        try:
            found = await self.gateway.stage.lookup(KEYS[key_index])
            status = found.status.name
            if status != "HIT" or found.entry is None:
                await self.gateway.stage.release(found)
                return status, "", {}, 0
            stamps = {s.namespace: s.version for s in found.entry.derived_from}
            return "HIT", found.entry.choices[0].text, stamps, found.age_ms
        finally:
            rc.deactivate(token)


async def _gateway(proc: RedisProcess, served: Served) -> Gateway:
    watch = VersionWatch(proc.url, retry_s=0.05)
    await watch.start()
    assert await watch.wait_connected(10.0)
    copies: LocalCopies[object] = LocalCopies(watch)
    channel = grpc.aio.insecure_channel(served.server.address, interceptors=client_interceptors())
    # Terms re-read often: a reset removes them until the cache renews them.
    direct = DirectLookups(redis_client.connect(proc.url, socket_timeout=2.0), timeout_s=2.0, refresh_s=0.2)
    await direct.start()
    stage = CacheStage(
        cache_pb2_grpc.ContextCacheServiceStub(channel),
        read_timeout_s=2.0,
        local=copies,  # type: ignore[arg-type]
        direct=direct,
    )
    return Gateway(stage, watch, copies, channel, direct)


@pytest.fixture(scope="module")
async def mesh() -> AsyncIterator[tuple[RedisProcess, list[Served], list[Gateway]]]:
    proc = RedisProcess()
    proc.start()
    with pytest.MonkeyPatch.context() as patch:
        # Terms renewed often: every reset removes them, and a history lasts about a second.
        patch.setattr(cache_app, "DIRECT_RENEW_S", 0.2)
        served = [
            await serve_cache(proc.url, redis_timeout_s=0.5, redis_connect_timeout_s=0.5) for _ in range(2)
        ]
        gateways = [await _gateway(proc, s) for s in served]
        yield proc, served, gateways
        for g in gateways:
            await g.watch.close()
            await g.direct.close()
            await g.channel.close()
        for s in served:
            await s.close()
    proc.close()


async def _cut_watches(proc: RedisProcess) -> int:
    """CLIENT KILL of every invalidation connection; how many were cut."""
    client = aioredis.from_url(proc.url)
    try:
        clients = await client.client_list()
        ids = [c["id"] for c in clients if c.get("name") == CLIENT_NAME]
        for client_id in ids:
            await client.client_kill_filter(_id=client_id)
        return len(ids)
    finally:
        await client.aclose()


async def _history(
    seed: int, proc: RedisProcess, served: list[Served], gateways: list[Gateway]
) -> tuple[History, int]:
    restart = seed % 2 == 1

    async def reset() -> None:
        if restart:
            proc.stop()
            proc.start()
        else:
            await checker.flush_all(proc.url)

    progress = Progress(due=2 * checker.WORKERS * checker.OPS_PER_WORKER // 3)
    targets = [
        LocalTarget(gateways[i], served[1 - i], f"local-checker-{seed}", progress)
        for i in range(len(gateways))
    ]
    run = asyncio.ensure_future(
        checker.run_history(targets, seed, reset, "restart" if restart else "flush")  # type: ignore[arg-type]
    )
    # Two thirds of the way in (after the reset), cut both gateways' invalidation connections
    # once they are back.
    due = asyncio.ensure_future(progress.reached.wait())
    await asyncio.wait({run, due}, return_when=asyncio.FIRST_COMPLETED)
    cuts = 0
    if due.done():
        for g in gateways:
            await g.watch.wait_connected(10.0)
        cuts = await _cut_watches(proc)
    due.cancel()
    return await run, cuts


async def test_histories_through_two_gateways_with_local_hits(
    mesh: tuple[RedisProcess, list[Served], list[Gateway]],
) -> None:
    proc, served, gateways = mesh
    histories, cut = [], 0
    connects = sum(g.watch.connects for g in gateways)
    direct_before = {name: DIRECT_OUTCOMES.labels(name)._value.get() for name in DIRECT_NAMES}
    for seed in range(HISTORIES):
        history, cuts = await checker.bounded(_history(seed, proc, served, gateways), seed, HISTORY_TIMEOUT_S)
        errors = check(history)
        assert not errors, f"seed {seed}: " + "; ".join(errors[:5])
        histories.append(history)
        cut += cuts
    counts = checker.tally(histories)
    operations = sum(len(h.ops) for h in histories)
    local_hits = sum(g.copies.hits for g in gateways)
    direct = {name: DIRECT_OUTCOMES.labels(name)._value.get() - direct_before[name] for name in DIRECT_NAMES}
    direct_misses = direct["acquired"]
    log.info(
        "checked %d histories through two gateways, %d operations, %d local hits (kept %s), "
        "%d misses decided directly (%s): %s",
        len(histories),
        operations,
        local_hits,
        [(g.copies.kept, g.copies.refused) for g in gateways],
        direct_misses,
        direct,
        sorted(counts.items()),
    )
    assert operations >= OPERATIONS
    assert counts.get("lookup:HIT", 0) > local_hits > 0  # some hits were local, some remote
    assert counts.get("lookup:STALE", 0) + counts.get("lookup:MISS", 0) > 0
    assert direct_misses > 0  # some misses were decided in Redis by the gateways
    assert cut == 2 * HISTORIES  # every history cut both connections...
    # ...and every restart and cut was followed by a new connection.
    assert sum(g.watch.connects for g in gateways) - connects >= 2 * (HISTORIES + HISTORIES // 2)
