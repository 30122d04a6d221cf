"""``llmesh serve inference`` / ``python -m services.inference``.

The engine starts before the gRPC port opens (model load takes seconds), so a
client that sees the health check answer SERVING can generate at once. A
watchdog marks the service NOT_SERVING if the engine process dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from services.inference.config import InferenceSettings
from services.inference.engine import VllmEngine
from services.inference.servicer import binding
from services.runtime import telemetry
from services.runtime.errors import Unavailable
from services.runtime.server import RunningServer, serve

log = logging.getLogger(__name__)


async def _watch(engine: VllmEngine, running: RunningServer, interval_s: float) -> None:
    # A periodic probe, not a readiness wait: vLLM offers no event for a dead engine
    # process while no request is in flight.
    while await engine.check_health():  # noqa: ASYNC110
        await asyncio.sleep(interval_s)
    log.error("the inference engine is dead: health set to NOT_SERVING")
    await running.set_serving(False)


async def run(settings: InferenceSettings) -> None:
    telemetry.setup_logging(settings.log_level, settings.log_json)
    engine = await VllmEngine.start(settings)
    tasks: list[asyncio.Task[None]] = []

    async def on_start(running: RunningServer) -> None:
        def dead() -> None:
            tasks.append(asyncio.ensure_future(running.set_serving(False)))

        engine.on_dead = dead
        tasks.append(asyncio.create_task(_watch(engine, running, settings.health_check_interval_s)))

    async def on_stop() -> None:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    try:
        await serve(settings, [binding(engine)], on_start=on_start, on_stop=on_stop)
    finally:
        engine.close()


def main() -> None:
    """Entry point; the engine spawns processes, so this must only run under ``__main__``."""
    try:
        asyncio.run(run(InferenceSettings()))
    except Unavailable as exc:
        log.error("inference cannot start: %s", exc.message)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
