"""``llmesh serve embeddings``: settings -> model -> runtime.serve."""

from __future__ import annotations

import asyncio

from services.embeddings.app import create_app
from services.embeddings.config import EmbeddingsSettings
from services.runtime import telemetry
from services.runtime.server import serve


async def _run(settings: EmbeddingsSettings) -> None:
    # The model loads in a thread so a slow load does not block signal handling set up later.
    app = await asyncio.to_thread(create_app, settings)
    await serve(settings, [app.binding()], on_stop=app.close)


def main() -> None:
    settings = EmbeddingsSettings()
    telemetry.setup_logging(settings.log_level, settings.log_json)
    asyncio.run(_run(settings))


if __name__ == "__main__":
    main()
