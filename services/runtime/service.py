"""The one shape every llmesh service has, as the runtime sees it.

Each service package's ``app.py`` has a factory ``async def create(settings) -> <Name>App``
that builds the service (connections made, models and engines loaded: the slow part, done
before the port opens so SERVING means ready) and returns an object satisfying
:class:`Service`. :func:`services.runtime.entry.main` runs it; tests build it the same way
and serve it with :func:`services.runtime.server.build_server`.

Lifecycle, in the order the runtime calls it (:func:`services.runtime.entry.serve`)::

    create(settings) -> build_server([binding()]) -> start(server) -> ... SIGTERM ...
    -> drain() -> server stops (grace period) -> close()
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from services.runtime.server import RunningServer, ServiceBinding


@runtime_checkable
class Service(Protocol):
    """A built service: its gRPC binding and its lifecycle after ``create``."""

    def binding(self) -> ServiceBinding:
        """The gRPC service to mount; its name is also the health service name."""
        ...

    async def start(self, server: RunningServer) -> None:
        """Starts background work once the server listens; may wire health into ``server``."""
        ...

    async def drain(self) -> None:
        """Runs at SIGTERM before anything stops (health is already NOT_SERVING or about to be)."""
        ...

    async def close(self) -> None:
        """Releases what ``create`` and ``start`` acquired; called once, after the server stopped."""
        ...
