"""The gateway process: the HTTP API (uvicorn) and the gRPC ChatService over one :class:`Gateway`.

:func:`create` is the factory :func:`services.runtime.entry.main` runs; :class:`GatewayApp`
is the :class:`~services.runtime.service.Service` it returns. At SIGTERM /readyz turns 503
(:meth:`GatewayApp.drain`) and the HTTP API keeps serving until requests stop arriving (the
drain's quiet period counts them, see :meth:`GatewayApp.start`); then uvicorn stops accepting
and lets the streams in flight finish within the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import uvicorn
from llmesh.v1 import chat_pb2_grpc

from gateway.api.app import create_app
from gateway.api.middleware import ACTIVITY
from gateway.auth import Authenticator
from gateway.config import GatewaySettings
from gateway.mesh import Gateway
from gateway.ratelimit import Limiter
from gateway.servicer import ChatServicer
from services.runtime.errors import Unavailable
from services.runtime.server import RunningServer, ServiceBinding
from services.runtime.settings import is_loopback

log = logging.getLogger(__name__)

SERVICE_NAME = "llmesh.v1.ChatService"


class GatewayApp:
    """A :class:`Gateway` with its HTTP server and its gRPC servicer."""

    def __init__(self, settings: GatewaySettings, gateway: Gateway) -> None:
        self.settings = settings
        self.gateway = gateway
        config = uvicorn.Config(
            create_app(settings, gateway),
            host=settings.http_host,
            port=settings.http_port,
            log_config=None,
            access_log=False,
            # Nothing here reads the client's address, so X-Forwarded-* is not parsed per request;
            # no "server: uvicorn" banner either.
            proxy_headers=False,
            server_header=False,
            lifespan="on",
            timeout_graceful_shutdown=int(settings.grace_seconds),
        )
        self.http = uvicorn.Server(config)
        # uvicorn must not install its own signal handlers: the runtime owns SIGTERM.
        self.http.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
        self._http_task: asyncio.Task[None] | None = None

    def binding(self) -> ServiceBinding:
        return ServiceBinding(
            name=SERVICE_NAME,
            add=chat_pb2_grpc.add_ChatServiceServicer_to_server,
            servicer=ChatServicer(self.gateway),
        )

    async def start(self, server: RunningServer) -> None:
        """Starts the HTTP API; its requests count as activity for the gRPC server's drain."""
        server.add_activity(lambda: ACTIVITY.last)
        task = asyncio.create_task(self.http.serve())
        while not self.http.started:
            if task.done():
                await task  # raises the bind error
                raise OSError(
                    f"HTTP server on {self.settings.http_host}:{self.settings.http_port} did not start"
                )
            await asyncio.sleep(0.01)  # uvicorn exposes no start event
        self._http_task = task
        log.info("gateway HTTP API on http://%s:%d", self.settings.http_host, self.settings.http_port)

    async def drain(self) -> None:
        """/readyz answers 503 from now on, so balancers send new requests elsewhere."""
        self.gateway.draining = True

    async def close(self) -> None:
        self.http.should_exit = True
        if self._http_task is not None:
            await self._http_task
        await self.gateway.close()


def check_exposure(settings: GatewaySettings, auth: Authenticator | None = None) -> None:
    """Refuses a gateway that no key could ever be used on (none configured, none in the admin
    store, no admin token to create one) on an address other than loopback, unless the operator
    wants it open (``LLMESH_GATEWAY_ALLOW_OPEN=true``). With an admin token it starts, closed
    until the first key is created (:func:`gateway.auth.may_run_open`)."""
    auth = auth if auth is not None else Authenticator(settings)
    if settings.allow_open or auth.has_keys or settings.admin_token.get_secret_value():
        return
    exposed = [
        f"{name} {host or '(every interface)'}"
        for name, host in (("HTTP_HOST", settings.http_host), ("HOST", settings.host))
        if not is_loopback(host)
    ]
    if exposed:
        # Unavailable: what is missing is outside the process (its keys), and the entry point
        # turns it into one log line and exit code 1.
        raise Unavailable(
            "no API keys are configured (LLMESH_GATEWAY_API_KEYS), so every caller would be the "
            f"default tenant, and the gateway would listen beyond loopback ({', '.join(exposed)}): "
            "configure API keys (or LLMESH_GATEWAY_ADMIN_TOKEN, to create them through the admin "
            "API), listen on 127.0.0.1, or set LLMESH_GATEWAY_ALLOW_OPEN=true to serve an open "
            "gateway on purpose"
        )


async def create(settings: GatewaySettings, *, limiter: Limiter | None = None) -> GatewayApp:
    """Opens the channels to the mesh's services and builds the HTTP app (not yet listening);
    an open gateway on a non-loopback address is refused (:func:`check_exposure`, once the
    admin store has said whether it holds keys)."""
    gateway = await Gateway.open(settings, limiter=limiter)
    try:
        check_exposure(settings, gateway.auth)
    except BaseException:
        await gateway.close()
        raise
    return GatewayApp(settings, gateway)
