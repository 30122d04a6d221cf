"""Soak, faults under load and rolling upgrade, each returning its figures as a BenchReport.

Every scenario starts its own :class:`~benchmarks.reliability.mesh.LocalMesh` and
always stops it (``async with``). Phases are measured on the load generator's
clock: a request belongs to a phase if it was in flight when the fault began or
started before the phase ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness import RESULTS_DIR, BenchReport
from benchmarks.reliability.balancer import GatewayBalancer
from benchmarks.reliability.load import LoadConfig, LoadGenerator, Outcome, summarize
from benchmarks.reliability.mesh import LocalMesh, RedisMode
from benchmarks.reliability.probes import Sample, Sampler, growth, leak

log = logging.getLogger(__name__)

SOAK_HANG_S = 330.0
# A kill of the Redis primary: how long the sentinels get to promote a replica (down-after 1 s,
# the election, the promotion) before the phase records that none did.
FAILOVER_LIMIT_S = 60.0
REDIS_PRIMARY = "redis-primary"
LOAD_AVG_NOTE = "load average at start {0:.1f}/{1:.1f}/{2:.1f} on {3} cores"


def load_note() -> str:
    return LOAD_AVG_NOTE.format(*os.getloadavg(), os.cpu_count())


# -- helpers --------------------------------------------------------------------------------------


async def wait_for_ok(gen: LoadGenerator, count: int, limit_s: float) -> bool:
    """Waits until ``count`` requests succeeded (the mesh is warm), at most ``limit_s``."""
    return await gen.until(lambda: sum(1 for o in gen.outcomes if o.ok) >= count, limit_s)


async def wait_recovered(
    gen: LoadGenerator, since: float, good: Callable[[Outcome], bool], limit_s: float
) -> float | None:
    """Load-clock start of the first request started after ``since`` that turned out ``good``."""

    def hits() -> list[float]:
        return [o.start for o in gen.outcomes if o.start >= since and good(o)]

    await gen.until(lambda: bool(hits()), limit_s)
    found = hits()
    return min(found) if found else None


class ReadyzPoller:
    """Polls the gateway's /readyz: when did it see an inference replica leave and return."""

    def __init__(self, base_url: str, clock: Callable[[], float], period_s: float = 0.05) -> None:
        self.base_url = base_url
        self.clock = clock
        self.period_s = period_s
        self.points: list[tuple[float, str]] = []
        self._task: asyncio.Task[None] | None = None

    async def _loop(self) -> None:
        async with httpx.AsyncClient(base_url=self.base_url, timeout=2.0) as http:
            while True:
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                    reply = await http.get("/readyz")
                    replicas = str(reply.json()["checks"].get("inference_replicas", "?"))
                    if not self.points or self.points[-1][1] != replicas:
                        self.points.append((self.clock(), replicas))
                await asyncio.sleep(self.period_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="readyz poller")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def first_change_after(self, t: float, value_prefix: str) -> float | None:
        for when, value in self.points:
            if when >= t and value.startswith(value_prefix):
                return when
        return None


@dataclass
class Phase:
    """One fault (or one service's restart) and what the load saw meanwhile."""

    name: str
    action: str
    t_start: float
    t_restart: float = 0.0
    t_up: float = 0.0
    t_end: float = 0.0
    restart_s: float = 0.0
    t_recovered: float | None = None
    inflight_at_start: list[int] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def outcomes(self, all_outcomes: Sequence[Outcome]) -> list[Outcome]:
        ids = set(self.inflight_at_start)
        return [o for o in all_outcomes if o.rid in ids or self.t_start <= o.start <= self.t_end]

    def row(self, all_outcomes: Sequence[Outcome]) -> dict[str, Any]:
        mine = self.outcomes(all_outcomes)
        ids = set(self.inflight_at_start)
        inflight = [o for o in mine if o.rid in ids]
        new = [o for o in mine if o.rid not in ids]
        late = [o for o in new if o.start >= self.t_start + 1.0]
        summary = summarize(mine)
        row: dict[str, Any] = {
            "phase": self.name,
            "action": self.action,
            "t_start": round(self.t_start, 1),
            "t_up": round(self.t_up, 1),
            "requests": summary["requests"],
            "ok": summary["ok"],
            "failed": summary["failed"],
            "inflight_failed": sum(1 for o in inflight if not o.ok),
            "inflight": len(inflight),
            "new_failed": sum(1 for o in new if not o.ok),
            "new_failed_after_1s": sum(1 for o in late if not o.ok),
            "hangs": sum(1 for o in mine if o.error == "hang"),
            "bypass": summary["cache_status"].get("BYPASS", 0),
            "errors": summary["errors"],
            "max_latency_s": summary["latency_max_s"],
            "restart_s": round(self.restart_s, 2),
            "recovered_after_up_s": None
            if self.t_recovered is None
            else round(max(0.0, self.t_recovered - self.t_up), 2),
            "version_violations": summary["version_violations"],
        }
        messages = Counter(f"{o.error}: {o.message}" for o in mine if not o.ok)
        row["error_messages"] = [f"{n}x {m}" for m, n in messages.most_common(4)]
        row.update(self.extra)
        return row


