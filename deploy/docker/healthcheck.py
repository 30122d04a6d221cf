"""Container health check: exit 0 only when the service's gRPC health check answers SERVING.

Docker's HEALTHCHECK runs it inside the container::

    python /opt/llmesh/healthcheck.py cache            # 127.0.0.1:$LLMESH_CACHE_PORT
    python /opt/llmesh/healthcheck.py 10.0.0.7:50053    # an explicit address
    python /opt/llmesh/healthcheck.py cache --liveness  # liveness, not readiness

Without ``--liveness`` it asks the server's overall health, which is readiness: it follows
the service's dependencies (Redis, the audit buffer, the engine) and the drain. With it,
it asks the ``liveness`` health service (services/runtime/server.py), SERVING for as long
as the process's event loop answers: a liveness probe must restart a hung process, not
one that waits for Redis or drains.

grpcurl would exit 0 on NOT_SERVING too (the RPC itself succeeds), and a draining
service must turn unhealthy, so this checks the status. It speaks TLS exactly as the
service's own clients do (``LLMESH_TLS_*``, services/runtime/tls.py): with mutual TLS on,
it presents the container's certificate, so it is also the Kubernetes probe (the built-in
gRPC probe cannot do TLS). It needs grpcio, grpcio-health-checking and llmesh's runtime,
which every llmesh image has.
"""

from __future__ import annotations

import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.runtime.errors import FailedPrecondition
from services.runtime.tls import TLSSettings

# Default gRPC ports (services/runtime/cli/catalog.py); the container's env may override them.
# The liveness signal's health service name (services.runtime.server.LIVENESS).
LIVENESS = "liveness"
DEFAULT_PORTS = {"gateway": 50050, "inference": 50051, "policy": 50052, "cache": 50053, "embeddings": 50054}


def target(arg: str) -> str:
    """``host:port`` as given, or 127.0.0.1 and the port of service ``arg`` from its env."""
    if ":" in arg:
        return arg
    if arg not in DEFAULT_PORTS:
        raise SystemExit(f"unknown service {arg!r}; give one of {sorted(DEFAULT_PORTS)} or host:port")
    port = os.environ.get(f"LLMESH_{arg.upper()}_PORT") or str(DEFAULT_PORTS[arg])
    return f"127.0.0.1:{port}"


def channel(address: str, tls: TLSSettings) -> grpc.Channel:
    """Plaintext, or TLS with this process's certificate when ``LLMESH_TLS_*`` turn it on."""
    if not tls.enabled:
        return grpc.insecure_channel(address)
    # The certificates name 127.0.0.1; LLMESH_TLS_SERVER_NAME overrides the name checked.
    options = [("grpc.ssl_target_name_override", tls.server_name)] if tls.server_name else []
    return grpc.secure_channel(address, tls.channel_credentials(), options=options)


def check(address: str, service: str = "", timeout: float = 3.0, tls: TLSSettings | None = None) -> str:
    """The health status name (``SERVING``, ``NOT_SERVING``, ...) or the gRPC error code name."""
    with channel(address, tls or TLSSettings()) as channel_:
        stub = health_pb2_grpc.HealthStub(channel_)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            return str(exc.code().name)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def main(argv: list[str]) -> int:
    args = [a for a in argv if a != "--liveness"]
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: healthcheck.py SERVICE|HOST:PORT [--liveness]", file=sys.stderr)
        return 2
    service = LIVENESS if "--liveness" in argv else ""
    address = target(args[0])
    tls = TLSSettings()
    if tls.enabled:
        try:
            tls.channel_credentials()  # unreadable files: say which, instead of a traceback
        except FailedPrecondition as exc:
            print(f"{address} {exc}", file=sys.stderr)
            return 1
    status = check(address, service, tls=tls)
    print(f"{address}{' liveness' if service else ''} {status}")
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
