"""Logging, tracing and the Prometheus side port of a service.

* Logs are JSON lines carrying the request id and tenant of the current request.
* Traces go to an OTLP collector when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set;
  otherwise no exporter is installed (spans cost next to nothing), but trace
  context is still passed from hop to hop.
* ``/metrics`` is served on a side HTTP port (``metrics_port``; 0 = a free port).
* Once started, the service's heap is frozen out of the cyclic collector's walk
  (:func:`freeze_heap`, called by :func:`services.runtime.entry.serve`).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import sys
import time
from typing import Any

from opentelemetry import trace
from prometheus_client import Gauge, start_http_server

from services.runtime import context as rc

_configured = False
# Tasks alive in the service's event loop: flat under steady load, or something leaks
# (the reliability soak reads it).
_TASKS = Gauge("llmesh_asyncio_tasks", "asyncio tasks alive in the service's event loop")
_FROZEN = Gauge(
    "llmesh_gc_frozen_objects",
    "Objects the service moved out of the cyclic garbage collector's reach once started (0: none)",
)


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the request id of the current request."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        ctx = rc.peek()
        if ctx is not None:
            entry["request_id"] = ctx.request_id
            entry["tenant"] = ctx.tenant
        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            entry["trace_id"] = f"{span.trace_id:032x}"
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def setup_logging(level: str = "INFO", json_logs: bool = True) -> None:
    """Configures the root logger; once per process, by :func:`services.runtime.entry.main`."""
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if json_logs else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def setup_tracing(service_name: str) -> None:
    """Installs an SDK tracer provider with an OTLP exporter when an endpoint is configured."""
    global _configured
    if _configured or not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": f"llmesh-{service_name}"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _configured = True


def shutdown_tracing() -> None:
    provider = trace.get_tracer_provider()
    shutdown = getattr(provider, "shutdown", None)
    if callable(shutdown):
        shutdown()


def start_metrics_server(host: str, port: int) -> int | None:
    """Serves /metrics; returns the bound port, or None when ``port`` < 0 (off)."""
    if port < 0:
        return None
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is not None:
        # Read from the metrics thread: all_tasks copes with the set changing meanwhile.
        _TASKS.set_function(lambda: len(asyncio.all_tasks(loop)))
    server, _thread = start_http_server(port, addr=host)
    return int(server.server_port)


def freeze_heap() -> int:
    """Collects, then freezes what is left (``gc.freeze``): the modules, models and tables a
    service loaded before serving are never garbage, and a full collection that walks them
    holds the event loop for as long as the heap is big. Returns the objects frozen."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    _FROZEN.set(frozen)
    return frozen
