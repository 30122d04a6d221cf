"""``llmesh serve gateway``: the HTTP API (uvicorn) and the gRPC ChatService in one process."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import uvicorn
from llmesh.v1 import chat_pb2_grpc

from gateway.api.app import create_app
from gateway.api.middleware import ACTIVITY
from gateway.config import GatewaySettings
from gateway.mesh import Mesh
from gateway.servicer import ChatServicer
from services.runtime import telemetry
from services.runtime.server import RunningServer, ServiceBinding, serve

log = logging.getLogger(__name__)


async def _run(settings: GatewaySettings) -> None:
    telemetry.setup_tracing(settings.service_name)
    mesh = await Mesh.open(settings)
    app = create_app(settings, mesh)
    config = uvicorn.Config(
        app,
        host=settings.http_host,
        port=settings.http_port,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=int(settings.grace_seconds),
    )
    http = uvicorn.Server(config)
    # uvicorn must not install its own signal handlers: runtime.serve owns SIGTERM.
    http.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
    http_task: asyncio.Task[None] | None = None

    async def on_start(running: RunningServer) -> None:
        nonlocal http_task
        http_task = asyncio.create_task(http.serve())
        while not http.started:
            if http_task.done():
                await http_task  # raises the bind error
                raise OSError(f"HTTP server on {settings.http_host}:{settings.http_port} did not start")
            await asyncio.sleep(0.01)  # uvicorn exposes no start event
        log.info("gateway HTTP API on http://%s:%d", settings.http_host, settings.http_port)

    async def on_drain() -> None:
        mesh.draining = True

    async def on_stop() -> None:
        http.should_exit = True
        if http_task is not None:
            await http_task
        await mesh.close()

    binding = ServiceBinding(
        name="llmesh.v1.ChatService",
        add=chat_pb2_grpc.add_ChatServiceServicer_to_server,
        servicer=ChatServicer(mesh),
    )
    # At SIGTERM /readyz turns 503 and the HTTP API keeps serving until requests stop
    # arriving (the drain's quiet period covers them), then uvicorn stops accepting and
    # lets the streams in flight finish within the grace period.
    await serve(
        settings,
        [binding],
        on_start=on_start,
        on_drain=on_drain,
        on_stop=on_stop,
        activity=lambda: ACTIVITY.last,
    )


def main() -> None:
    settings = GatewaySettings()
    telemetry.setup_logging(settings.log_level, settings.log_json)
    asyncio.run(_run(settings))


if __name__ == "__main__":
    main()
