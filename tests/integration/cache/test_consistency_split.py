"""The consistency checker with the split: versions and sessions in a main Redis, response
entries, leases and wake-ups in a dedicated responses Redis started with the shipped
``deploy/redis/redis.conf`` (allkeys-lfu, no persistence).

Each history kills+restarts or flushes ONE of the two in the middle (main restart, main
flush, responses restart, responses flush, in turn), through the core in process and
through two gRPC replicas. The lookup reads the entry from the responses Redis and the
versions from the main Redis after it; the checker proves no HIT ever crossed a completed
invalidation, session write or flush, and no write was lost.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from cache.backend import Backend, connect
from cache.service import CacheService
from tests.integration.cache import checker
from tests.integration.cache.checker import History, check
from tests.integration.cache.conftest import Served, serve_cache
from tests.integration.cache.redis_proc import SHIPPED_CONF, RedisProcess
from tests.integration.cache.test_consistency import CoreTarget
from tests.integration.cache.test_consistency_grpc import GrpcTarget

log = logging.getLogger(__name__)

CORE_HISTORIES = 8
GRPC_HISTORIES = 4
HISTORY_TIMEOUT_S = 120.0
# (which Redis, how) for history n: n % 4.
RESETS = (("main", "restart"), ("main", "flush"), ("responses", "restart"), ("responses", "flush"))

Pair = tuple[RedisProcess, RedisProcess]


@pytest.fixture(scope="module")
async def pair() -> AsyncIterator[Pair]:
    main = RedisProcess()
    responses = RedisProcess(config=SHIPPED_CONF)
    main.start()
    responses.start()
    yield main, responses
    main.close()
    responses.close()


def _reset(seed: int, pair: Pair) -> tuple[str, object]:
    which, how = RESETS[seed % len(RESETS)]
    proc = pair[0] if which == "main" else pair[1]

    async def reset() -> None:
        if how == "restart":
            proc.stop()
            proc.start()
        else:
            await checker.flush_all(proc.url)

    return f"{which}-{how}", reset


def _summary(histories: list[History], kind: str) -> dict[str, int]:
    counts = checker.tally(histories)
    log.info(
        "checked %d %s split histories, %d operations: %s",
        len(histories),
        kind,
        sum(len(h.ops) for h in histories),
        sorted(counts.items()),
    )
    return counts


async def _core_history(seed: int, pair: Pair) -> History:
    main = Backend(connect(pair[0].url, connect_timeout_s=0.5, timeout_s=0.5), timeout_s=0.5)
    responses = Backend(connect(pair[1].url, connect_timeout_s=0.5, timeout_s=0.5), timeout_s=0.5)
    service = CacheService(main, responses_backend=responses)
    assert service.split
    await service.start()
    kind, reset = _reset(seed, pair)
    try:
        target = CoreTarget(service, f"split-{seed}")
        return await checker.run_history([target], seed, reset, kind)  # type: ignore[arg-type]
    finally:
        await service.stop()
        await main.close()
        await responses.close()


async def test_split_histories_are_consistent(pair: Pair) -> None:
    histories = []
    for seed in range(CORE_HISTORIES):
        history = await checker.bounded(_core_history(seed, pair), seed, HISTORY_TIMEOUT_S)
        errors = check(history)
        assert not errors, f"seed {seed} ({history.resets[0].kind}): " + "; ".join(errors[:5])
        histories.append(history)
    counts = _summary(histories, "core")
    assert counts.get("lookup:HIT", 0) > 0
    assert counts.get("lookup:STALE", 0) > 0
    assert {r.kind for h in histories for r in h.resets} == {f"{w}-{h}" for w, h in RESETS}


@pytest.fixture(scope="module")
async def split_replicas(pair: Pair) -> AsyncIterator[list[Served]]:
    served = [
        await serve_cache(
            pair[0].url, responses_redis_url=pair[1].url, redis_timeout_s=0.5, redis_connect_timeout_s=0.5
        )
        for _ in range(2)
    ]
    yield served
    for s in served:
        await s.close()


async def test_split_histories_over_grpc(pair: Pair, split_replicas: list[Served]) -> None:
    histories = []
    for seed in range(GRPC_HISTORIES):
        kind, reset = _reset(seed, pair)
        targets = [GrpcTarget(s, f"grpc-split-{seed}") for s in split_replicas]
        history = await checker.bounded(
            checker.run_history(targets, seed, reset, kind),  # type: ignore[arg-type]
            seed,
            HISTORY_TIMEOUT_S,
        )
        errors = check(history)
        assert not errors, f"seed {seed} ({kind}): " + "; ".join(errors[:5])
        histories.append(history)
    counts = _summary(histories, "gRPC")
    assert counts.get("lookup:HIT", 0) > 0
    assert counts.get("lookup:STALE", 0) + counts.get("lookup:MISS", 0) > 0
