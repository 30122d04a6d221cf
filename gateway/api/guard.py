"""What every API request passes before a route sees it: authentication, then the body limit.

Authentication reads only the headers, so a caller without a valid key is refused (401)
before one byte of its body is read, whatever the body holds. The admin API
(``/v1/admin/...``) is authenticated the same way with the gateway's admin token instead of an
API key (404 when no admin token is configured: the admin API is off), and its requests carry
no principal: no tenant can reach it. The body is then read here,
counted as it arrives: more than ``max_body_bytes``, declared in ``Content-Length`` or sent
chunked, is refused with 413 as soon as the count passes the limit, and nothing more is
read (the response closes the connection). The route gets the body replayed as one message
and the principal in the request state (:func:`gateway.api.deps.authenticated`). Probes and
metrics are public and pass through untouched.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.middleware import PROBES, PUBLIC_DOCS
from gateway.auth import Principal, authorize_admin
from gateway.errors import HttpError, openai_body, to_http
from gateway.mesh import Gateway
from services.runtime import context as rc
from services.runtime.errors import LlmeshError

# Where the guard leaves the authenticated principal: scope["state"][PRINCIPAL_STATE].
PRINCIPAL_STATE = "llmesh_principal"
# File uploads (gateway/api/files/) take files_max_bytes instead of max_body_bytes, plus this
# much for the multipart framing and the other form fields.
UPLOAD_PATH = "/v1/files"
UPLOAD_FRAMING_BYTES = 64 * 1024
# Set (True) in scope["state"] when the guard checked the admin token of an admin API request.
ADMIN_STATE = "llmesh_admin"
# The admin API: authenticated with the gateway's admin token instead of an API key.
ADMIN_PREFIX = "/v1/admin"


def is_admin_path(path: str) -> bool:
    return path == ADMIN_PREFIX or path.startswith(ADMIN_PREFIX + "/")


class _BodyTooLarge(Exception):
    pass


class _Disconnected(Exception):
    pass


def too_large(limit: int, request_id: str) -> HttpError:
    """413 with OpenAI's error body."""
    body = openai_body(
        f"the request body is larger than the limit of {limit} bytes",
        "invalid_request_error",
        None,
        "request_too_large",
    )
    return HttpError(413, body, {"x-request-id": request_id})


async def _read_body(receive: Receive, limit: int) -> bytes:
    """The whole body, counted as it arrives; stops at the first chunk that passes ``limit``."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` for the route: the body already read, then the client's own messages (a
    streamed response watches them for the disconnect)."""
    pending = True

    async def replayed() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


class RequestGuard:
    """Pure ASGI: authenticates each API request from its headers, then reads its body up to the limit."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path", "") in PROBES | PUBLIC_DOCS:
            await self.app(scope, receive, send)
            return
        gateway: Gateway = scope["app"].state.gateway
        headers = Headers(scope=scope)
        admin = is_admin_path(scope.get("path", ""))
        try:
            if admin:
                # The admin API takes the admin token only: an API key never reaches it as a tenant.
                authorize_admin(gateway.settings, headers.get("authorization"))
                principal: Principal | None = None
            else:
                principal = await gateway.auth.authenticate(headers.get("authorization"))
        except LlmeshError as exc:
            await self._refuse(scope, receive, send, to_http(exc, rc.new_request_id()))
            return
        limit = gateway.settings.max_body_bytes
        if scope.get("path") == UPLOAD_PATH and scope.get("method") == "POST":
            # A file upload has the file limit instead, plus room for its multipart framing.
            limit = gateway.settings.files_max_bytes + UPLOAD_FRAMING_BYTES
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._refuse(scope, receive, send, too_large(limit, rc.new_request_id()))
            return
        try:
            body = await _read_body(receive, limit)
        except _BodyTooLarge:
            await self._refuse(scope, receive, send, too_large(limit, rc.new_request_id()))
            return
        except _Disconnected:
            return  # nobody is left to answer
        state = scope.setdefault("state", {})
        if admin:
            state[ADMIN_STATE] = True
        else:
            state[PRINCIPAL_STATE] = principal
        await self.app(scope, replay(body, receive), send)

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, error: HttpError) -> None:
        # The body (or its rest) is never read: closing the connection is the only way not to.
        headers = {**error.headers, "connection": "close"}
        await JSONResponse(error.body, status_code=error.status, headers=headers)(scope, receive, send)
