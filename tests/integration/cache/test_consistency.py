"""Property-based consistency check of the cache core on a real Redis (see ``checker``).

The core runs in process (no gRPC), so the histories are fast and many; a FLUSHALL or a
Redis kill+restart happens in the middle of each. ``test_consistency_grpc`` runs the same
checker through the gRPC service.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

import pytest

from cache.backend import Backend, connect
from cache.domain import ResponseKey, Status, Turn
from cache.service import CacheService
from cache.sessions import session_namespace
from services.runtime import context as rc
from services.runtime.errors import Aborted, NotFound, Unavailable
from tests.integration.cache import checker
from tests.integration.cache.checker import RAG, Failed, History, Op, check
from tests.integration.cache.redis_proc import RedisProcess

log = logging.getLogger(__name__)

HISTORIES = 24
KEYS = tuple(
    ResponseKey(model="m", messages=(Turn("user", f"q{i}"),), sampling={"temperature": 0.0})
    for i in range(checker.KEY_COUNT)
)
# One history takes well under a second on a quiet machine; the bound turns a hang into a
# failure that shows where every task was waiting.
HISTORY_TIMEOUT_S = 120.0


class CoreTarget:
    """The cache core in process, one tenant; floors and max-age go through the request context."""

    def __init__(self, service: CacheService, tenant: str) -> None:
        self.service = service
        self.tenant = tenant

    def _ctx(self, floors: dict[str, int] | None = None, max_age_ms: int | None = None) -> rc.RequestContext:
        ctx = rc.new_context(tenant=self.tenant)
        ctx.floors = dict(floors or {})
        ctx.max_age_ms = max_age_ms
        return ctx

    async def _run(self, ctx: rc.RequestContext, fn: object) -> object:
        token = rc.activate(ctx)
        try:
            return await fn  # type: ignore[misc]
        except (Aborted, Unavailable) as exc:
            raise Failed(type(exc).__name__) from exc
        finally:
            rc.deactivate(token)

    async def append(self, sid: str, turn: str, expected: int | None) -> int:
        got = await self._run(self._ctx(), self.service.append_turns(sid, [Turn("user", turn)], expected))
        return int(got[0])  # type: ignore[index]

    async def read(self, sid: str, floor: int) -> tuple[int, list[str]]:
        ctx = self._ctx({"session:" + sid: floor} if floor else {})
        try:
            view = await self._run(ctx, self.service.get_session(sid))
        except NotFound:
            # No turns yet (or flushed): the version read still reached the context.
            return ctx.observed[session_namespace(sid)], []
        return view.version, [t.content for t in view.turns]  # type: ignore[attr-defined]

    async def store(self, key: int, value: str, derived: dict[str, int]) -> dict[str, int]:
        ctx = self._ctx()
        await self._run(ctx, self.service.store(KEYS[key], value.encode(), derived))
        return dict(ctx.observed)

    async def lookup(
        self, key: int, floors: dict[str, int], max_age_ms: int | None
    ) -> tuple[str, str, dict[str, int], int]:
        result = await self._run(self._ctx(floors, max_age_ms), self.service.lookup(KEYS[key]))
        if result.status is not Status.HIT or result.entry is None:  # type: ignore[attr-defined]
            return result.status.value, "", {}, 0  # type: ignore[attr-defined]
        entry = result.entry  # type: ignore[attr-defined]
        return "HIT", entry.payload.decode(), dict(entry.derived_from), result.age_ms  # type: ignore[attr-defined]

    async def bump(self, namespace: str) -> int:
        versions = await self._run(self._ctx(), self.service.invalidate_namespace(namespace))
        return int(versions[namespace])  # type: ignore[index]


@pytest.fixture(scope="module")
async def checker_redis() -> AsyncIterator[RedisProcess]:
    proc = RedisProcess()
    proc.start()
    yield proc
    proc.close()


async def _run_history(seed: int, proc: RedisProcess, restart: bool) -> History:
    backend = Backend(connect(proc.url, connect_timeout_s=0.5, timeout_s=0.5), timeout_s=0.5)
    service = CacheService(backend)
    await service.start()

    async def reset() -> None:
        if restart:
            proc.stop()
            proc.start()
        else:
            await checker.flush_all(proc.url)

    try:
        target = CoreTarget(service, f"checker-{seed}")
        return await checker.run_history([target], seed, reset, "restart" if restart else "flush")
    finally:
        await service.stop()
        await backend.close()


async def test_histories_are_consistent(checker_redis: RedisProcess) -> None:
    histories = []
    for seed in range(HISTORIES):
        history = await checker.bounded(
            _run_history(seed, checker_redis, restart=seed % 6 == 5), seed, HISTORY_TIMEOUT_S
        )
        errors = check(history)
        assert not errors, f"seed {seed}: " + "; ".join(errors[:5])
        histories.append(history)
    counts = checker.tally(histories)
    total_ops = sum(len(h.ops) for h in histories)
    log.info("checked %d histories, %d operations: %s", len(histories), total_ops, sorted(counts.items()))
    # The histories exercised what they claim to: hits, stale/misses, conflicts, invalidations.
    assert counts.get("lookup:HIT", 0) > 0
    assert counts.get("lookup:STALE", 0) > 0
    assert counts.get("append:failed", 0) > 0
    assert total_ops == HISTORIES * checker.WORKERS * checker.OPS_PER_WORKER


def test_checker_catches_violations() -> None:
    """The checker itself can fail: a stale HIT, a lost write and a floor violation are all reported."""
    t = time.time()
    write = Op("append", t, t + 0.001, True, args={"ns": "session:s0", "turn": "a"}, out={"version": 10})
    bump = Op("bump", t, t + 0.001, True, args={"ns": RAG}, out={"version": 20})
    store = Op("store", t, t + 0.001, True, args={"key": 0, "value": "v"}, out={"stamps": {}})
    read = Op(
        "read",
        t + 1,
        t + 1.001,
        True,
        args={"ns": "session:s0", "floor": 11},
        out={"version": 10, "turns": []},
    )
    hit = Op(
        "lookup",
        t + 1,
        t + 1.001,
        True,
        args={"key": 0, "floors": {}, "max_age": None},
        out={"status": "HIT", "value": "v", "stamps": {RAG: 19}, "age": 1000},
    )
    errors = check(History(ops=[write, bump, store, read, hit]))
    assert any("lost write" in e for e in errors)
    assert any("below its floor" in e for e in errors)
    assert any("moved to" in e for e in errors)


def test_checker_judges_a_hits_age_by_both_clocks() -> None:
    """An age below the time since the store is reported; where the wall clock was stepped in
    between (the monotonic interval is shorter), an age that matches the monotonic one is not."""
    t, m = time.time(), time.monotonic()
    store = Op("store", t, t + 0.001, True, mono_start=m, mono_end=m + 0.001, args={"key": 0, "value": "v"})

    def hit(wall_s: float, mono_s: float, age: int) -> Op:
        return Op(
            "lookup",
            t + wall_s,
            t + wall_s + 0.001,
            True,
            mono_start=m + mono_s,
            mono_end=m + mono_s + 0.001,
            args={"key": 0, "floors": {}, "max_age": None},
            out={"status": "HIT", "value": "v", "stamps": {}, "age": age},
        )

    assert any("understated" in e for e in check(History(ops=[store, hit(1.0, 1.0, 900)])))
    assert not check(History(ops=[store, hit(1.0, 1.0, 1000)]))
    # The wall clock stepped 8 ms forward between the store and the lookup.
    assert not check(History(ops=[store, hit(1.008, 1.0, 1000)]))
    assert any("understated" in e for e in check(History(ops=[store, hit(1.008, 1.0, 990)])))
