"""Property-based consistency check of the cache core on a real Redis.

Seeded random histories: concurrent writers and readers (session appends with and
without expected versions, session reads with floors, response stores derived from
session and RAG versions, lookups with random floors and max-ages, namespace
invalidations), with a FLUSHALL or a Redis kill+restart in the middle of each
history. Every operation is recorded with its wall-clock interval; the checker then
replays the history and asserts that:

* no read violated its bound: a session read is at or above its floor; a HIT is at
  or above every floor, younger than max-age (and its reported age is not
  understated), never with max-age 0, never from before a completed invalidation,
  session write or flush of a namespace it was derived from, and never a value
  nobody stored;
* no write was lost: an acknowledged append is in every later session read unless
  a flush/restart happened in between; the turns of a read come in version order;
* versions are monotonic per namespace across flushes and restarts.
"""

from __future__ import annotations

import asyncio
import io
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pytest

from cache.backend import Backend, connect
from cache.domain import ResponseKey, Status, Turn
from cache.service import CacheService
from cache.sessions import session_namespace
from services.runtime import context as rc
from services.runtime.errors import Aborted, NotFound, Unavailable
from tests.integration.cache.redis_proc import RedisProcess

log = logging.getLogger(__name__)

HISTORIES = 24
WORKERS = 8
OPS_PER_WORKER = 30
SESSIONS = ("s0", "s1")
KEYS = tuple(
    ResponseKey(model="m", messages=(Turn("user", f"q{i}"),), sampling={"temperature": 0.0}) for i in range(3)
)
RAG = "rag:kb"
# One history takes well under a second on a quiet machine; this bound turns a hang into a
# failure that shows where every task was waiting.
HISTORY_TIMEOUT_S = 120.0


@dataclass
class Op:
    kind: str
    start: float
    end: float = 0.0
    ok: bool = False
    error: str = ""
    args: dict[str, Any] = field(default_factory=dict)
    out: dict[str, Any] = field(default_factory=dict)


@dataclass
class History:
    ops: list[Op] = field(default_factory=list)
    resets: list[Op] = field(default_factory=list)
    # Set once this many operations are done: the moment to wipe Redis.
    reset_after: int = WORKERS * OPS_PER_WORKER // 3
    reset_due: asyncio.Event = field(default_factory=asyncio.Event)


async def _record(
    history: History, kind: str, args: dict[str, Any], fn: Callable[[], Awaitable[dict[str, Any]]]
) -> Op:
    op = Op(kind=kind, start=time.time(), args=args)
    try:
        op.out = await fn()
        op.ok = True
    except (Aborted, Unavailable) as exc:
        op.error = type(exc).__name__
    op.end = time.time()
    history.ops.append(op)
    if len(history.ops) >= history.reset_after:
        history.reset_due.set()
    return op


async def _append(service: CacheService, sid: str, turn_id: str, expected: int | None) -> dict[str, Any]:
    version, _ = await service.append_turns(sid, [Turn("user", turn_id)], expected)
    return {"version": version}


async def _read(service: CacheService, sid: str) -> dict[str, Any]:
    try:
        view = await service.get_session(sid)
    except NotFound:
        # No turns yet (or flushed): the version read still reached the context.
        return {"version": rc.current().observed[session_namespace(sid)], "turns": []}
    return {"version": view.version, "turns": [t.content for t in view.turns]}


async def _store(service: CacheService, k: int, value: str, derived: dict[str, int]) -> dict[str, Any]:
    result = await service.store(KEYS[k], value.encode(), derived)
    return {"stored": result.stored, "stamps": dict(rc.current().observed)}


async def _lookup(service: CacheService, k: int) -> dict[str, Any]:
    result = await service.lookup(KEYS[k])
    if result.status is not Status.HIT or result.entry is None:
        return {"status": result.status.value}
    return {
        "status": "HIT",
        "value": result.entry.payload.decode(),
        "stamps": dict(result.entry.derived_from),
        "age": result.age_ms,
    }


async def _invalidate(service: CacheService) -> dict[str, Any]:
    versions = await service.invalidate_namespace(RAG)
    return {"version": versions[RAG]}


