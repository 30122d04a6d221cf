"""``POST /v1/cache/purge`` wire models (an llmesh endpoint; no OpenAI counterpart)."""

from __future__ import annotations

from typing import Literal

from llmesh.v1 import chat_pb2
from pydantic import BaseModel, Field, model_validator

from gateway.api.protocol import OpenAIModel, RagRequest


class PurgeRequest(OpenAIModel):
    """What to purge; at most one field, none (``{}`` or no body) = every cached answer."""

    # A namespace the cache owns: "tenant", "response:<scope>", "session:<id>".
    namespace: str | None = Field(default=None, min_length=1, max_length=256)
    # The answers of chat requests sent with this ``rag`` extension (the same object).
    rag: RagRequest | None = None
    # Shorthand for ``rag: {"collections": [name]}`` (the tenant's top_k, no min_score).
    rag_collection: str | None = Field(default=None, min_length=1, max_length=256)

    @model_validator(mode="after")
    def _one_target(self) -> PurgeRequest:
        if sum(v is not None for v in (self.namespace, self.rag, self.rag_collection)) > 1:
            raise ValueError("set at most one of namespace, rag and rag_collection")
        return self

    def to_pb(self) -> chat_pb2.PurgeCacheRequest:
        if self.namespace is not None:
            return chat_pb2.PurgeCacheRequest(namespace=self.namespace)
        if self.rag_collection is not None:
            return chat_pb2.PurgeCacheRequest(rag=chat_pb2.RagOptions(collections=[self.rag_collection]))
        if self.rag is not None:
            rag = chat_pb2.RagOptions(
                collections=self.rag.collections, top_k=self.rag.top_k, min_score=self.rag.min_score
            )
            return chat_pb2.PurgeCacheRequest(rag=rag)
        return chat_pb2.PurgeCacheRequest()


class PurgeResponse(BaseModel):
    """The purged namespace, its new version, and the ``X-Cache-Version`` to send next."""

    object: Literal["cache.purge"] = "cache.purge"
    namespace: str
    version: int
    cache_version: str

    @classmethod
    def from_pb(cls, reply: chat_pb2.PurgeCacheResponse) -> PurgeResponse:
        return cls(
            namespace=reply.version.namespace,
            version=reply.version.version,
            cache_version=reply.cache_version,
        )
