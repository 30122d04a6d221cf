"""The servicer over a real gRPC server with a fake engine behind the InferenceEngine protocol."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
from llmesh.v1 import common_pb2 as c
from llmesh.v1 import inference_pb2 as pb
from llmesh.v1 import inference_pb2_grpc as pbg

from services.inference import servicer
from services.inference.config import InferenceSettings
from services.inference.engine import InferenceEngine
from services.inference.kv_events import Update
from services.inference.types import (
    Choice,
    GenerateRequest,
    GenerateResult,
    ModelInfo,
    StreamChunk,
    Timings,
    TokenizeRequest,
    TokenizeResult,
    TokenLogprob,
    ToolCall,
    TopLogprob,
    Usage,
)
from services.runtime.build_info import build_info
from services.runtime.errors import ResourceExhausted, Unavailable
from services.runtime.server import build_server


class FakeEngine:
    def __init__(self) -> None:
        self.requests: list[GenerateRequest] = []
        self.kv_events = True

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        self.requests.append(request)
        if request.sampling.priority == 99:
            raise ResourceExhausted("full", retry_after_s=2.0)
        return GenerateResult(
            id="gen-1",
            model="m",
            revision="abc",
            choices=[
                Choice(
                    index=0,
                    text="",
                    tool_calls=[ToolCall(id="call-1", name="f", arguments='{"a": 1}')],
                    finish_reason="tool_calls",
                    logprobs=[TokenLogprob("x", -0.5, b"x", [TopLogprob("x", -0.5, b"x")])],
                )
            ],
            usage=Usage(prompt_tokens=10, completion_tokens=3, cached_prompt_tokens=4),
            timings=Timings(queue_ms=1, time_to_first_token_ms=2, prefill_ms=3, decode_ms=4, e2e_ms=9),
        )

    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[StreamChunk]:
        self.requests.append(request)
        yield StreamChunk(id="gen-2", model="m", revision="abc", deltas=[Choice(index=0, text="Hel")])
        yield StreamChunk(
            id="gen-2",
            model="m",
            revision="abc",
            deltas=[Choice(index=0, text="lo", finish_reason="stop", stop_reason="\n")],
            usage=Usage(prompt_tokens=5, completion_tokens=2),
            timings=Timings(e2e_ms=1.0),
        )

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        return TokenizeResult(
            count=3, token_ids=[1, 2, 3] if request.return_token_ids else [], max_model_len=8
        )

    def watch_prefixes(self) -> AsyncIterator[Update]:
        if not self.kv_events:
            raise Unavailable("this replica publishes no KV-cache events")
        return self._updates()

    async def _updates(self) -> AsyncIterator[Update]:
        yield Update(True, [1, 2], [], 3, 10)
        yield Update(False, [4], [1], 4, 10)

    def model_info(self, model: str) -> ModelInfo:
        return ModelInfo(
            name="m", revision="abc", path="/m", max_model_len=8, supports_tools=True,
            supports_json_schema=True, tool_parser="hermes", dtype="bfloat16", vocab_size=100, aliases=["a"],
            max_num_seqs=4,
            max_waiting_requests=2, unfinished_requests=1, running_requests=1, waiting_requests=0,
        )  # fmt: skip


@dataclass
class Setup:
    stub: pbg.InferenceServiceAsyncStub
    engine: FakeEngine
    channel: grpc.aio.Channel


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    engine = FakeEngine()
    typed: InferenceEngine = engine
    server = await build_server(InferenceSettings(host="127.0.0.1", port=0), [servicer.binding(typed)])
    channel = grpc.aio.insecure_channel(server.address)
    yield Setup(pbg.InferenceServiceStub(channel), engine, channel)
    await channel.close()
    await server.stop(0)


async def test_generate_maps_request_and_response(setup: Setup) -> None:
    stub, engine = setup.stub, setup.engine
    request = pb.GenerateRequest(
        messages=[c.ChatMessage(role=c.ROLE_USER, content="hi")],
        tools=[c.ToolDefinition(function=c.FunctionDefinition(name="f", parameters_json="{}"))],
        tool_choice=c.ToolChoice(function_name="f"),
        sampling=c.SamplingParams(max_tokens=5, temperature=0.0, n=0),
        chat_template_kwargs_json='{"x": 1}',
        add_generation_prompt=False,
    )
    response = await stub.Generate(request)
    seen = engine.requests[-1]
    assert seen.messages[0].role == "user" and seen.prompt is None
    assert seen.sampling.max_tokens == 5 and seen.sampling.temperature == 0.0 and seen.sampling.top_p is None
    assert seen.sampling.n == 1
    assert seen.tool_choice.function == "f" and seen.tools[0].parameters_json == "{}"
    assert seen.chat_template_kwargs == {"x": 1} and seen.add_generation_prompt is False
    (choice,) = response.choices
    assert choice.finish_reason == c.FINISH_REASON_TOOL_CALLS
    assert choice.tool_calls[0].function.arguments == '{"a": 1}'
    assert choice.logprobs[0].top_logprobs[0].token == "x"
    assert response.usage.total_tokens == 13 and response.usage.cached_prompt_tokens == 4
    assert response.timings.e2e_ms == 9 and response.model_revision == "abc"


async def test_stream_puts_usage_on_the_last_message(setup: Setup) -> None:
    stub = setup.stub
    chunks = [m async for m in stub.GenerateStream(pb.GenerateStreamRequest(prompt="x"))]
    assert [m.HasField("usage") for m in chunks] == [False, True]
    assert "".join(d.text for m in chunks for d in m.deltas) == "Hello"
    assert chunks[-1].deltas[0].finish_reason == c.FINISH_REASON_STOP


async def test_domain_errors_become_status_codes(setup: Setup) -> None:
    stub = setup.stub
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Generate(pb.GenerateRequest(prompt="x", sampling=c.SamplingParams(priority=99)))
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert dict(caught.value.trailing_metadata() or ())["retry-after"] == "2"
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Generate(
            pb.GenerateRequest(messages=[c.ChatMessage(role=c.ROLE_USER)], chat_template_kwargs_json="[]")
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "chat_template_kwargs_json must be a JSON object" in (caught.value.details() or "")


async def test_undecodable_request_is_invalid_argument(setup: Setup) -> None:
    engine, channel = setup.engine, setup.channel
    for method in ("Generate", "Tokenize"):
        raw = channel.unary_unary(
            f"/llmesh.v1.InferenceService/{method}",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await raw(b"\x1a\x02\xff\xfe")
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "bad UTF-8" in (caught.value.details() or "")
    assert engine.requests == []


async def test_unspecified_role_is_invalid_argument(setup: Setup) -> None:
    stub = setup.stub
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Tokenize(pb.TokenizeRequest(messages=[c.ChatMessage(content="x")]))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "messages[0].role is ROLE_UNSPECIFIED" in (caught.value.details() or "")


async def test_tokenize_and_model_info(setup: Setup) -> None:
    stub = setup.stub
    counted = await stub.Tokenize(pb.TokenizeRequest(prompt="abc", return_token_ids=True))
    assert (counted.count, list(counted.token_ids), counted.max_model_len) == (3, [1, 2, 3], 8)
    info = await stub.GetModelInfo(pb.GetModelInfoRequest())
    assert info.name == "m" and list(info.aliases) == ["a"] and info.max_waiting_requests == 2
    assert info.unfinished_requests == 1
    assert info.llmesh_version == build_info().version and info.llmesh_revision == build_info().revision


async def test_watch_prefixes_streams_the_engines_updates(setup: Setup) -> None:
    replies = [r async for r in setup.stub.WatchPrefixes(pb.WatchPrefixesRequest())]
    assert [(r.reset, list(r.held), list(r.released), r.blocks_held) for r in replies] == [
        (True, [1, 2], [], 3),
        (False, [4], [1], 4),
    ]
    assert replies[0].blocks_total == 10


async def test_watch_prefixes_without_kv_events_is_unavailable(setup: Setup) -> None:
    setup.engine.kv_events = False
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in setup.stub.WatchPrefixes(pb.WatchPrefixesRequest()):
            pass
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "KV-cache events" in (err.value.details() or "")


async def test_a_route_prefix_reaches_the_engine_and_a_bad_one_is_invalid(setup: Setup) -> None:
    route = pb.RoutePrefix(keys=[7, 8], block_chars=256, text_chars=600)
    await setup.stub.Generate(pb.GenerateRequest(prompt="x", route_prefix=route))
    got = setup.engine.requests[-1].route_prefix
    assert got is not None and (got.keys, got.block_chars, got.text_chars) == ([7, 8], 256, 600)
    route.text_chars = 0
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await setup.stub.Generate(pb.GenerateRequest(prompt="x", route_prefix=route))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
