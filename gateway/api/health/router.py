"""``/healthz`` (liveness), ``/readyz`` (required upstreams healthy, 503 once draining) and ``/metrics``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.api.deps import gateway_of

router = APIRouter()

# Upstreams without which requests fail (cache and embeddings only degrade them).
REQUIRED = ("inference", "policy")


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    gateway = gateway_of(request)
    if gateway.draining:
        # Draining after SIGTERM: in-flight requests finish, new ones belong elsewhere.
        return JSONResponse({"status": "draining", "checks": {}}, status_code=503)
    checks = await gateway.readiness()
    ready = all(checks.get(name, "ok") == "ok" for name in REQUIRED)
    return JSONResponse(
        {"status": "ready" if ready else "not ready", "checks": checks}, status_code=200 if ready else 503
    )


@router.get("/metrics")
async def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