def _inflight(gen: LoadGenerator) -> list[int]:
    return list(gen.inflight)


async def _close_phase(gen: LoadGenerator, phase: Phase, limit_s: float = 120.0) -> None:
    """Ends the phase now and waits for its requests to finish, so none overlaps the next fault."""
    phase.t_end = max(gen.now(), phase.t_recovered or 0.0)
    await gen.until(lambda: not any(o.start <= phase.t_end for o in gen.inflight.values()), limit_s)


async def kill_and_restart(
    mesh: LocalMesh, gen: LoadGenerator, target: str, down_s: float, recovered: Callable[[Outcome], bool]
) -> Phase:
    """kill -9 ``target`` (a service or ``redis``), keep it down ``down_s``, start it on the same port."""
    phase = Phase(target, "kill -9", gen.now(), inflight_at_start=_inflight(gen))
    if target == "redis":
        await mesh.redis.kill()
    else:
        await mesh[target].kill()
    await asyncio.sleep(down_s)  # the outage being measured
    phase.t_restart = gen.now()
    phase.restart_s = await (mesh.redis.start() if target == "redis" else mesh[target].start())
    phase.t_up = gen.now()
    phase.t_recovered = await wait_recovered(gen, phase.t_up, recovered, 60.0)
    await _close_phase(gen, phase)
    return phase


async def kill_redis_primary(
    mesh: LocalMesh, gen: LoadGenerator, down_s: float, recovered: Callable[[Outcome], bool]
) -> Phase:
    """kill -9 the Redis primary the sentinels name; it stays down ``down_s`` (and at least until a
    replica is promoted: back before that, it would take writes again as the primary), then starts
    on its port as a replica of the new primary.

    Beside the usual figures the row has ``failover_s`` (kill to the first sentinel naming a new
    primary), ``recovered_after_failover_s`` (from then to the first request started afterwards
    that was served with the cache again) and ``rejoined_s`` (restart to the returned node in sync).
    """
    replicated = mesh.replicated
    if replicated is None:
        raise ValueError(f"{REDIS_PRIMARY} needs a replicated Redis (LocalMesh(redis='sentinel'))")
    old = await replicated.primary_port()
    if old is None:
        raise RuntimeError("no sentinel names a Redis primary")
    phase = Phase(REDIS_PRIMARY, "kill -9", gen.now(), inflight_at_start=_inflight(gen))
    killed = time.monotonic()
    await replicated.kill(old)
    new = await replicated.wait_promoted(old, FAILOVER_LIMIT_S)
    failover_s = time.monotonic() - killed
    t_failover = gen.now()
    phase.extra.update(
        old_primary=old,
        new_primary=new,
        failover_s=None if new is None else round(failover_s, 2),
    )
    await asyncio.sleep(max(0.0, down_s - failover_s))  # the rest of the outage being measured
    phase.t_restart = gen.now()
    phase.restart_s = await replicated.restart(old)
    phase.t_up = gen.now()
    restarted = time.monotonic()
    await replicated.wait_replicated(FAILOVER_LIMIT_S)
    phase.extra["rejoined_s"] = round(time.monotonic() - restarted, 2)
    phase.t_recovered = await wait_recovered(gen, phase.t_up, recovered, 60.0)
    await _close_phase(gen, phase)
    # Every request of the phase has finished: the first good one started after the promotion.
    after_failover = await wait_recovered(gen, t_failover, recovered, 0.0)
    phase.extra["recovered_after_failover_s"] = (
        None if after_failover is None else round(after_failover - t_failover, 2)
    )
    return phase


