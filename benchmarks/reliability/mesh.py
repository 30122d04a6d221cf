"""The whole mesh in child processes, laid out as ``llmesh up`` lays it out, under our control.

:class:`LocalMesh` uses ``llmesh up``'s own plan (services, replica ports, the
environment each child gets) on a port offset where every port is free, with a
Redis of its own on free loopback ports (never the machine's Redis): one
redis-server, or (``redis="sentinel"``) a primary, two replicas and three
sentinels that every service reaches through a ``redis+sentinel://`` URL
(:mod:`benchmarks.reliability.redis_ha`). Every child runs in its own process
group (vLLM's engine runs in a grandchild), so a fault reaches the whole service
and cleanup leaves nothing behind: ``stop()`` runs on every exit path, and an
``atexit`` hook kills what is left if the harness itself dies
(:mod:`benchmarks.reliability.processes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal

import psutil

from benchmarks.reliability.processes import HOST, LIVE_GROUPS, free_port, guard_signals, port_free
from benchmarks.reliability.redis_ha import RedisProcess, ReplicatedRedis
from services.runtime.cli import catalog
from services.runtime.cli.up import child_env, plan, wait_healthy

__all__ = ["HOST", "LocalMesh", "RedisMode", "RedisProcess", "ServiceProcess", "free_port", "port_free"]

log = logging.getLogger(__name__)

HTTP_BASE_PORT = 8000
METRICS_PORT_SHIFT = 1000  # llmesh up: metrics port = service port + 1000
STOP_GRACE_S = 30.0
REDIS_MODES = ("single", "sentinel")
RedisMode = Literal["single", "sentinel"]


def gateway_http_port(spec: catalog.ServiceSpec, port: int) -> int:
    """As ``llmesh up`` places it: the HTTP port moves with the gateway instance's gRPC port."""
    return HTTP_BASE_PORT + port - spec.port


def _ports_of(steps: Iterable[tuple[str, catalog.ServiceSpec, int]], offset: int) -> list[int]:
    ports = []
    for _name, spec, port in steps:
        ports += [port, port + METRICS_PORT_SHIFT]
        if spec.name == "gateway":
            ports.append(gateway_http_port(spec, port))
    return ports


def choose_offset(
    replicas: int, only: list[str], tries: int = 200, instances: dict[str, int] | None = None
) -> int:
    """A port offset (as ``llmesh up --port-offset``) where every port the mesh needs is free."""
    rng = random.Random()
    for _ in range(tries):
        offset = rng.randrange(1000, 14000, 10)
        steps = plan(replicas, only, HOST, offset, instances)
        if all(port_free(p) for p in _ports_of(steps, offset)):
            return offset
    raise OSError("no port offset with every llmesh port free")


@dataclass
class ServiceProcess:
    """One service instance: how to start it, and the process it runs as now."""

    name: str
    spec: catalog.ServiceSpec
    port: int
    env: dict[str, str]
    log_path: Path
    proc: asyncio.subprocess.Process | None = None
    starts: int = 0
    paused: bool = False

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def metrics_port(self) -> int:
        return int(self.env.get(f"{self.spec.env_prefix}METRICS_PORT", self.port + METRICS_PORT_SHIFT))

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def start(self) -> float:
        """Starts the process and waits for SERVING on its health check; returns the seconds taken."""
        started = time.monotonic()
        with self.log_path.open("ab") as log_file:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                self.spec.package,
                env=self.env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        LIVE_GROUPS.add(self.proc.pid)
        self.starts += 1
        self.paused = False
        state = await wait_healthy(self.address, self.proc, self.spec.start_timeout_s)
        if state != "serving":
            tail = self.log_path.read_text(errors="replace")[-3000:]
            await self.kill()
            raise RuntimeError(f"{self.name} did not start ({state}); log {self.log_path}:\n{tail}")
        return time.monotonic() - started

    def signal_group(self, sig: signal.Signals) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    async def kill(self) -> None:
        """SIGKILL to the whole process group (the service and, for inference, its engine)."""
        if self.proc is None:
            return
        if self.paused:
            # A stopped process dies of SIGKILL too, but let it go cleanly through SIGCONT first.
            self.signal_group(signal.SIGCONT)
            self.paused = False
        self.signal_group(signal.SIGKILL)
        await self.proc.wait()
        LIVE_GROUPS.discard(self.proc.pid)

    async def pause(self) -> None:
        """SIGSTOP to the group; returns once the service's process is stopped."""
        self.signal_group(signal.SIGSTOP)
        self.paused = True
        await self._until_state(stopped=True)

    async def resume(self) -> None:
        """SIGCONT to the group; returns once the service's process runs again."""
        self.signal_group(signal.SIGCONT)
        self.paused = False
        await self._until_state(stopped=False)

    async def _until_state(self, *, stopped: bool, limit_s: float = 5.0) -> None:
        # Signal delivery is asynchronous and the kernel offers no event for it: poll /proc.
        if self.proc is None:
            return
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            try:
                state = psutil.Process(self.proc.pid).status()
            except psutil.Error:
                return
            if (state == psutil.STATUS_STOPPED) == stopped:
                return
            await asyncio.sleep(0.01)

    async def drain(self, limit_s: float = STOP_GRACE_S) -> tuple[int | None, float]:
        """SIGTERM to the service (as an orchestrator sends it); (exit code, seconds to exit).

        Exit code None: it did not exit within ``limit_s`` and was killed.
        """
        if self.proc is None or self.proc.returncode is not None:
            return (None if self.proc is None else self.proc.returncode), 0.0
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = await asyncio.wait_for(self.proc.wait(), limit_s)
        except TimeoutError:
            code = None
        # Whatever the service left in its group (an engine process) goes with it.
        await self.kill()
        return code, time.monotonic() - started


