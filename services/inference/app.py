"""The inference service: the vLLM engine, its servicer and the dead-engine watchdog.

:func:`create` is the factory :func:`services.runtime.entry.main` runs; :class:`InferenceApp`
is the :class:`~services.runtime.service.Service` it returns. The engine starts in
:func:`create`, before the gRPC port opens (model load takes seconds), so a client that sees
the health check answer SERVING can generate at once. vLLM on CPU spawns processes, so
:func:`create` runs only from ``services/inference/__main__.py``'s ``__main__`` guard; importing
this module builds nothing.
"""

from __future__ import annotations

import asyncio
import logging

from services.inference.config import InferenceSettings
from services.inference.engine import VllmEngine
from services.inference.servicer import binding
from services.runtime.server import RunningServer, ServiceBinding
from services.runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)


async def watch(engine: VllmEngine, running: RunningServer, interval_s: float) -> None:
    """Marks the service NOT_SERVING once the engine process is dead."""
    # A periodic probe, not a readiness wait: vLLM offers no event for a dead engine
    # process while no request is in flight.
    while await engine.check_health():  # noqa: ASYNC110
        await asyncio.sleep(interval_s)
    log.error("the inference engine is dead: health set to NOT_SERVING")
    await running.set_serving(False)


class InferenceApp:
    """A started engine and the watchdog that reports its death to the health service."""

    def __init__(self, settings: InferenceSettings, engine: VllmEngine) -> None:
        self.settings = settings
        self.engine = engine
        self._tasks: list[asyncio.Task[None]] = []

    def binding(self) -> ServiceBinding:
        return binding(self.engine, self.settings.max_streams_per_call)

    async def start(self, server: RunningServer) -> None:
        """Health follows the engine: at once when a request sees it die, else at the next probe."""

        def dead() -> None:
            self._tasks.append(asyncio.ensure_future(server.set_serving(False)))

        self.engine.on_dead = dead
        self._tasks.append(
            asyncio.create_task(watch(self.engine, server, self.settings.health_check_interval_s))
        )

    async def drain(self) -> None:
        """Nothing of its own to stop early: the server's drain lets generations finish."""

    async def close(self) -> None:
        for task in self._tasks:
            await cancel_and_wait(task)
        await self.engine.close_feed()
        self.engine.close()


async def create(settings: InferenceSettings) -> InferenceApp:
    """Starts the engine (model load: seconds to minutes); call only under ``__main__``."""
    return InferenceApp(settings, await VllmEngine.start(settings))
