"""``POST /v1/chat/completions`` without the framework's per-request machinery (pure ASGI).

The hot endpoint's requests are answered here, inside :class:`~gateway.api.guard.RequestGuard`
(which authenticated the caller and read the body): the body is validated straight from its
bytes (pydantic's JSON mode), the request context comes from the raw headers, and the route's
own function (:func:`gateway.api.chat.service.create_chat_completion`) runs, with no router
scan, no dependency injection, no ``Request`` object and no exception middleware between.
A cache hit then costs the pipeline's work and little else (BENCHMARKS.md, "mesh: lean hit
path, cheap tokens, TTFT split").

Everything this path does not handle the same way as the FastAPI route is handed to it,
untouched, before anything happened: a body that does not validate (so the 400 is FastAPI's,
word for word), a content type other than JSON (or none), an app built without the guard. The
route stays registered, so the OpenAPI schema is unchanged. Errors raised once the pipeline has
started are answered as the app's error handler answers them (:func:`gateway.errors.to_http`).
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
from pydantic import ValidationError
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.api.chat.protocol import ChatCompletionRequest
from gateway.api.chat.service import create_chat_completion
from gateway.api.context import context_from_headers
from gateway.api.deps import Call
from gateway.api.guard import PRINCIPAL_STATE, replay
from gateway.auth import Principal
from gateway.errors import to_http
from gateway.mesh import Gateway
from services.runtime import context as rc
from services.runtime.errors import LlmeshError

log = logging.getLogger(__name__)

CHAT_PATH = "/v1/chat/completions"
# Request headers the request context reads (gateway.api.context.context_from_headers).
_CONTEXT_HEADERS = frozenset(
    {b"x-request-id", b"cache-control", b"pragma", b"x-cache-version", b"x-semantic-cache", b"traceparent"}
)


def _json_content(content_type: bytes | None) -> bool:
    """What FastAPI reads as JSON: ``application/json`` or ``application/...+json`` (a request
    without a content type is not: FastAPI's strict content type)."""
    if content_type is None:
        return False
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


class ChatFastPath:
    """Pure ASGI, the innermost middleware: answers ``POST /v1/chat/completions`` itself."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != CHAT_PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        principal = scope.get("state", {}).get(PRINCIPAL_STATE)
        if not isinstance(principal, Principal):
            await self.app(scope, receive, send)  # no guard in front: the route authenticates
            return
        wanted: dict[str, str] = {}
        content_type: bytes | None = None
        for name, value in scope["headers"]:
            if name in _CONTEXT_HEADERS:
                wanted.setdefault(name.decode("latin-1"), value.decode("latin-1"))
            elif name == b"content-type" and content_type is None:
                content_type = value
        # The guard replays the whole body as one message.
        message = await receive()
        body: bytes = message.get("body", b"")
        if not _json_content(content_type):
            await self.app(scope, replay(body, receive), send)
            return
        try:
            request = ChatCompletionRequest.model_validate_json(body)
        except ValidationError:
            await self.app(scope, replay(body, receive), send)  # FastAPI words the 400
            return
        gateway: Gateway = scope["app"].state.gateway
        request_id = ""
        try:
            ctx = context_from_headers(wanted, principal, gateway.settings.request_timeout_s)
            request_id = ctx.request_id
            rc.activate(ctx)
            scope.setdefault("state", {})["llmesh_ctx"] = ctx
            response = await create_chat_completion(request, Call(gateway, principal, ctx))
        except Exception as exc:  # answered as the app's error handler answers it
            await _error(exc, request_id, scope, receive, send)
            return
        await response(scope, receive, send)


async def _error(exc: Exception, request_id: str, scope: Scope, receive: Receive, send: Send) -> None:
    if not isinstance(exc, (LlmeshError, grpc.aio.AioRpcError, TimeoutError)):
        log.error("unhandled error on %s", CHAT_PATH, exc_info=exc)
    error = to_http(exc, request_id or rc.new_request_id())
    answer: Any = JSONResponse(error.body, status_code=error.status, headers=error.headers)
    await answer(scope, receive, send)
