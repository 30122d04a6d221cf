"""HTTP request metrics and the server span of each request (pure ASGI: no per-request task).

The span continues the caller's trace (``traceparent``) when tracing is on, and every
gRPC call the request makes is a child of it, so one trace covers the whole request
across services. Route labels are the fixed API paths ("other" for anything else),
so the metrics' cardinality stays bounded.
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry import propagate, trace
from prometheus_client import Counter, Histogram

from services.runtime.interceptors import tracing_enabled

ROUTES = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/models",
        "/v1/cache/purge",
        "/v1/sessions",
        "/v1/usage",
        "/v1/admin/usage",
        "/healthz",
        "/readyz",
        "/metrics",
    }
)
# Paths with an id in them, labelled by their template.
TEMPLATED_ROUTES = {"/v1/models/": "/v1/models/{model}", "/v1/sessions/": "/v1/sessions/{session_id}"}


def _templated(path: str) -> str:
    for prefix, template in TEMPLATED_ROUTES.items():
        if path.startswith(prefix):
            return template
    return "other"


HTTP_REQUESTS = Counter(
    "llmesh_http_requests_total", "HTTP requests answered by the gateway.", ["route", "code"]
)
HTTP_LATENCY = Histogram(
    "llmesh_http_request_seconds",
    "Time from a request's arrival to the end of its response (streams included).",
    ["route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
# Each label set's child, resolved once (labels() costs a lock and a tuple per call); the
# labels are bounded (fixed routes, HTTP status codes), so are these.
_LATENCY_CHILDREN: dict[str, Any] = {}
_REQUEST_CHILDREN: dict[tuple[str, int], Any] = {}


def _latency(route: str) -> Any:
    child = _LATENCY_CHILDREN.get(route)
    if child is None:
        child = _LATENCY_CHILDREN[route] = HTTP_LATENCY.labels(route)
    return child


def _requests(route: str, status: int) -> Any:
    child = _REQUEST_CHILDREN.get((route, status))
    if child is None:
        child = _REQUEST_CHILDREN[(route, status)] = HTTP_REQUESTS.labels(route, str(status))
    return child


_tracer = trace.get_tracer("llmesh.gateway")
# Probes and scrapes: public (no API key, see gateway.api.guard), and saying nothing about
# whether clients still send work here.
PROBES = frozenset({"/healthz", "/readyz", "/metrics"})
# Answered without an API key: the schema of the public API (the OpenAI shape), nothing tenant-owned.
PUBLIC_DOCS = frozenset({"/openapi.json"})


class RequestActivity:
    """When the latest API request arrived (time.monotonic); the drain waits for it to go quiet."""

    last: float = 0.0


ACTIVITY = RequestActivity()

ASGIApp = Any


class TelemetryMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        route = path if path in ROUTES else _templated(path)
        started = time.perf_counter()
        status = 500
        if path not in PROBES:
            ACTIVITY.last = time.monotonic()

        async def send_wrapper(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            if tracing_enabled():
                carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ())}
                parent = propagate.extract(carrier)
                with _tracer.start_as_current_span(
                    f"{scope.get('method', 'GET')} {route}", context=parent, kind=trace.SpanKind.SERVER
                ) as span:
                    await self.app(scope, receive, send_wrapper)
                    span.set_attribute("http.status_code", status)
            else:
                await self.app(scope, receive, send_wrapper)
        finally:
            _latency(route).observe(time.perf_counter() - started)
            _requests(route, status).inc()
