"""gRPC clients the cache uses: the EmbeddingService (semantic cache) and
InferenceService.Tokenize (token counts when no local tokenizer is present)."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import numpy as np
from llmesh.v1 import common_pb2, embeddings_pb2, embeddings_pb2_grpc, inference_pb2, inference_pb2_grpc

from cache import defaults
from cache.vectors import Vector, normalize
from services.runtime.channels import connect

_ROLES = {
    "system": common_pb2.ROLE_SYSTEM,
    "user": common_pb2.ROLE_USER,
    "assistant": common_pb2.ROLE_ASSISTANT,
    "tool": common_pb2.ROLE_TOOL,
    "developer": common_pb2.ROLE_DEVELOPER,
}


class GrpcEmbedder:
    """Embeds through EmbeddingService.Embed (the deployment's shared embedding model)."""

    def __init__(self, channel: grpc.aio.Channel, model: str = "", timeout_s: float = 0.5) -> None:
        self.channel = channel
        self._stub = embeddings_pb2_grpc.EmbeddingServiceStub(channel)
        self._model = model
        self._timeout_s = timeout_s

    @classmethod
    async def connect(cls, address: str, model: str = "", timeout_s: float = 0.5) -> GrpcEmbedder:
        return cls(await connect(address), model, timeout_s)

    async def embed(self, texts: Sequence[str]) -> Vector:
        reply = await self._stub.Embed(
            embeddings_pb2.EmbedRequest(texts=list(texts), model=self._model), timeout=self._timeout_s
        )
        rows = sorted(reply.embeddings, key=lambda e: e.index)
        return normalize(np.array([list(e.values) for e in rows], dtype=np.float32))

    async def close(self) -> None:
        await self.channel.close()


class GrpcTokenizer:
    """``tokenize(model, text, messages) -> count`` for :class:`cache.tokenizers.RemoteTokenCounter`."""

    def __init__(self, channel: grpc.aio.Channel, timeout_s: float = 2.0) -> None:
        self._channel = channel
        self._stub = inference_pb2_grpc.InferenceServiceStub(channel)
        self._timeout_s = timeout_s

    @classmethod
    async def connect(cls, address: str) -> GrpcTokenizer:
        return cls(await connect(address))

    async def __call__(self, model: str, text: str, messages: Sequence[tuple[str, str]]) -> int:
        request = inference_pb2.TokenizeRequest(model=model)
        if messages:
            request.messages.extend(common_pb2.ChatMessage(role=_ROLES[r], content=c) for r, c in messages)
            request.add_generation_prompt = False
        else:
            request.prompt = text
        reply = await self._stub.Tokenize(request, timeout=self._timeout_s)
        return int(reply.count)

    async def close(self) -> None:
        await self._channel.close()


class GrpcVerifier:
    """Verifies semantic candidates through EmbeddingService.ScorePairs."""

    def __init__(
        self, channel: grpc.aio.Channel, threshold: float, model: str = "", timeout_s: float = 0.5
    ) -> None:
        self._stub = embeddings_pb2_grpc.EmbeddingServiceStub(channel)
        self.name = model or defaults.SEMANTIC_VERIFIER
        self._model = model
        self.threshold = threshold
        self._timeout_s = timeout_s

    async def scores(self, query: str, candidates: Sequence[str]) -> list[float]:
        reply = await self._stub.ScorePairs(
            embeddings_pb2.ScorePairsRequest(query=query, candidates=list(candidates), model=self._model),
            timeout=self._timeout_s,
        )
        if len(reply.scores) != len(candidates):
            raise ValueError(
                f"ScorePairs returned {len(reply.scores)} scores for {len(candidates)} candidates"
            )
        self.name = reply.model or self.name
        return list(reply.scores)
