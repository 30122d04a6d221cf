"""OpenAI embeddings wire models."""

from __future__ import annotations

import base64
from typing import Literal

import numpy as np
from llmesh.v1 import embeddings_pb2
from pydantic import BaseModel, Field, model_validator

from gateway.api.protocol import OpenAIModel

MAX_INPUTS = 2048


class EmbeddingRequest(OpenAIModel):
    """``POST /v1/embeddings`` (text inputs; token-id inputs are not supported)."""

    model: str = ""
    input: str | list[str]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None

    @model_validator(mode="after")
    def _check(self) -> EmbeddingRequest:
        texts = self.texts()
        if not texts or len(texts) > MAX_INPUTS:
            raise ValueError(f"input must hold 1 to {MAX_INPUTS} strings")
        if any(not t for t in texts):
            raise ValueError("input strings must not be empty")
        return self

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)

    def to_pb(self) -> embeddings_pb2.EmbedRequest:
        return embeddings_pb2.EmbedRequest(texts=self.texts(), model=self.model)


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData] = Field(default_factory=list)
    model: str
    usage: EmbeddingUsage

    @classmethod
    def from_pb(
        cls, reply: embeddings_pb2.EmbedResponse, encoding: str, dimensions: int | None
    ) -> EmbeddingResponse:
        data = []
        for emb in reply.embeddings:
            values = list(emb.values)
            if dimensions is not None:
                values = values[:dimensions]
            vector: list[float] | str = values
            if encoding == "base64":
                vector = base64.b64encode(np.asarray(values, dtype="<f4").tobytes()).decode()
            data.append(EmbeddingData(index=emb.index, embedding=vector))
        tokens = reply.total_tokens
        return cls(
            data=data, model=reply.model, usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens)
        )