async def pause_and_resume(mesh: LocalMesh, gen: LoadGenerator, target: str, paused_s: float) -> Phase:
    """SIGSTOP ``target`` for ``paused_s`` (longer than the request deadline), then SIGCONT."""
    phase = Phase(target, f"SIGSTOP {paused_s:.0f}s", gen.now(), inflight_at_start=_inflight(gen))
    await mesh[target].pause()
    try:
        await asyncio.sleep(paused_s)  # the pause being measured
    finally:
        await mesh[target].resume()
    phase.t_restart = phase.t_up = gen.now()
    phase.t_recovered = await wait_recovered(gen, phase.t_up, lambda o: o.ok, 60.0)
    # Requests that were stuck on the paused service finish (or fail) after SIGCONT.
    await _close_phase(gen, phase)
    return phase


async def drain_and_restart(
    mesh: LocalMesh, gen: LoadGenerator, target: str, settle_s: float, limit_s: float
) -> Phase:
    """SIGTERM (drain) ``target``, start it again on the same port, watch the load ``settle_s`` more."""
    phase = Phase(target, "SIGTERM+restart", gen.now(), inflight_at_start=_inflight(gen))
    code, drain_s = await mesh[target].drain(limit_s)
    phase.extra["exit_code"] = code
    phase.extra["drain_s"] = round(drain_s, 2)
    phase.t_restart = gen.now()
    phase.restart_s = await mesh[target].start()
    phase.t_up = gen.now()
    phase.t_recovered = await wait_recovered(gen, phase.t_up, lambda o: o.ok, 60.0)
    await asyncio.sleep(settle_s)  # requests started right after the restart are part of the phase
    await _close_phase(gen, phase)
    return phase


def write_timeline(name: str, payload: dict[str, Any], results_dir: Path | None) -> Path:
    """The per-sample / per-request detail beside ``<name>.json`` (too long for the table)."""
    out = results_dir or RESULTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}-timeline.json"
    path.write_text(json.dumps(payload, indent=1, default=str) + "\n", encoding="utf-8")
    return path


def _progress(name: str, phases: Sequence[Phase], gen: LoadGenerator, results_dir: Path | None) -> None:
    """Phases so far, written as they finish (a long run cut short still leaves its figures)."""
    rows = [p.row(gen.outcomes) for p in phases]
    write_timeline(f"{name}-partial", {"phases": rows}, results_dir)
    log.info("%s: %s", name, rows[-1])


# -- soak -----------------------------------------------------------------------------------------


@dataclass
class SoakConfig:
    replicas: int = 2
    clients: int = 50
    duration_s: float = 600.0
    warmup_s: float = 60.0
    interval_s: float = 10.0
    max_tokens: int = 24
    max_requests: int | None = None
    redis: RedisMode = "single"
    workdir: Path | None = None
    results_dir: Path | None = None


async def _idle_sample(sampler: Sampler, t: float, limit_s: float = 20.0) -> dict[str, Sample]:
    """A sample once connections and tasks stop changing (idle), bounded by ``limit_s``."""
    deadline = time.monotonic() + limit_s
    previous: dict[str, tuple[int | None, int]] = {}
    latest: dict[str, Sample] = {}
    while True:
        latest = {s.service: s for s in await sampler.sample_once(label_t=t)}
        current = {name: (s.tasks, s.tcp) for name, s in latest.items()}
        if current == previous or time.monotonic() > deadline:
            return latest
        previous = current
        await asyncio.sleep(1.0)  # idle settling: closed connections take a moment to go


