"""Response keys: what makes two requests the same, hashed into Redis keys.

The exact key hashes the tenant, model and revision, the normalized messages (or
prompt), tools, tool choice, response format, the sampling parameters that change
the output, and the scope. The semantic key splits that in two: everything but the
last user message is hashed exactly into a *partition*; the last user message is
what gets embedded and compared.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cache.domain import ResponseKey, Turn
from services.runtime import namespaces
from services.runtime.versions import MAX_NAMESPACE_LENGTH, slot_tag

# Sampling parameters that only schedule (priority) never change the output; under
# greedy decoding (temperature 0) the random-sampling knobs do not either.
_SCHEDULING_ONLY = frozenset({"priority"})
_GREEDY_IRRELEVANT = frozenset({"top_p", "top_k", "seed", "min_p"})


def normalize_text(text: str) -> str:
    """Unicode NFC, unified line ends, no surrounding whitespace: same meaning, same bytes."""
    return unicodedata.normalize("NFC", text.replace("\r\n", "\n")).strip()


def _turn(t: Turn) -> list[Any]:
    calls = [[c.type, c.name, c.arguments] for c in t.tool_calls]
    return [t.role, normalize_text(t.content), t.name, calls, t.tool_call_id]


def is_greedy(key: ResponseKey) -> bool:
    temperature = key.sampling.get("temperature")
    return temperature is not None and float(temperature) == 0.0


def is_cacheable(key: ResponseKey) -> bool:
    """Only deterministic requests are stored: temperature 0 or a fixed seed."""
    return is_greedy(key) or key.sampling.get("seed") is not None


def _sampling(key: ResponseKey) -> dict[str, Any]:
    drop = _SCHEDULING_ONLY | (_GREEDY_IRRELEVANT if is_greedy(key) else frozenset())
    out: dict[str, Any] = {}
    for name, value in sorted(key.sampling.items()):
        if name in drop or value is None:
            continue
        out[name] = round(value, 6) if isinstance(value, float) else value
    return out


def _digest(material: Sequence[Any]) -> str:
    blob = json.dumps(material, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _common(tenant: str, key: ResponseKey) -> list[Any]:
    return [
        tenant,
        key.model,
        key.model_revision,
        key.tools,
        key.tool_choice,
        key.response_format,
        _sampling(key),
        key.scope,
    ]


def exact_digest(tenant: str, key: ResponseKey) -> str:
    return _digest(
        ["exact", *_common(tenant, key), [_turn(t) for t in key.messages], normalize_text(key.prompt)]
    )


def response_namespace(key: ResponseKey) -> str:
    """The version namespace of the key's scope (``response:<scope>``)."""
    return namespaces.response_scope(key.scope)


@dataclass(frozen=True, slots=True)
class RedisKeys:
    """The Redis keys of one response: entry, lease, last grant, and the hash tag they share."""

    digest: str
    entry: str
    lease: str
    grant: str

    @classmethod
    def of(cls, tenant: str, key: ResponseKey) -> RedisKeys:
        digest = exact_digest(tenant, key)
        tag = slot_tag(tenant, "r:" + digest)
        return cls(
            digest=digest,
            entry="llmesh:resp:" + tag,
            lease="llmesh:lease:" + tag,
            grant="llmesh:grant:" + tag,
        )


@dataclass(frozen=True, slots=True)
class SemanticKey:
    """The partition (exact context) and the text to embed (the last user message)."""

    partition: str
    query: str


def semantic_key(tenant: str, key: ResponseKey) -> SemanticKey | None:
    """None when the request has nothing to compare (no trailing user message, no prompt)."""
    if key.prompt:
        return SemanticKey(
            partition=_digest(["sem", *_common(tenant, key), []]), query=normalize_text(key.prompt)
        )
    if not key.messages or key.messages[-1].role != "user" or not key.messages[-1].content.strip():
        return None
    context = [_turn(t) for t in key.messages[:-1]]
    return SemanticKey(
        partition=_digest(["sem", *_common(tenant, key), context]),
        query=normalize_text(key.messages[-1].content),
    )


def key_problem(key: ResponseKey, max_key_bytes: int) -> str:
    """Why the cache refuses ``key`` (INVALID_ARGUMENT), or "" when it takes it."""
    if not key.model:
        return "key.model must be set"
    size = key_size(key)
    if size > max_key_bytes:
        return f"response key is {size} bytes, over the limit of {max_key_bytes}"
    if len(key.scope) > MAX_NAMESPACE_LENGTH - len(namespaces.RESPONSE_PREFIX):
        return "key.scope is too long"
    if any(c in key.scope for c in "{}\n"):
        return "key.scope must not contain braces or newlines"
    return ""


def key_size(key: ResponseKey) -> int:
    """Approximate encoded size of a key, for the oversized-key check."""
    total = len(key.prompt) + len(key.tools) + len(key.response_format) + len(key.scope) + len(key.model)
    for t in key.messages:
        total += len(t.content) + len(t.name) + sum(len(c.arguments) + len(c.name) for c in t.tool_calls)
    return total
