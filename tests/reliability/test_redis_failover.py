"""Kill -9 the Redis primary under load: Sentinel promotes a replica, clients of a
``redis+sentinel://`` URL (services/runtime/redis_client.py) find it, and nothing acknowledged is lost.

Real processes on loopback ports 16390-16396 (benchmarks/reliability/redis_ha.py, the set
``llmesh bench faults --redis sentinel`` runs): a primary and two replicas (every one started with
``min-replicas-to-write 1``, so whichever is primary refuses writes when no replica follows it),
three sentinels (quorum 2, ``down-after-milliseconds`` 1000), and a spare Redis without replicas.
Two replicas, not one: after a failover the new primary still has a replica, so it takes writes
before the killed node returns (the Kubernetes component runs three Redis pods for that reason).

The load runs the real code paths: version bumps and reads (services/runtime/versions.py, as policy
uses them), session appends and reads with their version floors (cache/sessions.py through the
cache's Backend and blocking pool), and policy audit appends (policy/audit.py). The clients wait
for one replica after each write (``WAIT``, the sentinel URL's default): that is what makes an
acknowledged write survive the primary's death, since replication is asynchronous and
``min-replicas-to-write`` alone only stops an isolated primary from taking writes. Asserted: a
sentinel promotes a replica; each workload succeeds again within :data:`RECOVERY_BOUND_S` (the times
measured are printed); no version issued twice, none below one already acknowledged, no session read
below its acknowledged version; every acknowledged session turn is there afterwards, in order; the
audit chain verifies (policy/audit_check.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from redis.exceptions import RedisError

from benchmarks.reliability.redis_ha import ReplicatedRedis, until
from cache.backend import Backend
from cache.backend import connect as cache_connect
from cache.domain import Turn
from cache.sessions import SessionLimits, SessionStore
from policy.audit import AuditLog, AuditRecord
from policy.audit_check import verify
from services.runtime import redis_client
from services.runtime.errors import Unavailable
from services.runtime.versions import VersionStore
from tests.integration.cache.redis_proc import RedisProcess

pytestmark = [
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
    pytest.mark.timeout(90),
]

MASTER = "llmesh"
PRIMARY_PORT = 16390
REPLICA_PORTS = (16391, 16392)
SENTINEL_PORTS = (16393, 16394, 16395)
SPARE_PORT = 16396
SENTINEL_URL = "redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in SENTINEL_PORTS) + f"/{MASTER}/0"
# The bound asserted on each workload's recovery (kill to its first success): sentinel's
# down-after (1 s), the election and promotion, the other replica's reconfiguration (it must
# follow the new primary before min-replicas-to-write lets writes in), and the clients' backoff.
RECOVERY_BOUND_S = 15.0
WARMUP_OPS = 40
RETRY_BACKOFF_S = 0.05
TENANT = "failover"
HMAC_KEY = b"k" * 32


@dataclass
class Topology:
    cluster: ReplicatedRedis
    spare: RedisProcess

    async def kill(self, port: int) -> None:
        await self.cluster.kill(port)  # SIGKILL: no shutdown, no last save


@pytest.fixture(scope="module")
async def topology(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Topology]:
    # The set of benchmarks/reliability/redis_ha.py (as `llmesh bench faults --redis sentinel` runs
    # it), on this module's ports, without persistence: what survives is what a replica acknowledged.
    cluster = ReplicatedRedis(
        tmp_path_factory.mktemp("sentinel"),
        master=MASTER,
        ports=[PRIMARY_PORT, *REPLICA_PORTS],
        sentinel_ports=SENTINEL_PORTS,
        appendonly=False,
    )
    spare = RedisProcess(SPARE_PORT)
    try:
        await cluster.start()
        spare.start()
        yield Topology(cluster, spare)
    finally:
        await cluster.stop()
        spare.close()


def plain(port: int) -> Any:
    """A client of one Redis or sentinel process (str answers)."""
    return redis_client.connect(f"redis://127.0.0.1:{port}/0", socket_timeout=1.0, decode_responses=True)


async def master_port(topology: Topology) -> int:
    """The port of the primary the sentinels name (the first sentinel that answers)."""
    port = await topology.cluster.primary_port()
    assert port is not None, "no sentinel answers"
    return port


@contextlib.asynccontextmanager
async def opened(url: str, **options: Any) -> AsyncIterator[Any]:
    client = redis_client.connect(url, **options)
    try:
        yield client
    finally:
        await client.aclose()


# -- what a client meets when the server cannot act as the primary -----------------------------------


async def test_a_write_to_a_demoted_primary_is_a_connection_error(topology: Topology) -> None:
    primary = await master_port(topology)
    replica = next(port for port in REPLICA_PORTS if port != primary)
    async with opened(f"redis://127.0.0.1:{replica}/0", socket_timeout=1.0) as client:
        assert await client.ping()
        with pytest.raises(redis_client.PrimaryUnavailable, match="READONLY"):
            await client.set("llmesh:test:failover:readonly", "1")
        # The connection was dropped: the next one would look for the primary again.
        assert not any(c.is_connected for c in client.connection_pool._available_connections)
        # A service's Backend reports it as Redis unavailable (UNAVAILABLE, retried), not a bad request.
        backend = Backend(client, timeout_s=1.0)
        with pytest.raises(Unavailable, match="redis is unavailable"):
            await backend.call(client.set("llmesh:test:failover:readonly", "1"))
        assert not backend.healthy


async def test_a_write_no_replica_acknowledged_is_not_reported_done(topology: Topology) -> None:
    url = f"redis://127.0.0.1:{SPARE_PORT}/0?wait_replicas=1&wait_timeout_ms=50"
    async with opened(url, socket_timeout=1.0) as client:
        with pytest.raises(redis_client.NotReplicated, match="reached 0 of the 1 replicas"):
            await client.set("llmesh:test:failover:unreplicated", "1")
        assert await client.get("llmesh:test:failover:unreplicated") == b"1"  # reads do not wait
        async with client.pipeline(transaction=True) as pipe:
            pipe.incr("llmesh:test:failover:unreplicated")
            with pytest.raises(redis_client.NotReplicated):
                await pipe.execute()
        async with client.pipeline(transaction=False) as pipe:
            pipe.get("llmesh:test:failover:unreplicated")
            assert await pipe.execute() == [b"2"]


async def test_a_primary_cut_off_from_its_replicas_is_a_connection_error(topology: Topology) -> None:
    async with opened(f"redis://127.0.0.1:{SPARE_PORT}/0", socket_timeout=1.0) as client:
        await client.config_set("min-replicas-to-write", 1)
        try:
            with pytest.raises(redis_client.PrimaryUnavailable, match="NOREPLICAS"):
                await client.set("llmesh:test:failover:isolated", "1")
        finally:
            await client.config_set("min-replicas-to-write", 0)
        assert await client.set("llmesh:test:failover:isolated", "1")


# -- the failover under load ---------------------------------------------------------------------


@dataclass
class Workload:
    """Successes and failures of one kind of call; after the kill, when it first failed and when a
    call started after that failure succeeded (its recovery)."""

    name: str
    ok: int = 0
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    killed_at: float | None = None
    failed_at: float | None = None
    recovered_at: float | None = None

    def success(self, started_at: float) -> None:
        self.ok += 1
        if self.failed_at is not None and self.recovered_at is None and started_at >= self.failed_at:
            self.recovered_at = time.monotonic()

    def failure(self, kind: str) -> None:
        self.errors += 1
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1
        if self.killed_at is not None and self.failed_at is None:
            self.failed_at = time.monotonic()

    @property
    def recovery_s(self) -> float | None:
        """Kill to the first success of a call started after this workload's first failure."""
        if self.recovered_at is None or self.killed_at is None:
            return None
        return self.recovered_at - self.killed_at


