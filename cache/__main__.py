"""``llmesh serve cache``: the ContextCacheService."""

from __future__ import annotations

import asyncio

from cache.app import create_app
from cache.config import CacheSettings
from services.runtime.server import RunningServer, serve


async def _main() -> None:
    settings = CacheSettings()
    app = await create_app(settings)

    async def on_start(server: RunningServer) -> None:
        await app.start(server)

    await serve(settings, [app.binding()], on_start=on_start, on_stop=app.close)


def main() -> None:
    asyncio.run(_main())


if __name__ == "__main__":
    main()