def _timeline(
    samples: Sequence[Sample], outcomes: Sequence[Outcome], interval_s: float
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    times = sorted({s.t for s in samples})
    last = 0.0
    for t in times:
        done = [o for o in outcomes if last <= o.end < t]
        point: dict[str, Any] = {
            "t": t,
            "ok": sum(1 for o in done if o.ok),
            "failed": sum(1 for o in done if not o.ok),
        }
        for s in samples:
            if s.t == t:
                point[s.service] = {
                    "rss_mb": s.rss_mb,
                    "tree_rss_mb": s.tree_rss_mb,
                    "fds": s.fds,
                    "tcp": s.tcp,
                    "tasks": s.tasks,
                }
        out.append(point)
        last = t
    return out


async def soak(config: SoakConfig) -> BenchReport:
    notes = [load_note()]
    async with LocalMesh(config.replicas, workdir=config.workdir, redis=config.redis) as mesh:
        notes.append(f"mesh start (s): {json.dumps({k: round(v, 1) for k, v in mesh.start_s.items()})}")
        # Warm-up: the first requests of each kind build lazily made state (tokenizers, channels,
        # the embeddings batcher); idle counts are compared from there on. Every client runs at
        # least two requests, half of the others from the cached pool (a HIT, a semantic lookup).
        warm = LoadGenerator(
            mesh.base_url,
            LoadConfig(
                clients=config.clients,
                duration_s=config.warmup_s,
                min_per_client=2,
                repeat_share=0.5,
                hang_s=SOAK_HANG_S,
                seed=1,
            ),
        )
        warm_outcomes = await warm.run()
        sampler = Sampler(mesh, config.interval_s)
        before = await _idle_sample(sampler, -1.0)
        sampler.start()
        gen = LoadGenerator(
            mesh.base_url,
            LoadConfig(
                clients=config.clients,
                duration_s=config.duration_s,
                max_requests=config.max_requests,
                max_tokens=config.max_tokens,
                # Past the gateway's own request deadline (300 s): only a real hang gets there.
                hang_s=SOAK_HANG_S,
                seed=2,
            ),
        )
        outcomes = await gen.run()
        await sampler.sample_once()
        after = await _idle_sample(sampler, gen.now() + 1.0)
        await sampler.stop()
    summary = summarize(outcomes)
    rows: list[dict[str, Any]] = []
    for name in mesh.names():
        series = [s for s in sampler.series(name) if s.t >= 0]
        first = next((s for s in series if s.t >= config.warmup_s), None)
        last = series[-1] if series else None
        rows.append(
            {
                "service": name,
                "rss_mb_after_warmup": None if first is None else first.rss_mb,
                "rss_mb_end": None if last is None else last.rss_mb,
                "rss_growth_pct": round(100 * growth(series, config.warmup_s, "rss_mb"), 2),
                "tree_rss_growth_pct": round(100 * growth(series, config.warmup_s, "tree_rss_mb"), 2),
                "tasks_idle_before": before[name].tasks if name in before else None,
                "tasks_idle_after": after[name].tasks if name in after else None,
                "tasks_peak": max((s.tasks or 0 for s in series), default=None),
                "tcp_idle_before": before[name].tcp if name in before else None,
                "tcp_idle_after": after[name].tcp if name in after else None,
                "tcp_peak": max((s.tcp for s in series), default=None),
                "fds_idle_before": before[name].fds if name in before else None,
                "fds_idle_after": after[name].fds if name in after else None,
                "task_leak": leak(before.get(name), after.get(name), "tasks"),
                "tcp_leak": leak(before.get(name), after.get(name), "tcp"),
                "fd_leak": leak(before.get(name), after.get(name), "fds"),
            }
        )
    headline: dict[str, Any] = {
        "replicas": config.replicas,
        "clients": config.clients,
        "redis": config.redis,
        "duration_s": round(gen.now(), 1),
        "warmup_requests": len(warm_outcomes),
        "warmup_failed": sum(1 for o in warm_outcomes if not o.ok),
        **summary,
        "requests_per_s": round(len(outcomes) / max(gen.now(), 1e-9), 2),
        "max_rss_growth_pct": max(
            (r["rss_growth_pct"] for r in rows if r["rss_growth_pct"] == r["rss_growth_pct"]), default=None
        ),
        "max_tree_rss_growth_pct": max(
            (r["tree_rss_growth_pct"] for r in rows if r["tree_rss_growth_pct"] == r["tree_rss_growth_pct"]),
            default=None,
        ),
        "task_leaks": {r["service"]: r["task_leak"] for r in rows},
        "tcp_leaks": {r["service"]: r["tcp_leak"] for r in rows},
        "fd_leaks": {r["service"]: r["fd_leak"] for r in rows},
    }
    failures = Counter(f"{o.error}: {o.message}" for o in outcomes if not o.ok)
    notes += [f"failure: {n}x {m}" for m, n in failures.most_common(5)]
    path = write_timeline(
        "soak",
        {
            "timeline": _timeline(sampler.samples, outcomes, config.interval_s),
            "idle_before": {k: v.to_json() for k, v in before.items()},
            "idle_after": {k: v.to_json() for k, v in after.items()},
        },
        config.results_dir,
    )
    notes.append(f"time series: {path}")
    return BenchReport("soak", rows, headline, notes)


# -- faults ---------------------------------------------------------------------------------------


@dataclass
class FaultsConfig:
    replicas: int = 2
    clients: int = 16
    kills: tuple[str, ...] = ("cache", "embeddings", "policy", "inference-2", "redis")
    pauses: tuple[str, ...] = ("cache", "inference-2")
    down_s: float = 5.0
    request_timeout_s: float = 15.0
    max_tokens: int = 24
    settle_s: float = 3.0
    # "sentinel": a replicated Redis, and a kill of ``redis`` kills its primary (redis-primary).
    redis: RedisMode = "single"
    # One API key configured in the gateway (LLMESH_GATEWAY_API_KEYS, as deploy/ configures keys)
    # and sent by every client. Without, the gateway runs open (loopback, no key anywhere), and
    # open mode is decided in Redis (no stored key?) while the gateway's snapshot of the key store
    # is stale: with Redis unreachable it answers 503 rather than run open.
    api_key: bool = False
    workdir: Path | None = None
    results_dir: Path | None = None


def _configured_key() -> tuple[str, dict[str, str]]:
    """A fresh API key and the gateway environment that configures it (tenant ``bench``)."""
    from gateway.auth import hash_key

    key = "sk-bench-" + secrets.token_hex(16)
    return key, {"LLMESH_GATEWAY_API_KEYS": json.dumps({hash_key(key): "bench"})}


def _recovery_check(target: str) -> Callable[[Outcome], bool]:
    if target in ("cache", "redis", REDIS_PRIMARY):
        return lambda o: o.ok and o.cache_status not in (None, "BYPASS")
    return lambda o: o.ok


async def _with_load(
    mesh: LocalMesh,
    load: LoadConfig,
    body: Callable[[LoadGenerator, ReadyzPoller], Awaitable[list[Phase]]],
    balancer: GatewayBalancer | None = None,
) -> tuple[list[Phase], list[Outcome], ReadyzPoller, LoadGenerator]:
    gen = LoadGenerator(mesh.base_url, load, balancer=balancer)
    poller = ReadyzPoller(mesh.base_url, gen.now)
    if balancer is not None:
        balancer.start()
    task = asyncio.create_task(gen.run(), name="load")
    poller.start()
    try:
        if not await wait_for_ok(gen, max(4, load.clients), 300.0):
            raise RuntimeError(f"the mesh served no load: {summarize(gen.outcomes)}")
        phases = await body(gen, poller)
    finally:
        gen.stop()
        await poller.stop()
        outcomes = await task
        if balancer is not None:
            await balancer.stop()
    return phases, outcomes, poller, gen


async def faults(config: FaultsConfig) -> BenchReport:
    notes = [load_note()]
    gateway_env = {"LLMESH_GATEWAY_REQUEST_TIMEOUT_S": str(config.request_timeout_s)}
    api_key = None
    if config.api_key:
        api_key, key_env = _configured_key()
        gateway_env.update(key_env)
    load = LoadConfig(
        clients=config.clients,
        duration_s=24 * 3600,
        max_tokens=config.max_tokens,
        hang_s=config.request_timeout_s + 60.0,
        api_key=api_key,
        seed=3,
    )
    async with LocalMesh(
        config.replicas, service_env={"gateway": gateway_env}, workdir=config.workdir, redis=config.redis
    ) as mesh:

        async def body(gen: LoadGenerator, poller: ReadyzPoller) -> list[Phase]:
            phases: list[Phase] = []
            for name in config.kills:
                target = REDIS_PRIMARY if name == "redis" and mesh.replicated is not None else name
                if target == REDIS_PRIMARY:
                    if mesh.replicated is None:
                        notes.append(f"{target}: only with a replicated Redis (--redis sentinel), skipped")
                        continue
                    phase = await kill_redis_primary(mesh, gen, config.down_s, _recovery_check(target))
                    phases.append(phase)
                    _progress("faults", phases, gen, config.results_dir)
                    await asyncio.sleep(config.settle_s)  # back to steady load before the next fault
                    continue
                if target != "redis" and target not in mesh.services:
                    notes.append(f"{target}: not in this mesh, skipped")
                    continue
                phase = await kill_and_restart(mesh, gen, target, config.down_s, _recovery_check(target))
                if target.startswith("inference"):
                    left = poller.first_change_after(phase.t_start, f"{config.replicas - 1}/")
                    phase.extra["route_away_s"] = None if left is None else round(left - phase.t_start, 3)
                phases.append(phase)
                _progress("faults", phases, gen, config.results_dir)
                await asyncio.sleep(config.settle_s)  # back to steady load before the next fault
            for target in config.pauses:
                if target not in mesh.services:
                    continue
                phases.append(await pause_and_resume(mesh, gen, target, config.request_timeout_s + 5.0))
                _progress("faults", phases, gen, config.results_dir)
                await asyncio.sleep(config.settle_s)
            return phases

        phases, outcomes, poller, _ = await _with_load(mesh, load, body)
    rows = [p.row(outcomes) for p in phases]
    summary = summarize(outcomes)
    headline: dict[str, Any] = {
        "replicas": config.replicas,
        "clients": config.clients,
        "request_timeout_s": config.request_timeout_s,
        "down_s": config.down_s,
        "redis": config.redis,
        "api_key": "configured" if config.api_key else "none (open)",
        # 1: every recovery happened without restarting the gateway.
        "gateway_starts": mesh["gateway"].starts,
        **summary,
    }
    notes.append(f"gateway /readyz inference replicas over time: {poller.points}")
    path = write_timeline(
        "faults", {"phases": rows, "outcomes": [o.to_json() for o in outcomes]}, config.results_dir
    )
    notes.append(f"per-request outcomes: {path}")
    (path.parent / "faults-partial-timeline.json").unlink(missing_ok=True)
    return BenchReport("faults", rows, headline, notes)


# -- rolling upgrade --------------------------------------------------------------------------------


@dataclass
class UpgradeConfig:
    replicas: int = 2
    clients: int = 16
    order: tuple[str, ...] = ()
    # Drain grace of every service (LLMESH_<SERVICE>_GRACE_SECONDS): longer than a stream lasts
    # on this machine, as deploy/README.md's runbook says to set it.
    grace_s: float = 60.0
    max_tokens: int = 24
    settle_s: float = 3.0
    # Instances of policy and of the gateway (the load balances over the gateways' /readyz).
    policy_instances: int = 2
    gateways: int = 2
    # How long a draining gateway goes on taking requests after the last one arrived
    # (its /readyz is already 503; the balancer polls every 0.2 s).
    gateway_drain_quiet_s: float = 1.0
    workdir: Path | None = None
    results_dir: Path | None = None


async def upgrade(config: UpgradeConfig) -> BenchReport:
    notes = [load_note()]
    load = LoadConfig(clients=config.clients, duration_s=24 * 3600, max_tokens=config.max_tokens, seed=4)
    from services.runtime.cli import catalog

    env = {spec.name: {f"{spec.env_prefix}GRACE_SECONDS": str(config.grace_s)} for spec in catalog.SERVICES}
    env["gateway"]["LLMESH_GATEWAY_DRAIN_QUIET_S"] = str(config.gateway_drain_quiet_s)
    notes.append(f"drain grace of every service: {config.grace_s:g} s")
    instances = {"policy": config.policy_instances, "gateway": config.gateways}
    notes.append(f"instances: {instances}, inference replicas: {config.replicas}")
    async with LocalMesh(
        config.replicas, service_env=env, workdir=config.workdir, instances=instances
    ) as mesh:
        balancer = GatewayBalancer(mesh.base_urls)
        order = list(config.order) or mesh.names()

        async def body(gen: LoadGenerator, poller: ReadyzPoller) -> list[Phase]:
            phases = []
            for target in order:
                phase = await drain_and_restart(mesh, gen, target, config.settle_s, config.grace_s + 30)
                if target.startswith("inference"):
                    left = poller.first_change_after(phase.t_start, f"{config.replicas - 1}/")
                    phase.extra["route_away_s"] = None if left is None else round(left - phase.t_start, 3)
                phases.append(phase)
                _progress("upgrade", phases, gen, config.results_dir)
            return phases

        phases, outcomes, poller, _ = await _with_load(mesh, load, body, balancer)
    rows = [p.row(outcomes) for p in phases]
    for row, phase in zip(rows, phases, strict=True):
        row["refused_retried"] = sum(o.refused for o in phase.outcomes(outcomes))
    headline: dict[str, Any] = {
        "replicas": config.replicas,
        "clients": config.clients,
        **instances,
        "refused_retried": balancer.refused_retries,
        **summarize(outcomes),
    }
    notes.append(f"gateway /readyz inference replicas over time: {poller.points}")
    path = write_timeline(
        "upgrade", {"phases": rows, "outcomes": [o.to_json() for o in outcomes]}, config.results_dir
    )
    notes.append(f"per-request outcomes: {path}")
    (path.parent / "upgrade-partial-timeline.json").unlink(missing_ok=True)
    return BenchReport("upgrade", rows, headline, notes)