@dataclass
class Load:
    versions: VersionStore
    sessions: SessionStore
    audit: AuditLog
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    violations: list[str] = field(default_factory=list)
    # Per namespace: every version a bump returned, and the highest one acknowledged so far.
    issued: dict[str, set[int]] = field(default_factory=dict)
    floors: dict[str, int] = field(default_factory=dict)
    # Per session: the turns whose append was acknowledged, in order.
    acked_turns: dict[str, list[str]] = field(default_factory=dict)
    audited: int = 0
    work: dict[str, Workload] = field(
        default_factory=lambda: {name: Workload(name) for name in ("versions", "sessions", "audit")}
    )

    async def version_worker(self, index: int) -> None:
        namespace = f"ns-{index % 2}"  # two workers per namespace: concurrent bumps
        work = self.work["versions"]
        self.issued.setdefault(namespace, set())
        while not self.stop.is_set():
            floor = self.floors.get(namespace, 0)
            started = time.monotonic()
            try:
                read = await self.versions.get(TENANT, namespace)
                bumped = await self.versions.bump(TENANT, namespace)
            except (RedisError, OSError) as exc:
                work.failure(type(exc).__name__)
                await asyncio.sleep(RETRY_BACKOFF_S)
                continue
            if read < floor:
                self.violations.append(f"{namespace}: read {read} below the acknowledged {floor}")
            if bumped <= floor:
                self.violations.append(f"{namespace}: bump gave {bumped}, not above the acknowledged {floor}")
            if bumped in self.issued[namespace]:
                self.violations.append(f"{namespace}: version {bumped} issued twice")
            self.issued[namespace].add(bumped)
            self.floors[namespace] = max(self.floors.get(namespace, 0), bumped)
            work.success(started)

    async def session_worker(self, index: int) -> None:
        session = f"failover-{index}"
        acked = self.acked_turns.setdefault(session, [])
        work = self.work["sessions"]
        version = 0
        count = 0
        while not self.stop.is_set():
            count += 1
            content = f"{index}:{count}"
            started = time.monotonic()
            try:
                appended = await self.sessions.append(TENANT, session, [Turn(role="user", content=content)])
                acked.append(content)
                if appended.version <= version:
                    self.violations.append(f"{session}: append gave version {appended.version} <= {version}")
                version = appended.version
                turns, _ = await self.sessions.read(TENANT, session, floor=version)
            except Unavailable as exc:
                if "behind the requested" in exc.message:
                    self.violations.append(f"{session}: {exc.message}")
                work.failure(type(exc).__name__)
                await asyncio.sleep(RETRY_BACKOFF_S)
                continue
            if not turns or turns[-1].content != acked[-1]:
                self.violations.append(f"{session}: the acknowledged turn {acked[-1]} is not the last read")
            work.success(started)

    async def audit_producer(self) -> None:
        """Decisions at a steady rate; the writer flushes them in batches (policy's own path)."""
        while not self.stop.is_set():
            self.audited += 1
            self.audit.append(
                AuditRecord(
                    request_id=f"r{self.audited}",
                    tenant=TENANT,
                    ruleset_version="1",
                    rule_ids=(),
                    action="allow",
                    kind="input",
                    text_sha256="0" * 64,
                )
            )
            await asyncio.sleep(0.005)

    async def audit_watch(self) -> None:
        """The writer's batches as the audit workload's calls: a batch written is a success, the
        writer finding Redis unreachable a failure (it keeps the records and retries)."""
        work = self.work["audit"]
        written = self.audit.written
        was_ok = True
        while not self.stop.is_set():
            now = time.monotonic()
            if was_ok and not self.audit.redis_ok:
                work.failure("writer retrying")
            was_ok = self.audit.redis_ok
            if self.audit.written > written:
                written = self.audit.written
                work.success(now)
            await asyncio.sleep(0.01)


