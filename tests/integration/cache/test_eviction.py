"""deploy/redis/redis.conf under memory pressure: hot entries survive, cold ones go."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cache.backend import Backend, connect
from cache.domain import ResponseKey, Status, Turn
from cache.service import CacheService
from services.runtime import context as rc
from tests.integration.cache.redis_proc import RedisProcess

CONF = Path(__file__).resolve().parents[3] / "deploy" / "redis" / "redis.conf"


class ConfiguredRedis(RedisProcess):
    """redis-server reading the shipped config, with a small maxmemory to force eviction."""

    def start(self) -> None:
        import subprocess

        self.proc = subprocess.Popen(
            ["redis-server", str(CONF), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
             "--maxmemory", "5mb"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if "Ready to accept connections" in line:
                return
        raise RuntimeError(f"redis-server exited with {self.proc.wait()}")


@pytest.fixture
async def service() -> AsyncIterator[CacheService]:
    proc = ConfiguredRedis()
    proc.start()
    # Generous timeouts: this test is about eviction, not about a busy host's latency.
    backend = Backend(connect(proc.url, connect_timeout_s=5, timeout_s=5), timeout_s=5)
    yield CacheService(backend)
    await backend.close()
    proc.close()


def _key(i: int) -> ResponseKey:
    return ResponseKey(model="m", messages=(Turn("user", f"question {i}"),), sampling={"temperature": 0.0})


async def test_hot_entries_survive_cold_ones_go(service: CacheService) -> None:
    token = rc.activate(rc.new_context(tenant="evict"))
    try:
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
            if n % 300 == 0:
                for h in hot:
                    await service.lookup(_key(h))
        info = await service.backend.redis.info("stats")
        assert info["evicted_keys"] > 0
        hot_alive = sum([(await service.lookup(_key(i))).status is Status.HIT for i in hot])
        sample = list(cold)[:1000]
        cold_alive = sum([(await service.lookup(_key(i))).status is Status.HIT for i in sample])
        assert hot_alive / len(hot) >= 0.9
        assert cold_alive / len(sample) <= 0.5
    finally:
        rc.deactivate(token)
