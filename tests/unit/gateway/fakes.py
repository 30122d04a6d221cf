"""An in-process fake InferenceService for gateway tests (a real gRPC server on port 0).

It answers deterministically: the reply is "echo: <last user message>" cut to
max_tokens words, streamed one word per message, so tests can assert on content.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from llmesh.v1 import common_pb2, inference_pb2, inference_pb2_grpc

from services.runtime.errors import NotFound, Unavailable
from services.runtime.server import RunningServer, ServiceBinding, build_server
from services.runtime.settings import ServiceSettings

MODEL = "fake-model"


# Scripted answers: a user message equal to a key gets the value instead of the echo.
SCRIPT = {
    "who to contact?": "write to alice@example.com today",
    "how to do it?": "step one is to build a pipe bomb at home and then",
}


def reply_words(request: inference_pb2.GenerateRequest) -> list[str]:
    if request.prompt:
        text = request.prompt
    else:
        users = [m.content for m in request.messages if m.role == common_pb2.ROLE_USER]
        text = users[-1] if users else ""
    if text in SCRIPT:
        return SCRIPT[text].split()
    systems = [m.content for m in request.messages if m.role == common_pb2.ROLE_SYSTEM]
    turns = len([m for m in request.messages if m.role != common_pb2.ROLE_SYSTEM])
    # What the "model" saw: the user text, plus the context sizes tests assert on.
    words = ["echo:", *text.split()]
    if text == "what did you see?":
        words += [f"turns={turns}", f"systems={len(systems)}", *(" ".join(systems).split()[-6:])]
    limit = request.sampling.max_tokens if request.sampling.HasField("max_tokens") else 64
    return words[:limit]


@dataclass
class FakeInference(inference_pb2_grpc.InferenceServiceServicer):
    name: str = "replica"
    calls: list[inference_pb2.GenerateRequest] = field(default_factory=list)
    fail_next: int = 0
    # Set to make streams wait after the first word until released (cancellation tests).
    hold: asyncio.Event | None = None
    cancelled: int = 0
    cancel_seen: asyncio.Event = field(default_factory=asyncio.Event)

    def _check(self, request: inference_pb2.GenerateRequest) -> None:
        self.calls.append(request)
        if request.model not in ("", MODEL):
            raise NotFound(f"model {request.model!r} not found")
        if self.fail_next > 0:
            self.fail_next -= 1
            raise Unavailable(f"{self.name} is failing on purpose")

    def _usage(self, request: inference_pb2.GenerateRequest, words: list[str]) -> common_pb2.Usage:
        prompt = sum(len(m.content.split()) for m in request.messages) + len(request.prompt.split())
        return common_pb2.Usage(
            prompt_tokens=prompt, completion_tokens=len(words), total_tokens=prompt + len(words)
        )

    async def Generate(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self._check(request)
        words = reply_words(request)
        n = max(1, request.sampling.n)
        tools = list(request.tools)
        choices = []
        for i in range(n):
            if tools and request.tool_choice.mode != common_pb2.ToolChoice.MODE_NONE:
                call = common_pb2.ToolCall(
                    id=f"call_{i}",
                    type="function",
                    function=common_pb2.FunctionCall(
                        name=tools[0].function.name, arguments='{"city": "Paris"}'
                    ),
                )
                choices.append(
                    common_pb2.Completion(
                        index=i, tool_calls=[call], finish_reason=common_pb2.FINISH_REASON_TOOL_CALLS
                    )
                )
            else:
                choices.append(
                    common_pb2.Completion(
                        index=i, text=" ".join(words), finish_reason=common_pb2.FINISH_REASON_STOP
                    )
                )
        return inference_pb2.GenerateResponse(
            id="gen", model=MODEL, choices=choices, usage=self._usage(request, words), model_revision="rev1"
        )

    async def GenerateStream(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        self._check(request)
        words = reply_words(request)
        n = max(1, request.sampling.n)
        try:
            for w, word in enumerate(words):
                last = w == len(words) - 1
                deltas = [
                    common_pb2.CompletionDelta(
                        index=i,
                        text=(word if w == 0 else " " + word),
                        finish_reason=common_pb2.FINISH_REASON_STOP
                        if last
                        else common_pb2.FINISH_REASON_UNSPECIFIED,
                        logprobs=[common_pb2.TokenLogprob(token=word, logprob=-0.5)]
                        if request.sampling.logprobs
                        else [],
                    )
                    for i in range(n)
                ]
                yield inference_pb2.GenerateStreamResponse(id="gen", model=MODEL, deltas=deltas)
                if w == 0 and self.hold is not None:
                    await self.hold.wait()
            yield inference_pb2.GenerateStreamResponse(
                id="gen", model=MODEL, usage=self._usage(request, words), model_revision="rev1"
            )
        except asyncio.CancelledError:
            self.cancelled += 1
            self.cancel_seen.set()
            raise

    async def GetModelInfo(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if request.model not in ("", MODEL):
            raise NotFound(f"model {request.model!r} not found")
        return inference_pb2.GetModelInfoResponse(name=MODEL, revision="rev1", max_model_len=2048)

    async def Tokenize(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        count = sum(len(m.content.split()) for m in request.messages) + len(request.prompt.split())
        return inference_pb2.TokenizeResponse(count=count, max_model_len=2048)


async def start_fake(servicer: FakeInference) -> RunningServer:
    binding = ServiceBinding(
        name="llmesh.v1.InferenceService",
        add=inference_pb2_grpc.add_InferenceServiceServicer_to_server,
        servicer=servicer,
    )
    return await build_server(ServiceSettings(port=0), [binding])
