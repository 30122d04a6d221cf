"""The one entry point of a service process: every ``<service>/__main__.py`` calls :func:`main`.

settings -> logging (configured here, and only here) -> tracing -> ``create(settings)`` ->
gRPC server (health, reflection, interceptors) -> metrics port -> QUIC endpoint ->
``start`` -> the start-up heap frozen (``gc_freeze``) -> the ready line -> SIGTERM/SIGINT ->
``drain`` -> the server drains (:meth:`services.runtime.server.RunningServer.stop`) ->
``close`` -> exit 0.

``create`` runs before the port opens (models, engines and connections take seconds), so a
client that sees SERVING can be served at once. A service whose engine spawns processes
(inference: vLLM on CPU) must call :func:`main` only under ``if __name__ == "__main__"``:
the spawned children re-import the main module, and must not build another engine.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from typing import TypeVar

from services.runtime import build_info, telemetry
from services.runtime.errors import Unavailable
from services.runtime.server import build_server
from services.runtime.service import Service
from services.runtime.settings import ServiceSettings, is_loopback
from services.runtime.tls import tls_settings

log = logging.getLogger(__name__)

S = TypeVar("S", bound=ServiceSettings)


def main(settings: Callable[[], S], create: Callable[[S], Awaitable[Service]]) -> None:
    """Runs one service until SIGTERM/SIGINT; ``settings`` is its settings class (read from env).

    A service that cannot start for want of something outside it (:class:`Unavailable`:
    no model, no device) exits 1 with one log line instead of a traceback.
    """
    loaded = settings()
    telemetry.setup_logging(loaded.log_level, loaded.log_json)
    try:
        with asyncio.Runner(loop_factory=loop_factory(loaded.event_loop)) as runner:
            runner.run(run(loaded, create))
    except Unavailable as exc:
        log.error("%s cannot start: %s", loaded.service_name, exc.message)
        raise SystemExit(1) from None


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """The event loop ``LLMESH_<SERVICE>_EVENT_LOOP`` names (ServiceSettings.event_loop)."""
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


async def run(settings: S, create: Callable[[S], Awaitable[Service]]) -> None:
    """Tracing, then :func:`serve` what ``create`` builds (logging is the caller's: :func:`main`)."""
    telemetry.setup_tracing(settings.service_name)
    # The process's QUIC certificate (server endpoint, and client identity on quic:// upstreams)
    # is the service's own unless one is named.
    os.environ.setdefault("LLMESH_QUIC_CERT_NAME", settings.service_name)
    service = await create(settings)
    try:
        await serve(settings, service)
    finally:
        # One owner: whatever create() acquired is released here, whether serving ended
        # with a drain or failed on the way up (a port already taken).
        await service.close()
    telemetry.shutdown_tracing()
    log.info("%s stopped", settings.service_name)


def refuse_unauthenticated(settings: ServiceSettings) -> None:
    """Without TLS nobody is authenticated (every caller is trusted): loopback only, unless the
    operator says otherwise (``LLMESH_TLS_ALLOW_PLAINTEXT=true``)."""
    tls = tls_settings()
    if tls.enabled or tls.allow_plaintext or is_loopback(settings.host):
        return
    raise Unavailable(
        f"refusing plaintext gRPC on {settings.host!r}: callers could not be authenticated. Set "
        "LLMESH_TLS_CERT_FILE, LLMESH_TLS_KEY_FILE and LLMESH_TLS_CA_FILE (mutual TLS; "
        "`llmesh certs create` makes development ones), listen on 127.0.0.1, or set "
        "LLMESH_TLS_ALLOW_PLAINTEXT=true"
    )


async def serve(settings: ServiceSettings, service: Service) -> None:
    """Serves ``service`` until SIGTERM/SIGINT, then drains; the caller closes it."""
    refuse_unauthenticated(settings)
    running = await build_server(settings, [service.binding()])
    running.metrics_port = telemetry.start_metrics_server(settings.host, settings.metrics_port)
    quic = None
    if settings.quic_port > 0:
        from services.runtime.quic import QuicSettings, start_server_endpoint

        local = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
        quic = await start_server_endpoint(
            f"{local}:{running.port}",
            f"{settings.host}:{settings.quic_port}",
            QuicSettings.for_service(settings.service_name),
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await service.start(running)
    if settings.gc_freeze:
        frozen = telemetry.freeze_heap()
        log.info("%s froze %d start-up objects (gc.freeze)", settings.service_name, frozen)
    build = build_info.export(settings.service_name)
    log.info(
        "%s serving on %s:%d (metrics port %s), llmesh %s",
        settings.service_name,
        settings.host,
        running.port,
        running.metrics_port,
        build.describe(),
    )
    # The parent (`llmesh up`, tests) reads this line to learn the bound port.
    print(f"LLMESH_READY service={settings.service_name} port={running.port}", flush=True)
    await stop.wait()
    log.info("%s draining (grace %.1fs)", settings.service_name, settings.grace_seconds)
    await service.drain()
    await running.stop(
        settings.grace_seconds, quiet_s=settings.drain_quiet_s, max_delay_s=settings.drain_delay_s
    )
    if quic is not None:  # after the drain: calls in flight over QUIC needed the tunnel
        await quic.close()
