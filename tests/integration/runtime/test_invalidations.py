"""VersionWatch (services/runtime/invalidations.py) on a real Redis of the test's own."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Sequence

import pytest
import redis.asyncio as aioredis

from services.runtime.invalidations import CLIENT_NAME, VersionWatch
from services.runtime.versions import VersionStore, version_key
from tests.integration.cache.redis_proc import RedisProcess


@pytest.fixture
async def redis_proc() -> AsyncIterator[RedisProcess]:
    proc = RedisProcess()
    proc.start()
    yield proc
    proc.close()


@pytest.fixture
async def watched(redis_proc: RedisProcess) -> AsyncIterator[tuple[VersionWatch, list[Sequence[str] | None]]]:
    watch = VersionWatch(redis_proc.url, retry_s=0.05)
    pushed: list[Sequence[str] | None] = []
    watch.subscribe(pushed.append)
    await watch.start()
    assert await watch.wait_connected(10.0)
    yield watch, pushed
    await watch.close()


async def test_a_bump_elsewhere_is_applied_before_the_barrier_returns(
    redis_proc: RedisProcess, watched: tuple[VersionWatch, list[Sequence[str] | None]]
) -> None:
    watch, pushed = watched
    client = aioredis.from_url(redis_proc.url)
    versions = VersionStore(client)
    key = version_key("t1", "rag:kb")
    await versions.get("t1", "rag:kb", hold="keep")
    assert await watch.barrier()
    mark = watch.mark()
    assert mark is not None
    pushed.clear()
    await versions.bump("t1", "rag:kb")
    # No waiting for the push: the barrier alone orders it before whatever comes next.
    assert await watch.barrier()
    assert [key] in pushed
    assert watch.changed_since(mark, [key])
    assert not watch.changed_since(mark, [version_key("t1", "rag:other")])
    # Reading a version (a stamped read keeps its key alive) is not a change once it holds
    # long enough: busy keys are not rewritten on every read.
    pushed.clear()
    for _ in range(5):
        await versions.get("t1", "rag:kb", hold="keep")
    assert await watch.barrier()
    assert pushed == []
    await client.aclose()


async def test_a_flush_or_a_cut_connection_invalidates_everything(
    redis_proc: RedisProcess, watched: tuple[VersionWatch, list[Sequence[str] | None]]
) -> None:
    watch, pushed = watched
    client = aioredis.from_url(redis_proc.url)
    mark = watch.mark()
    assert mark is not None
    await client.flushall()
    await watch.barrier()  # False: the flush moved the epoch while it waited
    assert None in pushed and watch.changed_since(mark, [])
    assert await watch.barrier()
    mark = watch.mark()
    assert mark is not None
    connects = watch.connects
    ids = [c["id"] for c in await client.client_list() if c.get("name") == CLIENT_NAME]
    assert len(ids) == 1
    await client.client_kill_filter(_id=ids[0])
    # The cut is seen (every copy dropped), then the watch connects again by itself.
    while watch.connects == connects:
        assert await watch.wait_connected(10.0)
        await watch.barrier()
    assert watch.changed_since(mark, [])
    assert await watch.barrier()
    await client.aclose()


async def test_no_redis_no_barrier(
    redis_proc: RedisProcess, watched: tuple[VersionWatch, list[Sequence[str] | None]]
) -> None:
    watch, pushed = watched
    redis_proc.stop()
    assert not await watch.barrier()
    assert watch.mark() is None or not await watch.barrier()
    assert None in pushed


async def test_a_stalled_redis_times_barriers_out_and_its_late_answer_is_harmless(
    redis_proc: RedisProcess, watched: tuple[VersionWatch, list[Sequence[str] | None]]
) -> None:
    watch, _ = watched
    assert redis_proc.proc is not None
    pid = redis_proc.proc.proc.pid
    os.kill(pid, signal.SIGSTOP)  # connected, but answers nothing
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        # Three barriers of one loop step share one PING and its one timer; one of them is
        # cancelled, which must not cancel the PING the other two wait on.
        first, second, third = (asyncio.ensure_future(watch.barrier()) for _ in range(3))
        await asyncio.sleep(0)
        second.cancel()
        assert await first is False and await third is False
        assert second.cancelled()
        waited = loop.time() - started
        assert watch.barrier_timeout_s <= waited < watch.barrier_timeout_s + 2.0
    finally:
        os.kill(pid, signal.SIGCONT)
    # The late PONG meets a future already answered False: no error, and the watch goes on.
    assert await watch.barrier()
    assert watch.connected
