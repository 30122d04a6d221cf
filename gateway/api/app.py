"""The OpenAI-compatible HTTP app: lifespan (the :class:`Gateway`), error handlers, routers."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.api.admin.router import router as admin_router
from gateway.api.cache.router import router as cache_router
from gateway.api.chat.router import router as chat_router
from gateway.api.completions.router import router as completions_router
from gateway.api.embeddings.router import router as embeddings_router
from gateway.api.fastpath import ChatFastPath
from gateway.api.files.router import router as files_router
from gateway.api.guard import RequestGuard
from gateway.api.health.router import router as health_router
from gateway.api.middleware import TelemetryMiddleware
from gateway.api.models.router import router as models_router
from gateway.api.sessions.router import router as sessions_router
from gateway.api.usage.router import router as usage_router
from gateway.api.vector_stores.router import router as vector_stores_router
from gateway.config import GatewaySettings
from gateway.errors import openai_body, to_http
from gateway.mesh import Gateway
from services.runtime import context as rc
from services.runtime.errors import LlmeshError

log = logging.getLogger(__name__)


def _request_id(request: Request) -> str:
    ctx = getattr(request.state, "llmesh_ctx", None)
    if isinstance(ctx, rc.RequestContext):
        return ctx.request_id
    return rc.new_request_id()


async def _domain_error(request: Request, exc: Exception) -> JSONResponse:
    if not isinstance(exc, (LlmeshError, grpc.aio.AioRpcError, TimeoutError)):
        log.error("unhandled error on %s", request.url.path, exc_info=exc)
    error = to_http(exc, _request_id(request))
    return JSONResponse(error.body, status_code=error.status, headers=error.headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    message = str(first.get("msg", "invalid request"))
    if first.get("type") == "json_invalid":
        message = "the request body is not valid JSON"
    elif loc:
        message = f"{'.'.join(loc)}: {message}"
    body = openai_body(message, "invalid_request_error", ".".join(loc) or None, None)
    return JSONResponse(body, status_code=400, headers={"x-request-id": _request_id(request)})


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    type_ = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    body = openai_body(str(exc.detail), type_, None, None)
    return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))


def create_app(settings: GatewaySettings, gateway: Gateway | None = None) -> FastAPI:
    """The app; without ``gateway`` its lifespan opens one from ``settings`` and closes it."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if gateway is not None:
            app.state.gateway = gateway
            yield
            return
        opened = await Gateway.open(settings)
        app.state.gateway = opened
        try:
            yield
        finally:
            await opened.close()

    app = FastAPI(title="llmesh gateway", version="0.1.0", lifespan=lifespan)
    app.add_exception_handler(LlmeshError, _domain_error)
    app.add_exception_handler(grpc.aio.AioRpcError, _domain_error)
    app.add_exception_handler(TimeoutError, _domain_error)
    app.add_exception_handler(Exception, _domain_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    # The last added runs first: telemetry sees every answer, the guard's 401 and 413 included;
    # chat completions are answered behind the guard, before the router (gateway.api.fastpath).
    app.add_middleware(ChatFastPath)
    app.add_middleware(RequestGuard)
    app.add_middleware(TelemetryMiddleware)
    for router in (chat_router, completions_router, embeddings_router, models_router, health_router):
        app.include_router(router)
    app.include_router(admin_router)
    for router in (cache_router, sessions_router, usage_router):
        app.include_router(router)
    for router in (files_router, vector_stores_router):
        app.include_router(router)
    return app