async def _worker(service: CacheService, history: History, rng: random.Random, wid: int, tenant: str) -> None:
    seen: dict[str, int] = {}
    for n in range(OPS_PER_WORKER):
        ctx = rc.new_context(tenant=tenant)
        token = rc.activate(ctx)
        try:
            choice = rng.random()
            sid = rng.choice(SESSIONS)
            ns = "session:" + sid
            if choice < 0.2:
                turn_id = f"w{wid}-{n}"
                expected = seen.get(ns) if rng.random() < 0.5 else None
                args: dict[str, Any] = {"ns": ns, "turn": turn_id, "expected": expected}
                op = await _record(history, "append", args, partial(_append, service, sid, turn_id, expected))
                if op.ok:
                    seen[ns] = op.out["version"]
            elif choice < 0.4:
                floor = seen.get(ns, 0) if rng.random() < 0.7 else rng.choice([0, seen.get(ns, 0) + 1])
                ctx.floors = {ns: floor} if floor else {}
                op = await _record(history, "read", {"ns": ns, "floor": floor}, partial(_read, service, sid))
                if op.ok:
                    seen[ns] = max(seen.get(ns, 0), op.out["version"])
            elif choice < 0.6:
                k = rng.randrange(len(KEYS))
                value = f"v{wid}-{n}"
                derived = {ns: 0, RAG: 0} if rng.random() < 0.5 else {RAG: 0}
                await _record(
                    history, "store", {"key": k, "value": value}, partial(_store, service, k, value, derived)
                )
            elif choice < 0.95:
                k = rng.randrange(len(KEYS))
                floors: dict[str, int] = {}
                for name in (ns, RAG):
                    if name in seen and rng.random() < 0.5:
                        floors[name] = seen[name] + rng.choice([0, 0, 0, 1])
                ctx.floors = floors
                ctx.max_age_ms = rng.choice([None, None, 0, rng.randint(1, 300)])
                args = {"key": k, "floors": floors, "max_age": ctx.max_age_ms}
                await _record(history, "lookup", args, partial(_lookup, service, k))
            else:
                op = await _record(history, "bump", {"ns": RAG}, partial(_invalidate, service))
                if op.ok:
                    seen[RAG] = op.out["version"]
        finally:
            rc.deactivate(token)


def _bumps(history: History) -> list[tuple[str, Op]]:
    """(namespace, op) of every acknowledged write that produced a version."""
    out = [(op.args["ns"], op) for op in history.ops if op.ok and op.kind in ("append", "bump")]
    return sorted(out, key=lambda item: item[1].end)


def _reset_between(history: History, start: float, end: float) -> bool:
    return any(r.start < end and r.end > start for r in history.resets)


def check(history: History) -> list[str]:
    """Every violation found in the history (empty = consistent)."""
    errors: list[str] = []
    bumps = _bumps(history)
    # Monotonic versions per namespace, across flushes and restarts.
    for i, (ns, a) in enumerate(bumps):
        for ns2, b in bumps[i + 1 :]:
            if ns2 == ns and a.end < b.start and b.out["version"] <= a.out["version"]:
                errors.append(f"{ns}: version {b.out['version']} after {a.out['version']} (not monotonic)")
    appends = [op for op in history.ops if op.kind == "append"]
    stores = {op.args["value"]: op for op in history.ops if op.kind == "store"}
    for op in history.ops:
        if not op.ok:
            continue
        if op.kind == "read":
            ns, version, turns = op.args["ns"], op.out["version"], op.out["turns"]
            if version < op.args["floor"]:
                errors.append(f"read of {ns} at {version} below its floor {op.args['floor']}")
            for a in appends:
                if a.args["ns"] != ns:
                    continue
                if a.ok and a.end < op.start and not _reset_between(history, a.start, op.end):
                    if a.args["turn"] not in turns:
                        errors.append(f"lost write: {a.args['turn']} acknowledged before a read of {ns}")
                    if version < a.out["version"]:
                        errors.append(
                            f"read of {ns} at {version} older than an earlier write {a.out['version']}"
                        )
            known = {a.args["turn"]: a for a in appends if a.args["ns"] == ns}
            versions = []
            for turn in turns:
                origin = known.get(turn)
                if origin is None or origin.start > op.end:
                    errors.append(f"read of {ns} returned a turn nobody wrote: {turn}")
                elif origin.ok:
                    versions.append(origin.out["version"])
            if versions != sorted(versions):
                errors.append(f"read of {ns}: turns out of version order")
        elif op.kind == "lookup" and op.out["status"] == "HIT":
            stamps, value = op.out["stamps"], op.out["value"]
            origin = stores.get(value)
            if origin is None or origin.start > op.end or origin.args["key"] != op.args["key"]:
                errors.append(f"lookup served {value}, which nobody stored under that key")
                continue
            for ns, floor in op.args["floors"].items():
                # A floor binds the namespaces the entry was derived from.
                if ns in stamps and stamps[ns] < floor:
                    errors.append(f"HIT with {ns}={stamps.get(ns)} below the floor {floor}")
            max_age = op.args["max_age"]
            if max_age is not None and op.out["age"] >= max_age:
                errors.append(f"HIT aged {op.out['age']} ms with max-age {max_age}")
            if origin.ok and op.out["age"] < (op.start - origin.end) * 1000 - 2:
                errors.append(
                    f"HIT age {op.out['age']} ms understated (stored {op.start - origin.end:.3f}s before)"
                )
            for ns, bump in bumps:
                if ns in stamps and bump.end < op.start and stamps[ns] < bump.out["version"]:
                    errors.append(
                        f"HIT derived from {ns}={stamps[ns]} after it moved to {bump.out['version']}"
                    )
            for reset in history.resets:
                if origin.end < reset.start and reset.end < op.start:
                    errors.append(f"HIT of {value}, stored before a flush that completed before the lookup")
    return errors


