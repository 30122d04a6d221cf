"""Real llmesh service processes on free ports, each with its /metrics side port.

The same thing ``llmesh up`` and a container do: ``python -m <package>`` configured by
``LLMESH_<SERVICE>_*``; ready when the process prints its ``LLMESH_READY`` line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from services.runtime.cli.catalog import ServiceSpec

ROOT = Path(__file__).resolve().parents[3]
_READY = re.compile(rb"LLMESH_READY service=\S+ port=(\d+)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Service:
    spec: ServiceSpec
    proc: asyncio.subprocess.Process
    metrics_port: int
    port: int = 0
    output: list[bytes] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def scrape(self) -> str:
        async with httpx.AsyncClient(timeout=10) as client:
            reply = await client.get(f"http://127.0.0.1:{self.metrics_port}/metrics")
        reply.raise_for_status()
        return reply.text

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


async def start(spec: ServiceSpec, env: dict[str, str], ready_within_s: float) -> Service:
    """Starts ``spec``'s package with ``env`` added; returns once it is ready (or raises with its log)."""
    metrics_port = free_port()
    prefix = spec.env_prefix
    full_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        f"{prefix}HOST": "127.0.0.1",
        f"{prefix}PORT": "0",
        f"{prefix}METRICS_PORT": str(metrics_port),
        f"{prefix}LOG_JSON": "false",
        **env,
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        spec.package,
        cwd=ROOT,
        env=full_env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    service = Service(spec, proc, metrics_port)
    try:
        await asyncio.wait_for(_wait_ready(service), ready_within_s)
    except (TimeoutError, RuntimeError) as exc:
        await service.stop()
        log = b"".join(service.output[-40:]).decode(errors="replace")
        raise RuntimeError(f"{spec.name} did not become ready ({exc!r}); its output:\n{log}") from exc
    # Keep draining its output so a chatty service never blocks on a full pipe.
    asyncio.get_running_loop().create_task(_drain(service))
    return service


async def _wait_ready(service: Service) -> None:
    assert service.proc.stdout is not None
    while True:
        line = await service.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"exited with {await service.proc.wait()}")
        service.output.append(line)
        match = _READY.search(line)
        if match:
            service.port = int(match.group(1))
            return


async def _drain(service: Service) -> None:
    assert service.proc.stdout is not None
    with contextlib.suppress(Exception):
        while await service.proc.stdout.readline():
            pass
