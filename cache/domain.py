"""The cache's domain types (no protobuf, no gRPC): turns, response keys, entries, results."""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from services.runtime.cache_status import CacheStatus

ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})


@dataclass(frozen=True, slots=True)
class ToolCallRef:
    """A tool call an assistant turn made."""

    id: str
    name: str
    arguments: str
    type: str = "function"


@dataclass(frozen=True, slots=True)
class Turn:
    """One message of a conversation."""

    role: str
    content: str
    name: str = ""
    tool_calls: tuple[ToolCallRef, ...] = ()
    tool_call_id: str = ""
    pinned: bool = False

    def to_json(self) -> str:
        data: dict[str, Any] = {"r": self.role, "c": self.content}
        if self.name:
            data["n"] = self.name
        if self.tool_calls:
            data["tc"] = [[c.id, c.type, c.name, c.arguments] for c in self.tool_calls]
        if self.tool_call_id:
            data["ti"] = self.tool_call_id
        if self.pinned:
            data["p"] = 1
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Turn:
        data = json.loads(raw)
        return cls(
            role=data["r"],
            content=data["c"],
            name=data.get("n", ""),
            tool_calls=tuple(
                ToolCallRef(id=i, type=t, name=n, arguments=a) for i, t, n, a in data.get("tc", ())
            ),
            tool_call_id=data.get("ti", ""),
            pinned=bool(data.get("p", 0)),
        )

    def text_for_counting(self) -> str:
        """What the tokenizer sees of this turn besides the chat-template framing."""
        parts = [self.content]
        parts.extend(f"{c.name}({c.arguments})" for c in self.tool_calls)
        return "\n".join(p for p in parts if p)


class Strategy(enum.Enum):
    """How a session is cut down to a token budget."""

    TAIL = "tail"
    SYSTEM_TAIL = "system+tail"
    PINNED = "pinned"


@dataclass(frozen=True, slots=True)
class SessionView:
    """A session as read: its (possibly truncated) turns and what truncation did."""

    session_id: str
    turns: tuple[Turn, ...]
    version: int
    total_turns: int
    truncated: bool = False
    dropped_turns: int = 0
    token_count: int = 0


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """A session as a listing shows it: its size, version and expiry, not its turns."""

    session_id: str
    total_turns: int
    version: int
    # When it expires unless appended to again, ms since the epoch on Redis' clock (0: unknown).
    expires_at_ms: int


@dataclass(frozen=True, slots=True)
class ResponseKey:
    """Everything that changes a response, in canonical form (see :mod:`cache.keys`)."""

    model: str
    model_revision: str = ""
    messages: tuple[Turn, ...] = ()
    prompt: str = ""
    # Canonical JSON of tools, tool choice and response format.
    tools: str = ""
    tool_choice: str = ""
    response_format: str = ""
    # Sampling parameters that were set (name -> value).
    sampling: Mapping[str, Any] = field(default_factory=dict)
    scope: str = ""


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """A stored response: an opaque payload plus what decides whether it may be served."""

    payload: bytes
    # (namespace -> version) the response was derived from.
    derived_from: Mapping[str, int]
    created_at_ms: int
    expires_at_ms: int
    model: str = ""


# The one cache status of the mesh (proto, trailers, headers and lookups share it).
Status = CacheStatus


@dataclass(frozen=True, slots=True)
class LookupResult:
    status: Status
    entry: CacheEntry | None = None
    age_ms: int = 0
    semantic: bool = False
    similarity: float = 0.0
    # The verifier that accepted a semantic hit and its score in [0, 1].
    verifier: str = ""
    verifier_score: float = 0.0
    lease_token: str = ""
    detail: str = ""
    # An exact HIT: the entry's remaining lifetime and its id (cache.keys.exact_digest).
    ttl_ms: int = 0
    entry_id: str = ""


@dataclass(frozen=True, slots=True)
class StoreResult:
    stored: bool
    detail: str = ""
