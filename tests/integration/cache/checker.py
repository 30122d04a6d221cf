"""The consistency checker of the cache protocol, shared by the in-process and the gRPC runs.

Seeded random histories of concurrent writers and readers (session appends with and
without expected versions, session reads with floors, response stores derived from
session and RAG versions, lookups with random floors and max-ages, namespace
invalidations) run against a :class:`Target` — the cache core in process, or the
cache service over gRPC — with a FLUSHALL or a Redis kill+restart in the middle.
Every operation is recorded with its wall-clock interval; :func:`check` replays the
history and returns every violation:

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
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import redis.asyncio as aioredis

T = TypeVar("T")

WORKERS = 8
OPS_PER_WORKER = 30
SESSIONS = ("s0", "s1")
KEY_COUNT = 3
RAG = "rag:kb"


class Failed(Exception):
    """An operation the target refused or could not do (UNAVAILABLE, ABORTED...): recorded, not checked."""


class Target(Protocol):
    """One tenant's view of the cache; each call raises :class:`Failed` for an expected refusal."""

    async def append(self, sid: str, turn: str, expected: int | None) -> int: ...

    async def read(self, sid: str, floor: int) -> tuple[int, list[str]]: ...

    async def store(self, key: int, value: str, derived: dict[str, int]) -> dict[str, int]: ...

    async def lookup(
        self, key: int, floors: dict[str, int], max_age_ms: int | None
    ) -> tuple[str, str, dict[str, int], int]:
        """(status, value, stamps, age_ms); value/stamps/age only for a HIT."""
        ...

    async def bump(self, namespace: str) -> int: ...


@dataclass
class Op:
    kind: str
    start: float
    end: float = 0.0
    ok: bool = False
    error: str = ""
    args: dict[str, Any] = field(default_factory=dict)
    out: dict[str, Any] = field(default_factory=dict)
    # The same moments on the monotonic clock: a local copy's age runs on it, a remote entry's on
    # Redis' wall clock, so a step of the wall clock between two ops moves only one of them.
    mono_start: float = field(default_factory=time.monotonic)
    mono_end: float = 0.0


@dataclass
class History:
    ops: list[Op] = field(default_factory=list)
    resets: list[Op] = field(default_factory=list)
    # Set once this many operations are done: the moment to wipe Redis.
    reset_after: int = WORKERS * OPS_PER_WORKER // 3
    reset_due: asyncio.Event = field(default_factory=asyncio.Event)
    # Operations started and not yet answered (what a hang was waiting for).
    in_flight: list[Op] = field(default_factory=list)


# The histories now running (a hang's report lists what they still wait for).
_running: list[History] = []


async def _record(
    history: History, kind: str, args: dict[str, Any], fn: Callable[[], Awaitable[dict[str, Any]]]
) -> Op:
    op = Op(kind=kind, start=time.time(), args=args)
    history.in_flight.append(op)
    try:
        op.out = await fn()
        op.ok = True
    except Failed as exc:
        op.error = str(exc)
    finally:
        history.in_flight.remove(op)
    op.end, op.mono_end = time.time(), time.monotonic()
    history.ops.append(op)
    if len(history.ops) >= history.reset_after:
        history.reset_due.set()
    return op


async def worker(target: Target, history: History, rng: random.Random, wid: int) -> None:
    """One client's random operations; it remembers the versions it saw and uses them as floors."""
    seen: dict[str, int] = {}
    for n in range(OPS_PER_WORKER):
        choice = rng.random()
        sid = rng.choice(SESSIONS)
        ns = "session:" + sid
        if choice < 0.2:
            turn_id = f"w{wid}-{n}"
            expected = seen.get(ns) if rng.random() < 0.5 else None

            async def append(
                sid: str = sid, turn_id: str = turn_id, expected: int | None = expected
            ) -> dict[str, Any]:
                return {"version": await target.append(sid, turn_id, expected)}

            op = await _record(history, "append", {"ns": ns, "turn": turn_id, "expected": expected}, append)
            if op.ok:
                seen[ns] = op.out["version"]
        elif choice < 0.4:
            floor = seen.get(ns, 0) if rng.random() < 0.7 else rng.choice([0, seen.get(ns, 0) + 1])

            async def read(sid: str = sid, floor: int = floor) -> dict[str, Any]:
                version, turns = await target.read(sid, floor)
                return {"version": version, "turns": turns}

            op = await _record(history, "read", {"ns": ns, "floor": floor}, read)
            if op.ok:
                seen[ns] = max(seen.get(ns, 0), op.out["version"])
        elif choice < 0.6:
            k = rng.randrange(KEY_COUNT)
            value = f"v{wid}-{n}"
            derived = {ns: 0, RAG: 0} if rng.random() < 0.5 else {RAG: 0}

            async def store(
                k: int = k, value: str = value, derived: dict[str, int] = derived
            ) -> dict[str, Any]:
                return {"stamps": await target.store(k, value, derived)}

            await _record(history, "store", {"key": k, "value": value}, store)
        elif choice < 0.95:
            k = rng.randrange(KEY_COUNT)
            floors: dict[str, int] = {}
            for name in (ns, RAG):
                if name in seen and rng.random() < 0.5:
                    floors[name] = seen[name] + rng.choice([0, 0, 0, 1])
            max_age = rng.choice([None, None, 0, rng.randint(1, 300)])

            async def lookup(
                k: int = k, floors: dict[str, int] = floors, max_age: int | None = max_age
            ) -> dict[str, Any]:
                status, value, stamps, age = await target.lookup(k, floors, max_age)
                if status != "HIT":
                    return {"status": status}
                return {"status": "HIT", "value": value, "stamps": stamps, "age": age}

            await _record(history, "lookup", {"key": k, "floors": floors, "max_age": max_age}, lookup)
        else:

            async def bump() -> dict[str, Any]:
                return {"version": await target.bump(RAG)}

            op = await _record(history, "bump", {"ns": RAG}, bump)
            if op.ok:
                seen[RAG] = op.out["version"]


