"""``/v1/sessions`` wire models (an llmesh endpoint; the turns are OpenAI chat messages)."""

from __future__ import annotations

from typing import Literal

from llmesh.v1 import chat_pb2, common_pb2
from pydantic import BaseModel, Field

from gateway.api.chat.protocol import FunctionCallOut, ToolCallOut

_ROLES = {
    common_pb2.ROLE_SYSTEM: "system",
    common_pb2.ROLE_USER: "user",
    common_pb2.ROLE_ASSISTANT: "assistant",
    common_pb2.ROLE_TOOL: "tool",
    common_pb2.ROLE_DEVELOPER: "developer",
}


class SessionCard(BaseModel):
    """A session as listed: its size, version and expiry (Unix seconds), not its turns."""

    id: str
    object: Literal["session"] = "session"
    total_turns: int
    version: int
    expires_at: int

    @classmethod
    def from_pb(cls, summary: common_pb2.SessionSummary) -> SessionCard:
        return cls(
            id=summary.session_id,
            total_turns=summary.total_turns,
            version=summary.version,
            expires_at=summary.expires_at_ms // 1000,
        )


class SessionList(BaseModel):
    """A page of sessions; pass ``next_page_token`` as ``page_token`` for the next one."""

    object: Literal["list"] = "list"
    data: list[SessionCard] = Field(default_factory=list)
    has_more: bool
    next_page_token: str | None = None

    @classmethod
    def from_pb(cls, reply: chat_pb2.ChatServiceListSessionsResponse) -> SessionList:
        return cls(
            data=[SessionCard.from_pb(s) for s in reply.sessions],
            has_more=bool(reply.next_page_token),
            next_page_token=reply.next_page_token or None,
        )


class SessionMessage(BaseModel):
    """One turn, as a chat message of the OpenAI API."""

    role: str
    content: str
    name: str | None = None
    tool_calls: list[ToolCallOut] | None = None
    tool_call_id: str | None = None

    @classmethod
    def from_pb(cls, message: common_pb2.ChatMessage) -> SessionMessage:
        calls = [
            ToolCallOut(
                id=c.id,
                function=FunctionCallOut(name=c.function.name, arguments=c.function.arguments),
            )
            for c in message.tool_calls
        ]
        return cls(
            role=_ROLES.get(message.role, "user"),
            content=message.content,
            name=message.name or None,
            tool_calls=calls or None,
            tool_call_id=message.tool_call_id or None,
        )


class SessionDetail(BaseModel):
    """A whole session: every turn, oldest first, and the version they are at."""

    id: str
    object: Literal["session"] = "session"
    version: int
    messages: list[SessionMessage]

    @classmethod
    def from_pb(cls, reply: chat_pb2.ChatServiceGetSessionResponse) -> SessionDetail:
        return cls(
            id=reply.session_id,
            version=reply.version,
            messages=[SessionMessage.from_pb(m) for m in reply.messages],
        )


class SessionDeleted(BaseModel):
    """OpenAI's shape of a deleted object, plus the session's version after the delete."""

    id: str
    object: Literal["session.deleted"] = "session.deleted"
    deleted: bool = True
    version: int
