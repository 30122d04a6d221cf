"""``llmesh serve policy``: the PolicyService."""

from __future__ import annotations

import asyncio

from policy.app import create_app
from policy.config import PolicySettings
from services.runtime.server import RunningServer, serve


async def _main() -> None:
    settings = PolicySettings()
    app = await create_app(settings)

    async def on_start(server: RunningServer) -> None:
        await app.start(server)

    await serve(settings, [app.binding()], on_start=on_start, on_stop=app.close)


def main() -> None:
    asyncio.run(_main())


if __name__ == "__main__":
    main()