class LocalMesh:
    """``llmesh up --inference-replicas N --port-offset K`` with per-service control.

    ``instances`` runs several of a service (``{"policy": 2, "gateway": 2}``), as
    ``llmesh up --policy-replicas`` does: upstream addresses list every instance; each
    gateway has its own HTTP port (``base_urls``).

    ``env`` adds to every child's environment; ``service_env`` to one service's
    (by service name, e.g. ``{"gateway": {"LLMESH_GATEWAY_REQUEST_TIMEOUT_S": "20"}}``).

    ``redis``: ``"single"``, one redis-server (:attr:`redis`); ``"sentinel"``, a primary, two
    replicas and three sentinels (:attr:`replicated`), every service given its
    ``redis+sentinel://`` URL. :attr:`redis_url` is what the services get either way.
    """

    def __init__(
        self,
        replicas: int = 1,
        *,
        only: list[str] | None = None,
        env: Mapping[str, str] | None = None,
        service_env: Mapping[str, Mapping[str, str]] | None = None,
        workdir: Path | None = None,
        instances: Mapping[str, int] | None = None,
        redis: RedisMode = "single",
    ) -> None:
        if redis not in REDIS_MODES:
            raise ValueError(f"redis must be one of {REDIS_MODES}, not {redis!r}")
        self.replicas = replicas
        self.instances = dict(instances or {})
        self.only = list(only or [])
        self.extra_env = dict(env or {})
        self.service_env = {k: dict(v) for k, v in (service_env or {}).items()}
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="llmesh-reliability-")
        self.workdir = workdir or Path(self._tmp.name)  # type: ignore[union-attr]
        self.redis_mode: RedisMode = redis
        self._redis = RedisProcess(self.workdir / "redis") if redis == "single" else None
        self.replicated = ReplicatedRedis(self.workdir / "redis") if redis == "sentinel" else None
        self.services: dict[str, ServiceProcess] = {}
        self.offset = 0
        self.start_s: dict[str, float] = {}

    @property
    def http_port(self) -> int:
        return HTTP_BASE_PORT + self.offset

    @property
    def base_url(self) -> str:
        """The first gateway's HTTP API."""
        return f"http://{HOST}:{self.http_port}"

    @property
    def base_urls(self) -> list[str]:
        """Every gateway instance's HTTP API."""
        return [
            f"http://{HOST}:{gateway_http_port(s.spec, s.port)}"
            for s in self.services.values()
            if s.spec.name == "gateway"
        ]

    @property
    def redis(self) -> RedisProcess:
        """The single Redis (``redis="single"``)."""
        if self._redis is None:
            raise RuntimeError("this mesh runs a replicated Redis: see LocalMesh.replicated")
        return self._redis

    @property
    def redis_url(self) -> str:
        """The Redis URL every service is given."""
        return self.replicated.url() if self.replicated is not None else self.redis.url

    def __getitem__(self, name: str) -> ServiceProcess:
        return self.services[name]

    def names(self) -> list[str]:
        return list(self.services)

    async def start(self) -> None:
        guard_signals()
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        if self.replicated is not None:
            self.start_s["redis"] = await self.replicated.start()
        else:
            self.start_s["redis"] = await self.redis.start()
        self.offset = choose_offset(self.replicas, self.only, instances=self.instances)
        steps = plan(self.replicas, self.only, HOST, self.offset, self.instances)
        addresses: dict[str, list[str]] = {}
        for _name, spec, port in steps:
            addresses.setdefault(spec.name, []).append(f"{HOST}:{port}")
        saved = dict(os.environ)
        try:
            # child_env starts from os.environ: ours must not leak a REDIS_URL or ports in.
            os.environ.update(self.extra_env)
            os.environ["REDIS_URL"] = self.redis_url
            for name, spec, port in steps:
                env = child_env(spec, port, HOST, addresses)
                env["REDIS_URL"] = self.redis_url
                env[f"{spec.env_prefix}REDIS_URL"] = self.redis_url
                env[f"{spec.env_prefix}METRICS_PORT"] = str(port + METRICS_PORT_SHIFT)
                if spec.name == "gateway":
                    env["LLMESH_GATEWAY_HTTP_HOST"] = HOST
                    env["LLMESH_GATEWAY_HTTP_PORT"] = str(gateway_http_port(spec, port))
                env.update(self.service_env.get(spec.name, {}))
                self.services[name] = ServiceProcess(name, spec, port, env, logs / f"{name}.log")
        finally:
            os.environ.clear()
            os.environ.update(saved)
        for name, service in self.services.items():
            log.info("starting %s on %s", name, service.address)
            self.start_s[name] = await service.start()

    async def stop(self) -> None:
        """SIGTERM everything (reverse start order), kill what does not exit; then Redis."""
        services = [s for s in reversed(self.services.values()) if s.running()]
        for service in services:
            if service.paused:
                await service.resume()
        await asyncio.gather(*(s.drain(STOP_GRACE_S) for s in services), return_exceptions=True)
        for service in self.services.values():
            with contextlib.suppress(Exception):
                await service.kill()
        if self.replicated is not None:
            await self.replicated.stop()
        elif self._redis is not None:
            await self._redis.kill(signal.SIGTERM)
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                self._tmp.cleanup()

    async def __aenter__(self) -> LocalMesh:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
