"""The gRPC server every service runs: health, reflection, interceptors, drain.

``build_server`` starts a grpc.aio server with the standard ``grpc.health.v1``
service, server reflection (``LLMESH_<SERVICE>_REFLECTION``; on unless set false, as the
production overlays do), llmesh's interceptors with the
access checks of :mod:`services.runtime.authz`, message-size limits and
keepalive. :meth:`RunningServer.stop` drains: health goes NOT_SERVING, calls keep
being accepted until clients have stopped sending (no new call for ``drain_quiet_s``,
at most ``drain_delay_s``: clients that health-check each instance, see
``services.runtime.channels``, move away at the NOT_SERVING), then new calls are
refused and in-flight calls get ``grace_seconds`` to finish. Refusing at once
instead would fail the calls already on their way. The process around it (logs,
tracing, metrics, signals) is :mod:`services.runtime.entry`.

Two health signals: ``""`` and each service's name are readiness (they follow the
service's dependencies and the drain: Redis down, audit buffer full, SIGTERM), while
:data:`LIVENESS` answers ``SERVING`` for as long as the event loop runs, so a
liveness probe restarts a process that stopped answering and never one that is only
waiting for Redis or draining. Servers close each client connection after
``max_connection_age_s`` (GOAWAY), so clients of a ``dns:///`` target re-resolve and
reach replicas added since.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from services.runtime import reflection as documented_reflection
from services.runtime.authz import RULES, Authorizer, Rule
from services.runtime.interceptors import ServerInterceptor
from services.runtime.settings import ServiceSettings
from services.runtime.tls import TLSSettings, tls_settings

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# The health service name of the liveness signal (deploy/docker/healthcheck.py --liveness): SERVING
# while the process's event loop answers, whatever its dependencies; readiness is "" and the
# service names.
LIVENESS = "liveness"


@dataclass(frozen=True)
class ServiceBinding:
    """One gRPC service to mount: full name, the generated ``add_*_to_server`` and the servicer."""

    name: str
    add: Callable[[Any, grpc.aio.Server], None]
    servicer: Any
    # False for services without a compiled descriptor (generic handlers): reflection
    # could not describe them.
    reflect: bool = True
    # Access rules by method name, for a service the mesh's table (authz.RULES) does not know.
    access: Mapping[str, Rule] | None = None


@dataclass
class RunningServer:
    """A started server and its health state."""

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    names: list[str]
    metrics_port: int | None = None
    interceptor: ServerInterceptor | None = None
    _stopping: bool = field(default=False, init=False)
    _activity: list[Callable[[], float]] = field(default_factory=list, init=False)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def set_serving(self, serving: bool) -> None:
        """Marks every service (and the server as a whole) SERVING or NOT_SERVING."""
        if self._stopping:
            return
        status = _SERVING if serving else _NOT_SERVING
        for name in ["", *self.names]:
            await self.health.set(name, status)

    def add_activity(self, latest: Callable[[], float]) -> None:
        """Adds calls the server's interceptor does not see (the gateway's HTTP requests) to
        the drain's quiet period: ``latest()`` is the ``time.monotonic()`` of the latest one."""
        self._activity.append(latest)

    async def stop(self, grace: float, *, quiet_s: float = 0.0, max_delay_s: float = 0.0) -> None:
        """Health NOT_SERVING, refuse new calls, let in-flight calls finish within ``grace`` s.

        With ``quiet_s``, new calls are still accepted after NOT_SERVING until none has
        arrived for ``quiet_s`` (at most ``max_delay_s``), counting the sources of
        :meth:`add_activity` too.
        """
        await self.set_serving(False)
        self._stopping = True
        if quiet_s > 0:
            await self.wait_quiet(quiet_s, max_delay_s)
        await self.server.stop(grace)

    async def wait_quiet(self, quiet_s: float, max_delay_s: float) -> float:
        """Returns once no call has arrived for ``quiet_s`` (or after ``max_delay_s``); the wait in s."""
        loop = asyncio.get_running_loop()
        began = time.monotonic()
        deadline = loop.time() + max_delay_s

        def latest() -> float:
            last = [began]
            if self.interceptor is not None:
                last.append(self.interceptor.last_call)
            last.extend(latest() for latest in self._activity)
            return max(last)

        while True:
            left = quiet_s - (time.monotonic() - latest())
            if left <= 0 or loop.time() >= deadline:
                return time.monotonic() - began
            # No event marks "no call arrived": re-check when the quiet period would end.
            await asyncio.sleep(min(left, max(0.0, deadline - loop.time())))

    async def wait(self) -> None:
        await self.server.wait_for_termination()


def server_options(settings: ServiceSettings) -> list[tuple[str, Any]]:
    options: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", settings.max_message_bytes),
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        ("grpc.max_metadata_size", 16 * 1024),
        ("grpc.keepalive_time_ms", settings.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", settings.keepalive_timeout_ms),
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.max_concurrent_streams", settings.max_concurrent_streams),
        ("grpc.so_reuseport", 0),
    ]
    if settings.max_connection_age_s > 0:
        # GOAWAY after the age (gRPC adds +-10 % jitter): the client reconnects, re-resolving a
        # dns:/// target; calls in flight on the old connection get the grace to finish.
        options += [
            ("grpc.max_connection_age_ms", int(settings.max_connection_age_s * 1000)),
            ("grpc.max_connection_age_grace_ms", int(settings.max_connection_age_grace_s * 1000)),
        ]
    return options


def access_rules(bindings: Sequence[ServiceBinding]) -> dict[str, Rule]:
    """The mesh's access table plus the rules bindings bring for services it does not know."""
    rules = dict(RULES)
    for binding in bindings:
        for method, rule in (binding.access or {}).items():
            rules[f"/{binding.name}/{method}"] = rule
    return rules


async def build_server(
    settings: ServiceSettings,
    bindings: Sequence[ServiceBinding],
    *,
    interceptors: bool = True,
    tls: TLSSettings | None = None,
) -> RunningServer:
    """Builds and starts the server on ``settings.host:settings.port`` (port 0 = a free one), with
    TLS as ``LLMESH_TLS_*`` say unless ``tls`` is given."""
    tls = tls or tls_settings()
    rules = access_rules(bindings)
    interceptor = None
    if interceptors:
        prefix = str(type(settings).model_config.get("env_prefix", "LLMESH_"))
        authorizer = Authorizer(
            rules,
            tls=tls.enabled,
            admin_token=settings.admin_token.get_secret_value(),
            admin_token_setting=f"{prefix}ADMIN_TOKEN",
        )
        interceptor = ServerInterceptor(settings.service_name, authorizer)
    server = grpc.aio.server(
        interceptors=[interceptor] if interceptor is not None else [],
        options=server_options(settings),
    )
    names = [b.name for b in bindings]
    for binding in bindings:
        binding.add(binding.servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    # Reflection describes the public contract in protos/, comments included (grpcurl needs no
    # proto files); the production overlays turn it off (LLMESH_<SERVICE>_REFLECTION=false).
    if settings.reflection:
        documented_reflection.enable(
            [
                *(b.name for b in bindings if b.reflect),
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ],
            server,
        )
    address = f"{settings.host}:{settings.port}"
    if tls.enabled:
        port = server.add_secure_port(address, tls.server_credentials())
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind {settings.host}:{settings.port}")
    await server.start()
    running = RunningServer(
        server=server, port=port, health=health_servicer, names=names, interceptor=interceptor
    )
    await health_servicer.set(LIVENESS, _SERVING)
    await running.set_serving(True)
    return running
