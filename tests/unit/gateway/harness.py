"""A gateway served by uvicorn on a free port, in the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import uvicorn

from gateway.api.app import create_app
from gateway.config import GatewaySettings
from gateway.mesh import Mesh
from gateway.ratelimit import Limiter


@dataclass
class RunningGateway:
    mesh: Mesh
    url: str

    @property
    def base_url(self) -> str:
        return self.url + "/v1"


@contextlib.asynccontextmanager
async def serve_gateway(
    settings: GatewaySettings, limiter: Limiter | None = None
) -> AsyncIterator[RunningGateway]:
    mesh = await Mesh.open(settings, limiter=limiter)
    app = create_app(settings, mesh)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                await task
                raise RuntimeError("uvicorn did not start")
            await asyncio.sleep(0.005)  # uvicorn has no start event
        port = server.servers[0].sockets[0].getsockname()[1]
        yield RunningGateway(mesh, f"http://127.0.0.1:{port}")
    finally:
        server.should_exit = True
        await task
        await mesh.close()