async def run_failover(load: Load, topology: Topology) -> tuple[float, float, dict[str, int]]:
    """Load, kill -9 the primary, wait for the promotion and every workload's recovery, more load;
    returns when the primary was killed, how long the promotion took, and the successes before."""
    tasks = [
        *(asyncio.create_task(load.version_worker(i)) for i in range(4)),
        *(asyncio.create_task(load.session_worker(i)) for i in range(4)),
        asyncio.create_task(load.audit_producer()),
        asyncio.create_task(load.audit_watch()),
    ]
    try:

        async def warmed_up() -> bool:
            return all(w.ok >= WARMUP_OPS for w in load.work.values())

        await until(warmed_up, 20.0, "the load warming up", load.work)
        before = {name: w.ok for name, w in load.work.items()}
        killed_at = time.monotonic()
        for work in load.work.values():
            work.killed_at = killed_at
        await topology.kill(PRIMARY_PORT)

        async def promoted() -> bool:
            return await master_port(topology) != PRIMARY_PORT

        await until(promoted, RECOVERY_BOUND_S, "a sentinel promoting a replica")
        promoted_s = time.monotonic() - killed_at

        async def recovered() -> bool:
            return all(w.recovered_at is not None for w in load.work.values())

        await until(recovered, RECOVERY_BOUND_S, "every workload failing, then succeeding again", load.work)
        after = {name: w.ok for name, w in load.work.items()}

        async def loaded_after() -> bool:
            return all(load.work[name].ok >= after[name] + WARMUP_OPS for name in after)

        await until(loaded_after, 20.0, "the load going on after the failover", load.work)
        return killed_at, promoted_s, before
    finally:
        load.stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_killing_the_primary_under_load_loses_nothing_acknowledged(
    topology: Topology, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await master_port(topology) == PRIMARY_PORT
    client = redis_client.connect(SENTINEL_URL, socket_connect_timeout=0.5, socket_timeout=1.0)
    backend = Backend(
        cache_connect(SENTINEL_URL, connect_timeout_s=0.5, timeout_s=1.0, max_connections=32), timeout_s=1.0
    )
    assert client.durable.replicas == 1  # acknowledged = on a replica
    audit_key = f"llmesh:test:failover:audit:{{{time.time_ns()}}}"
    audit = AuditLog(client, hmac_key=HMAC_KEY, key=audit_key, retry_max_s=0.2)
    load = Load(
        versions=VersionStore(client),
        sessions=SessionStore(backend, SessionLimits(max_turns=100_000, max_bytes=16 * 1024 * 1024)),
        audit=audit,
    )
    try:
        audit.start()
        killed_at, promoted_s, before = await run_failover(load, topology)
        assert await audit.flush(10.0), f"{audit.buffered} audit records still unwritten"
        await audit.close()
        new_primary = await master_port(topology)
        assert new_primary in REPLICA_PORTS
        report = await verify(client, audit_key, [HMAC_KEY])
        assert report.ok, report.problems[:5]
        assert report.records == load.audited and report.chains == 1
        for session, acked in load.acked_turns.items():
            turns, _ = await load.sessions.read(TENANT, session)
            stored = [t.content for t in turns]
            missing = sorted(set(acked) - set(stored))
            assert not missing, f"{session}: acknowledged turns lost: {missing[:5]}"
            assert _is_subsequence(acked, stored), f"{session}: acknowledged turns out of order"
        for namespace, floor in load.floors.items():
            assert await load.versions.get(TENANT, namespace) >= floor
    finally:
        await audit.close(wait_s=0.0)  # a no-op once closed above
        await client.aclose()
        await backend.close()
    assert not load.violations, load.violations[:10]
    recovery = {name: w.recovery_s for name, w in load.work.items()}
    outage = {name: (w.failed_at or killed_at) - killed_at for name, w in load.work.items()}
    assert all(s is not None and s <= RECOVERY_BOUND_S for s in recovery.values()), recovery
    with capsys.disabled():
        print(
            f"\nredis failover: kill -9 of the primary :{PRIMARY_PORT}; sentinel promoted :{new_primary} "
            f"{promoted_s:.2f} s after; clients succeeded again after "
            + ", ".join(
                f"{name} {s:.2f} s (first failure {outage[name]:.2f} s)"
                for name, s in recovery.items()
                if s is not None
            )
            + "; "
            + ", ".join(
                f"{w.name} {w.ok - before[w.name]} ok / {w.errors} failed ({w.error_kinds})"
                for w in load.work.values()
            )
            + f"; {sum(len(v) for v in load.issued.values())} versions, "
            f"{sum(len(v) for v in load.acked_turns.values())} session turns, {report.records} audit "
            "records checked, 0 violations"
        )


def _is_subsequence(needle: list[str], haystack: list[str]) -> bool:
    it = iter(haystack)
    return all(item in it for item in needle)