@pytest.fixture(scope="module")
async def checker_redis() -> AsyncIterator[RedisProcess]:
    proc = RedisProcess()
    proc.start()
    yield proc
    proc.close()


async def _run_history(seed: int, proc: RedisProcess, restart: bool) -> History:
    rng = random.Random(seed)
    backend = Backend(connect(proc.url, connect_timeout_s=0.5, timeout_s=0.5), timeout_s=0.5)
    service = CacheService(backend)
    await service.start()
    history = History()
    try:
        workers = [
            asyncio.create_task(_worker(service, history, random.Random(rng.random()), w, f"checker-{seed}"))
            for w in range(WORKERS)
        ]
        # Let the workers get going, then wipe Redis under them.
        running: asyncio.Future[list[None]] = asyncio.gather(*workers)
        due: asyncio.Task[bool] = asyncio.create_task(history.reset_due.wait())
        await asyncio.wait([due, running], return_when=asyncio.FIRST_COMPLETED)  # type: ignore[type-var]
        due.cancel()
        reset = Op(kind="restart" if restart else "flush", start=time.time())
        if restart:
            proc.stop()
            proc.start()
        else:
            await backend.redis.flushall()
        reset.end = time.time()
        history.resets.append(reset)
        await running
    finally:
        await service.stop()
        await backend.close()
    return history


def _task_stacks() -> str:
    out = io.StringIO()
    for task in asyncio.all_tasks():
        task.print_stack(limit=8, file=out)
    return out.getvalue()


async def _bounded_history(seed: int, proc: RedisProcess, restart: bool) -> History:
    task = asyncio.create_task(_run_history(seed, proc, restart))
    done, _ = await asyncio.wait({task}, timeout=HISTORY_TIMEOUT_S)
    if not done:
        # Where everything waits, taken before cancelling disturbs it.
        stacks = _task_stacks()
        task.cancel()
        await asyncio.wait({task}, timeout=10)
        pytest.fail(f"seed {seed}: history not done in {HISTORY_TIMEOUT_S:.0f} s; tasks:\n{stacks}")
    return task.result()


async def test_histories_are_consistent(checker_redis: RedisProcess) -> None:
    total_ops = histories = 0
    counts: dict[str, int] = {}
    for seed in range(HISTORIES):
        history = await _bounded_history(seed, checker_redis, restart=seed % 6 == 5)
        errors = check(history)
        assert not errors, f"seed {seed}: " + "; ".join(errors[:5])
        histories += 1
        total_ops += len(history.ops)
        for op in history.ops:
            label = (
                op.kind
                + ("" if op.ok else f":{op.error}")
                + (f":{op.out['status']}" if op.kind == "lookup" and op.ok else "")
            )
            counts[label] = counts.get(label, 0) + 1
    log.info("checked %d histories, %d operations: %s", histories, total_ops, sorted(counts.items()))
    # The histories exercised what they claim to: hits, stale/misses, conflicts, invalidations.
    assert counts.get("lookup:HIT", 0) > 0
    assert counts.get("lookup:STALE", 0) > 0
    assert counts.get("append:Aborted", 0) > 0
    assert total_ops == HISTORIES * WORKERS * OPS_PER_WORKER


def test_checker_catches_violations() -> None:
    """The checker itself can fail: a stale HIT, a lost write and a floor violation are all reported."""
    t = time.time()
    write = Op("append", t, t + 0.001, True, args={"ns": "session:s0", "turn": "a"}, out={"version": 10})
    bump = Op("bump", t, t + 0.001, True, args={"ns": RAG}, out={"version": 20})
    store = Op("store", t, t + 0.001, True, args={"key": 0, "value": "v"}, out={"stored": True})
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
