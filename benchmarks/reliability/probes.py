"""Samples of every service process over time: memory, descriptors, connections, tasks.

For each service the sample covers its main process (where the gRPC server and
the asyncio loop run) and its whole process tree (the inference engine runs in
a child). Connections are the main process's TCP sockets by state; asyncio
tasks come from the service's own ``llmesh_asyncio_tasks`` gauge on its metrics
port. :func:`growth` and :func:`leak` turn the series into the soak's verdicts.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import httpx
import psutil

from benchmarks.reliability.mesh import LocalMesh, ServiceProcess

TASKS_METRIC = "llmesh_asyncio_tasks"


@dataclass(frozen=True)
class Sample:
    t: float
    service: str
    pid: int
    rss_mb: float
    tree_rss_mb: float
    fds: int
    tree_fds: int
    threads: int
    tcp: int
    tcp_established: int
    tasks: int | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _process_sample(service: ServiceProcess, t: float) -> Sample | None:
    pid = service.pid
    if pid is None or not service.running() or service.paused:
        return None
    try:
        main = psutil.Process(pid)
        tree = [main, *main.children(recursive=True)]
        rss = main.memory_info().rss
        tree_rss = 0
        tree_fds = 0
        for proc in tree:
            with contextlib.suppress(psutil.Error):
                tree_rss += proc.memory_info().rss
                tree_fds += proc.num_fds()
        conns = main.net_connections(kind="tcp")
        return Sample(
            t=round(t, 3),
            service=service.name,
            pid=pid,
            rss_mb=round(rss / 2**20, 2),
            tree_rss_mb=round(tree_rss / 2**20, 2),
            fds=main.num_fds(),
            tree_fds=tree_fds,
            threads=main.num_threads(),
            tcp=len(conns),
            tcp_established=sum(1 for c in conns if c.status == psutil.CONN_ESTABLISHED),
            tasks=None,
        )
    except psutil.Error:
        return None


def parse_gauge(text: str, name: str) -> int | None:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            with contextlib.suppress(ValueError, IndexError):
                return int(float(line.rsplit(" ", 1)[1]))
    return None


class Sampler:
    """Samples every running service of ``mesh`` every ``interval_s`` in the background."""

    def __init__(self, mesh: LocalMesh, interval_s: float = 5.0, clock: Callable[[], float] = time.monotonic):
        self.mesh = mesh
        self.interval_s = interval_s
        self.samples: list[Sample] = []
        self._clock = clock
        self._t0 = clock()
        self._task: asyncio.Task[None] | None = None
        self._http = httpx.AsyncClient(timeout=2.0)

    async def sample_once(self, label_t: float | None = None) -> list[Sample]:
        t = self._clock() - self._t0 if label_t is None else label_t
        services = [s for s in self.mesh.services.values() if s.running() and not s.paused]
        raw = await asyncio.to_thread(lambda: [_process_sample(s, t) for s in services])
        out: list[Sample] = []
        for service, sample in zip(services, raw, strict=True):
            if sample is None:
                continue
            tasks = None
            with contextlib.suppress(httpx.HTTPError):
                reply = await self._http.get(f"http://127.0.0.1:{service.metrics_port}/metrics")
                tasks = parse_gauge(reply.text, TASKS_METRIC)
            out.append(Sample(**{**asdict(sample), "tasks": tasks}))
        self.samples.extend(out)
        return out

    async def _loop(self) -> None:
        while True:
            await self.sample_once()
            await asyncio.sleep(self.interval_s)  # the sampling period itself

    def start(self) -> None:
        self._t0 = self._clock()
        self._task = asyncio.create_task(self._loop(), name="reliability sampler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._http.aclose()

    def series(self, service: str) -> list[Sample]:
        return [s for s in self.samples if s.service == service]


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def growth(samples: Sequence[Sample], warmup_s: float, attr: str = "tree_rss_mb", window: int = 3) -> float:
    """Relative growth of ``attr`` from just after warm-up to the end (medians of ``window`` samples).

    Samples of one process only (the last pid): a restarted service starts over.
    """
    if not samples:
        return float("nan")
    pid = samples[-1].pid
    after = [s for s in samples if s.pid == pid and s.t >= warmup_s]
    if len(after) < 2:
        return float("nan")
    first = _median([float(getattr(s, attr)) for s in after[:window]])
    last = _median([float(getattr(s, attr)) for s in after[-window:]])
    return (last - first) / first if first else float("nan")


def leak(before: Sample | None, after: Sample | None, attr: str) -> int | None:
    """How many more ``attr`` (tasks, tcp, fds) a service holds idle after the load than before."""
    if before is None or after is None or before.pid != after.pid:
        return None
    a, b = getattr(after, attr), getattr(before, attr)
    if a is None or b is None:
        return None
    return int(a) - int(b)
