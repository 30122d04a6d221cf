"""Sessions of the calling tenant: HTTP -> :class:`gateway.tenant_cache.TenantCache` -> JSON.

Every answer carries ``X-Cache-Version`` (with ``session:<id>=<version>`` for one session), as
the chat endpoints do: sent back, it makes the next read at least that new.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse, Response
from llmesh.v1 import chat_pb2

from gateway.api.context import response_headers
from gateway.api.deps import Call
from gateway.api.sessions.protocol import SessionDeleted, SessionDetail, SessionList


async def list_sessions(call: Call, limit: int, page_token: str) -> Response:
    request = chat_pb2.ChatServiceListSessionsRequest(page_size=limit, page_token=page_token)
    reply = await call.gateway.tenant_cache.list_sessions(request)
    payload = SessionList.from_pb(reply)
    return JSONResponse(payload.model_dump(exclude_none=True), headers=response_headers(call.ctx))


async def get_session(call: Call, session_id: str) -> Response:
    reply = await call.gateway.tenant_cache.get_session(
        chat_pb2.ChatServiceGetSessionRequest(session_id=session_id)
    )
    payload = SessionDetail.from_pb(reply)
    return JSONResponse(payload.model_dump(exclude_none=True), headers=response_headers(call.ctx))


async def delete_session(call: Call, session_id: str) -> Response:
    reply = await call.gateway.tenant_cache.delete_session(
        chat_pb2.ChatServiceDeleteSessionRequest(session_id=session_id)
    )
    payload = SessionDeleted(id=reply.session_id, version=reply.version)
    return JSONResponse(payload.model_dump(), headers=response_headers(call.ctx))