async def run_history(
    targets: list[Target], seed: int, reset: Callable[[], Awaitable[None]], kind: str
) -> History:
    """``WORKERS`` workers over ``targets`` (round robin); ``reset`` runs a third of the way in."""
    rng = random.Random(seed)
    history = History()
    _running.append(history)
    workers = [
        asyncio.create_task(worker(targets[w % len(targets)], history, random.Random(rng.random()), w))
        for w in range(WORKERS)
    ]
    running: asyncio.Future[list[None]] = asyncio.gather(*workers)
    due: asyncio.Task[bool] = asyncio.create_task(history.reset_due.wait())
    try:
        await asyncio.wait([due, running], return_when=asyncio.FIRST_COMPLETED)  # type: ignore[type-var]
        due.cancel()
        op = Op(kind=kind, start=time.time())
        await reset()
        op.end = time.time()
        history.resets.append(op)
        await running
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        _running.remove(history)
    return history


async def flush_all(url: str) -> None:
    """A history's flush, on a client of its own: a pooled connection of the service's client may
    be one that an earlier history's restart closed, and the reset itself must not fail on it."""
    client = aioredis.from_url(url)
    try:
        await client.flushall()
    finally:
        await client.aclose()


def _stacks() -> str:
    """Where every task of the loop waits, innermost frame last. Formatted by hand: a frame of a
    compiled module (grpc's Cython server loop) has no line number, which ``Task.print_stack``
    cannot print."""
    out = io.StringIO()
    for task in asyncio.all_tasks():
        out.write(f"{task.get_name()}:\n")
        for frame in task.get_stack(limit=12):
            code = frame.f_code
            out.write(f"  {code.co_filename}:{frame.f_lineno} in {code.co_name}\n")
    return out.getvalue()


async def bounded(history: Awaitable[T], seed: int, timeout_s: float) -> T:
    """Runs one history; a hang fails with where every task was waiting (taken before cancelling)
    and the operations still unanswered."""
    task = asyncio.ensure_future(history)
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if not done:
        out = io.StringIO(_stacks())
        out.seek(0, io.SEEK_END)
        now = time.time()
        for watched in _running:
            for op in watched.in_flight:
                out.write(f"unanswered for {now - op.start:.1f} s: {op.kind} {op.args}\n")
            resets = [(r.kind, round(r.end - r.start, 3)) for r in watched.resets]
            out.write(f"done: {len(watched.ops)}; resets: {resets}\n")
        task.cancel()
        await asyncio.wait({task}, timeout=10)
        raise AssertionError(f"seed {seed}: history not done in {timeout_s:.0f} s; tasks:\n{out.getvalue()}")
    return task.result()


def tally(histories: list[History]) -> dict[str, int]:
    """Operation counts by kind, outcome and lookup status (what the histories exercised)."""
    counts: dict[str, int] = {}
    for history in histories:
        for op in history.ops:
            label = (
                op.kind
                + ("" if op.ok else ":failed")
                + (f":{op.out['status']}" if op.kind == "lookup" and op.ok else "")
            )
            counts[label] = counts.get(label, 0) + 1
    return counts


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
            # Understated when below the time since the store by both clocks (they differ only
            # where the wall clock was stepped in between).
            since = min(op.start - origin.end, op.mono_start - origin.mono_end)
            if origin.ok and op.out["age"] < since * 1000 - 2:
                errors.append(f"HIT age {op.out['age']} ms understated (stored {since:.3f}s before)")
            for ns, bump in bumps:
                if ns in stamps and bump.end < op.start and stamps[ns] < bump.out["version"]:
                    errors.append(
                        f"HIT derived from {ns}={stamps[ns]} after it moved to {bump.out['version']}"
                    )
            for reset in history.resets:
                if origin.end < reset.start and reset.end < op.start:
                    errors.append(f"HIT of {value}, stored before a flush that completed before the lookup")
    return errors
