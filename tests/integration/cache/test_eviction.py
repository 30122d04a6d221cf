"""deploy/redis/redis.conf under memory pressure: hot entries survive, cold ones go; with the
split (a dedicated responses Redis), sessions and versions in the main Redis are untouched."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from cache.backend import Backend, connect
from cache.domain import ResponseKey, Status, Turn
from cache.service import CacheService
from services.runtime import context as rc
from tests.fixtures.context import activated
from tests.integration.cache.redis_proc import SHIPPED_CONF, RedisProcess


@pytest.fixture
async def service() -> AsyncIterator[CacheService]:
    # The shipped config with a small maxmemory, to force eviction.
    proc = RedisProcess(config=SHIPPED_CONF, extra_args=["--maxmemory", "5mb"])
    proc.start()
    # Generous timeouts: this test is about eviction, not about a busy host's latency.
    backend = Backend(connect(proc.url, connect_timeout_s=5, timeout_s=5), timeout_s=5)
    yield CacheService(backend)
    await backend.close()
    proc.close()


def _key(i: int) -> ResponseKey:
    return ResponseKey(model="m", messages=(Turn("user", f"question {i}"),), sampling={"temperature": 0.0})


async def test_hot_entries_survive_cold_ones_go(service: CacheService) -> None:
    with activated(rc.new_context(tenant="evict")):
        policy = await service.backend.redis.config_get("maxmemory-policy")
        assert policy["maxmemory-policy"] == "allkeys-lfu"
        payload = b"x" * 2048
        hot = range(50)
        for i in hot:
            assert (await service.store(_key(i), payload, {})).stored
        for _ in range(30):
            for i in hot:
                assert (await service.lookup(_key(i))).status is Status.HIT
        # About 3x maxmemory of cold entries, each touched once (when written), while the hot
        # ones keep being read (so the LFU decay of idle minutes does not level them).
        cold = range(1000, 1000 + 6_000)
        for n, i in enumerate(cold):
            await service.store(_key(i), payload, {})
            if n % 100 == 0:
                for h in hot:
                    await service.lookup(_key(h))
        info = await service.backend.redis.info("stats")
        assert info["evicted_keys"] > 0
        hot_alive = sum([(await service.lookup(_key(i))).status is Status.HIT for i in hot])
        sample = list(cold)[:1000]
        cold_alive = sum([(await service.lookup(_key(i))).status is Status.HIT for i in sample])
        assert hot_alive / len(hot) >= 0.9
        assert cold_alive / len(sample) <= 0.5


@pytest.fixture
async def split() -> AsyncIterator[tuple[CacheService, Any]]:
    """The split: main Redis as in docker-compose (volatile-ttl, no limit hit here) holding
    versions and sessions; the responses Redis from the shipped redis.conf, 3 MB."""
    main = RedisProcess(extra_args=["--maxmemory-policy", "volatile-ttl"])
    responses = RedisProcess(config=SHIPPED_CONF, extra_args=["--maxmemory", "3mb"])
    main.start()
    responses.start()
    backends = [
        Backend(connect(p.url, connect_timeout_s=5, timeout_s=5), timeout_s=5) for p in (main, responses)
    ]
    yield CacheService(backends[0], responses_backend=backends[1]), backends
    for b in backends:
        await b.close()
    main.close()
    responses.close()


async def test_split_hot_entries_survive_cold_go_sessions_and_versions_untouched(
    split: tuple[CacheService, Any],
) -> None:
    service, (main, responses) = split
    with activated(rc.new_context(tenant="evict-split")):
        policy = await responses.redis.config_get("maxmemory-policy")
        assert policy["maxmemory-policy"] == "allkeys-lfu"
        sessions = {}
        for s in range(20):
            sid = f"s{s}"
            version, _ = await service.append_turns(sid, [Turn("user", f"turn of {sid}")])
            sessions[sid] = version
        # The owners make their versions (policy on its first check, embeddings on ingest).
        await service.versions.get("evict-split", "policy")
        await service.versions.bump("evict-split", "rag:kb")
        versions = await service.get_versions(["policy", "rag:kb", "tenant", "response:default"])
        payload = b"x" * 8192
        hot = range(30)
        for i in hot:
            assert (await service.store(_key(i), payload, {"policy": 0, "rag:kb": 0})).stored
        # LFU counters grow logarithmically (lfu-log-factor 10) from a new key's 5: 40 reads left a
        # hot key only a step or two above a cold one, and eviction (5 sampled keys) then took
        # up to a fifth of the hot ones; 150 reads keep them clearly apart.
        for _ in range(150):
            for i in hot:
                assert (await service.lookup(_key(i))).status is Status.HIT
        # About 3x maxmemory of cold entries, each written once, while the hot ones keep being read.
        cold = range(1000, 1000 + 1_200)
        for n, i in enumerate(cold):
            await service.store(_key(i), payload, {"policy": 0, "rag:kb": 0})
            if n % 50 == 0:
                for h in hot:
                    await service.lookup(_key(h))
        assert (await responses.redis.info("stats"))["evicted_keys"] > 0
        hot_alive = sum([(await service.lookup(_key(i))).status is Status.HIT for i in hot])
        cold_alive = sum([(await service.lookup(_key(i))).status is Status.HIT for i in cold])
        assert hot_alive / len(hot) >= 0.9
        assert cold_alive / len(cold) <= 0.5
        # The main Redis evicted nothing: every session whole at its version, versions unmoved.
        assert (await main.redis.info("stats"))["evicted_keys"] == 0
        for sid, version in sessions.items():
            view = await service.get_session(sid)
            assert (view.version, [t.content for t in view.turns]) == (version, [f"turn of {sid}"])
        assert await service.get_versions(list(versions)) == versions
