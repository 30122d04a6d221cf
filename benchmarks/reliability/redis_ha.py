"""Redis of the harness's own, in real processes on loopback ports: one redis-server, or a
replicated set (a primary, replicas and sentinels) whose primary can be killed.

:class:`RedisProcess` is one ``redis-server`` with AOF on (as deploy/ runs it), in a process group
of its own, ready when it says so. :class:`ReplicatedRedis` is the set the Sentinel deployment
runs (deploy/redis/sentinel/): a primary and replicas, every one with ``min-replicas-to-write 1``
(whichever is primary refuses writes while no replica follows it), and sentinels (quorum 2 of 3)
watching them; services reach it through :meth:`ReplicatedRedis.url`, a ``redis+sentinel://`` URL
(services/runtime/redis_client.py). Two replicas, not one: after a failover the new primary still
has a replica, so it takes writes before the killed node returns.

``llmesh bench faults --redis sentinel`` kills the primary under load with it
(:mod:`benchmarks.reliability.scenarios`), and tests/reliability/test_redis_failover.py runs the
services' Redis code paths through a failover on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError

from benchmarks.reliability.processes import HOST, LIVE_GROUPS, free_port
from services.runtime import redis_client

MASTER = "llmesh"
# Every Redis of a replicated set: a primary that no replica follows refuses writes.
DURABLE_ARGS = ("--min-replicas-to-write", "1", "--min-replicas-max-lag", "10")
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 5000
QUORUM = 2
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
POLL_S = 0.02
REDIS_READY = b"Ready to accept connections"
SENTINEL_READY = b"+monitor master"


async def until(
    check: Callable[[], Awaitable[bool]], limit_s: float, what: str, state: object = None
) -> None:
    """Polls ``check`` (a Redis error counts as "not yet") until it holds; RuntimeError after
    ``limit_s`` with the last error (and ``state`` as it is then, when given)."""
    deadline = time.monotonic() + limit_s
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            if await check():
                return
        # A node still loading answers with an error; INFO of one still syncing lacks fields.
        except (RedisError, OSError, KeyError, ValueError) as exc:
            last = exc
        await asyncio.sleep(POLL_S)
    shown = "" if state is None else f"; {state!r}"
    raise RuntimeError(f"{what} did not happen within {limit_s:g} s (last error: {last!r}){shown}")


class _Child:
    """A redis-server (or sentinel) in a process group of its own; its output goes to ``log_path``;
    ready once a line of it contains ``ready``."""

    def __init__(self, log_path: Path, ready: bytes) -> None:
        self.log_path = log_path
        self.ready = ready
        self.proc: asyncio.subprocess.Process | None = None
        self._pump: asyncio.Task[None] | None = None

    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def _spawn(self, argv: Sequence[str]) -> float:
        if shutil.which(argv[0]) is None:
            raise RuntimeError(f"{argv[0]} is not installed (apt-get install redis-server)")
        started = time.monotonic()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        LIVE_GROUPS.add(self.proc.pid)
        assert self.proc.stdout is not None
        deadline = started + START_TIMEOUT_S
        try:
            with self.log_path.open("ab") as log_file:
                while True:
                    line = await asyncio.wait_for(self.proc.stdout.readline(), deadline - time.monotonic())
                    if not line:
                        code = await self.proc.wait()
                        raise RuntimeError(f"{argv[0]} exited (rc {code}); log {self.log_path}")
                    log_file.write(line)
                    if self.ready in line:
                        break
        except BaseException:
            await self.kill()
            raise
        # Keep draining its output so it never blocks on a full pipe.
        self._pump = asyncio.create_task(self._drain_output(), name=f"output of {self.log_path.name}")
        return time.monotonic() - started

    async def _drain_output(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with self.log_path.open("ab") as log_file:
            while line := await self.proc.stdout.readline():
                log_file.write(line)

    async def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        """``sig`` to the group and wait for the exit (SIGKILL after :data:`STOP_TIMEOUT_S`)."""
        if self.proc is None:
            return
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                await asyncio.wait_for(self.proc.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                await self.proc.wait()
        LIVE_GROUPS.discard(self.proc.pid)
        if self._pump is not None:
            # Its output ends with the process: the pump finishes on its own.
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(self._pump, 5.0)
            self._pump = None


class RedisProcess(_Child):
    """One redis-server on ``port`` (a free one by default), its data in ``workdir``; AOF on
    unless ``appendonly`` is False; ``args`` go on every start's command line."""

    def __init__(
        self,
        workdir: Path,
        port: int | None = None,
        *,
        args: Sequence[str] = (),
        appendonly: bool = True,
    ) -> None:
        super().__init__(workdir / "redis.log", REDIS_READY)
        self.workdir = workdir
        self.port = port or free_port()
        self.args = list(args)
        self.appendonly = appendonly

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    async def start(self, extra: Sequence[str] = ()) -> float:
        """Starts it (on the same port and data as before, after a kill); ``extra`` options for this
        start only (``--replicaof``). Returns the seconds until it accepted connections."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        return await self._spawn(
            ["redis-server", "--port", str(self.port), "--bind", HOST, "--dir", str(self.workdir),
             "--save", "", "--appendonly", "yes" if self.appendonly else "no",
             "--appendfsync", "everysec", *self.args, *extra]
        )  # fmt: skip


class SentinelProcess(_Child):
    """One Redis Sentinel on ``port`` watching ``master`` (first at the primary's port)."""

    def __init__(
        self,
        workdir: Path,
        port: int,
        primary_port: int,
        *,
        master: str = MASTER,
        quorum: int = QUORUM,
        down_after_ms: int = DOWN_AFTER_MS,
        failover_timeout_ms: int = FAILOVER_TIMEOUT_MS,
    ) -> None:
        super().__init__(workdir / "sentinel.log", SENTINEL_READY)
        self.workdir = workdir
        self.port = port
        self.primary_port = primary_port
        self.master = master
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms

    def config(self) -> Path:
        # A file of its own: a sentinel rewrites its configuration as it learns the set.
        path = self.workdir / "sentinel.conf"
        path.write_text(
            f"port {self.port}\nbind {HOST}\ndir {self.workdir}\n"
            f"sentinel monitor {self.master} {HOST} {self.primary_port} {self.quorum}\n"
            f"sentinel down-after-milliseconds {self.master} {self.down_after_ms}\n"
            f"sentinel failover-timeout {self.master} {self.failover_timeout_ms}\n"
            f"sentinel parallel-syncs {self.master} 2\n",
            encoding="utf-8",
        )
        return path

    async def start(self) -> float:
        self.workdir.mkdir(parents=True, exist_ok=True)
        return await self._spawn(["redis-server", str(self.config()), "--sentinel"])


def _plain(port: int) -> redis_client.Client:
    """A client of one redis-server or sentinel (str answers, short timeouts)."""
    return redis_client.connect(
        f"redis://{HOST}:{port}/0", socket_connect_timeout=0.5, socket_timeout=1.0, decode_responses=True
    )


class ReplicatedRedis:
    """A primary, ``replicas`` replicas and ``sentinels`` sentinels (quorum 2) on loopback ports
    (free ones unless ``ports`` / ``sentinel_ports`` name them; ``ports[0]`` starts as primary)."""

    def __init__(
        self,
        workdir: Path,
        *,
        replicas: int = 2,
        sentinels: int = 3,
        master: str = MASTER,
        down_after_ms: int = DOWN_AFTER_MS,
        failover_timeout_ms: int = FAILOVER_TIMEOUT_MS,
        appendonly: bool = True,
        ports: Sequence[int] | None = None,
        sentinel_ports: Sequence[int] | None = None,
    ) -> None:
        self.workdir = workdir
        self.master = master
        ports = list(ports) if ports else [free_port() for _ in range(replicas + 1)]
        sentinel_ports = list(sentinel_ports) if sentinel_ports else [free_port() for _ in range(sentinels)]
        if len(ports) < 2 or len(sentinel_ports) < QUORUM:
            raise ValueError(f"a replicated Redis needs a replica and {QUORUM} sentinels")
        self.first_primary = ports[0]
        self.servers = {
            port: RedisProcess(workdir / f"redis-{port}", port, args=DURABLE_ARGS, appendonly=appendonly)
            for port in ports
        }
        self.sentinels = [
            SentinelProcess(
                workdir / f"sentinel-{port}",
                port,
                self.first_primary,
                master=master,
                quorum=min(QUORUM, len(sentinel_ports)),
                down_after_ms=down_after_ms,
                failover_timeout_ms=failover_timeout_ms,
            )
            for port in sentinel_ports
        ]
        self._sentinel_clients: dict[int, redis_client.Client] = {}

    @property
    def sentinel_ports(self) -> list[int]:
        return [s.port for s in self.sentinels]

    def url(self, db: int = 0) -> str:
        """What services are given: the primary of ``master`` through every sentinel."""
        hosts = ",".join(f"{HOST}:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{self.master}/{db}"

    async def start(self) -> float:
        """Starts the primary, the replicas and the sentinels; returns once the replicas are in sync
        and every sentinel sees them and the other sentinels (the seconds taken)."""
        started = time.monotonic()
        await self.servers[self.first_primary].start()
        follow = ("--replicaof", HOST, str(self.first_primary))
        await asyncio.gather(
            *(s.start(follow) for port, s in self.servers.items() if port != self.first_primary)
        )
        await asyncio.gather(*(s.start() for s in self.sentinels))
        await self.wait_formed()
        return time.monotonic() - started

    async def stop(self) -> None:
        """SIGTERM to the sentinels, then to every Redis (a kill after :data:`STOP_TIMEOUT_S`)."""
        clients, self._sentinel_clients = list(self._sentinel_clients.values()), {}
        for client in clients:
            with contextlib.suppress(Exception):
                await client.aclose()
        await asyncio.gather(*(s.kill(signal.SIGTERM) for s in self.sentinels), return_exceptions=True)
        await asyncio.gather(*(s.kill(signal.SIGTERM) for s in self.servers.values()), return_exceptions=True)

    # -- what the sentinels say -------------------------------------------------------------------

    def _sentinel(self, port: int) -> Any:
        client = self._sentinel_clients.get(port)
        if client is None:
            client = self._sentinel_clients[port] = _plain(port)
        return client

    async def primaries(self) -> dict[int, int | None]:
        """The primary's port as each sentinel names it now (None: the sentinel did not answer)."""

        async def ask(port: int) -> int | None:
            try:
                reply: Any = await self._sentinel(port).execute_command(
                    "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master
                )
            except (RedisError, OSError):
                return None
            return int(reply[1]) if reply else None

        ports = self.sentinel_ports
        return dict(zip(ports, await asyncio.gather(*(ask(p) for p in ports)), strict=True))

    async def primary_port(self) -> int | None:
        """The primary the sentinels name (the first that answers), None if none answers."""
        return next((port for port in (await self.primaries()).values() if port is not None), None)

    async def wait_promoted(self, old: int, limit_s: float) -> int | None:
        """Waits until a sentinel names a primary other than ``old``; that port, or None after
        ``limit_s``. Polled every :data:`POLL_S`: the time it returns at is the failover time."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            moved = [port for port in (await self.primaries()).values() if port not in (None, old)]
            if moved:
                return moved[0]
            await asyncio.sleep(POLL_S)
        return None

    # -- faults --------------------------------------------------------------------------------------

    async def kill(self, port: int) -> None:
        """kill -9 of one Redis: no shutdown, no last write of its append-only file."""
        await self.servers[port].kill(signal.SIGKILL)

    async def restart(self, port: int) -> float:
        """Starts a killed Redis on its port and data again, as a replica of the primary the
        sentinels name (as deploy/redis/sentinel/node.sh does; the sentinels would demote a
        returning old primary too, but it must not take a write before they do). Still named
        primary itself (no failover happened), it starts as primary. Returns the seconds until it
        accepted connections."""
        primary = await self.primary_port()
        follow = () if primary in (None, port) else ("--replicaof", HOST, str(primary))
        return await self.servers[port].start(follow)

    # -- readiness -----------------------------------------------------------------------------------

    async def wait_replicated(self, limit_s: float = START_TIMEOUT_S) -> int:
        """Waits until the primary the sentinels name has every other running Redis as an online
        replica; returns the primary's port."""
        found: list[int] = []

        async def in_sync() -> bool:
            primary = await self.primary_port()
            if primary is None or not self.servers[primary].running():
                return False
            client = _plain(primary)
            try:
                info: Any = await client.info("replication")
            finally:
                await client.aclose()
            if info.get("role") != "master":
                return False
            want = {p for p, s in self.servers.items() if p != primary and s.running()}
            online = {
                int(info[f"slave{i}"]["port"])
                for i in range(int(info["connected_slaves"]))
                if info[f"slave{i}"]["state"] == "online"
            }
            found[:] = [primary]
            return want <= online

        await until(in_sync, limit_s, "every running Redis replicating the primary")
        return found[0]

    async def wait_formed(self, limit_s: float = START_TIMEOUT_S) -> None:
        """Replicas in sync, and every sentinel seeing every replica and every other sentinel."""
        await self.wait_replicated(limit_s)
        replicas = len(self.servers) - 1
        others = len(self.sentinels) - 1

        async def sentinels_agree() -> bool:
            for port in self.sentinel_ports:
                state: Any = await self._sentinel(port).sentinel_master(self.master)
                if int(state["num-slaves"]) < replicas or int(state["num-other-sentinels"]) < others:
                    return False
            return True

        await until(sentinels_agree, limit_s, "every sentinel seeing the replicas and each other")
