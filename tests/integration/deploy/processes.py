"""Real llmesh service processes on free ports, each with its /metrics side port.

The same thing ``llmesh up`` and a container do: ``python -m <package>`` configured by
``LLMESH_<SERVICE>_*``; ready when the process prints its ``LLMESH_READY`` line.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx

from services.runtime.cli.catalog import ServiceSpec
from tests.fixtures.ports import free_port
from tests.fixtures.processes import ROOT, ServiceProcess

__all__ = ["ROOT", "Service", "start"]


@dataclass
class Service:
    """A started service of the catalog and the port its /metrics page answers on."""

    spec: ServiceSpec
    process: ServiceProcess
    metrics_port: int

    @property
    def address(self) -> str:
        return self.process.address

    async def scrape(self) -> str:
        async with httpx.AsyncClient(timeout=10) as client:
            reply = await client.get(f"http://127.0.0.1:{self.metrics_port}/metrics")
        reply.raise_for_status()
        return reply.text

    async def stop(self) -> None:
        """SIGTERM, killed if it has not drained within the launcher's stop timeout."""
        await asyncio.to_thread(self.process.stop)
        self.process.close()


async def start(spec: ServiceSpec, env: dict[str, str], ready_within_s: float) -> Service:
    """Starts ``spec``'s package with ``env`` added; returns once it is ready (or raises with its log)."""
    metrics_port = free_port()
    prefix = spec.env_prefix
    full_env = {
        f"{prefix}HOST": "127.0.0.1",
        f"{prefix}PORT": "0",
        f"{prefix}METRICS_PORT": str(metrics_port),
        f"{prefix}LOG_JSON": "false",
        **env,
    }
    # The launcher waits on a thread: the other services this test starts share the event loop.
    process = await asyncio.to_thread(
        ServiceProcess, spec.package, full_env, ready_timeout_s=ready_within_s, new_session=True
    )
    return Service(spec, process, metrics_port)
