"""The HTTP API against fake inference replicas: the official openai SDK as the client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest

from gateway.auth import hash_key
from gateway.config import GatewaySettings, TenantSettings
from tests.fixtures.fake_inference import MODEL, FakeInference, start_fake
from tests.fixtures.gateway import RunningGateway, serve_gateway

KEY = "sk-test-alpha"
LIMITED_KEY = "sk-test-limited"


@pytest.fixture(scope="module")
async def replica() -> AsyncIterator[tuple[FakeInference, str]]:
    fake = FakeInference("r1")
    server = await start_fake(fake)
    yield fake, server.address
    await server.stop(0)


@pytest.fixture(scope="module")
async def gw(replica: tuple[FakeInference, str]) -> AsyncIterator[RunningGateway]:
    settings = GatewaySettings(
        inference_addresses=[replica[1]],
        api_keys={hash_key(KEY): "alpha", hash_key(LIMITED_KEY): "limited"},
        tenants={"alpha": TenantSettings(), "limited": TenantSettings(models=["other-model"])},
    )
    async with serve_gateway(settings) as running:
        yield running


@pytest.fixture
async def client(gw: RunningGateway) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0) as sdk:
        yield sdk


async def test_chat_completion(client: openai.AsyncOpenAI) -> None:
    reply = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello there"}], max_tokens=10
    )
    assert reply.choices[0].message.content == "echo: hello there"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None and reply.usage.completion_tokens == 3
    assert reply.model == MODEL


async def test_default_model_and_n(client: openai.AsyncOpenAI) -> None:
    reply = await client.chat.completions.create(model="", messages=[{"role": "user", "content": "two"}], n=2)
    assert [c.index for c in reply.choices] == [0, 1]


async def test_stream_with_usage(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "one two three"}],
        stream=True,
        stream_options={"include_usage": True},
        logprobs=True,
    )
    text, roles, usage, finish, logprobs = [], [], None, None, 0
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            roles.append(choice.delta.role)
            finish = choice.finish_reason or finish
            if choice.logprobs and choice.logprobs.content:
                logprobs += len(choice.logprobs.content)
    assert "".join(text) == "echo: one two three"
    assert roles[0] == "assistant" and all(r is None for r in roles[1:])
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens == 4
    assert logprobs == 4


async def test_stream_without_usage_has_no_empty_chunk(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "a b"}], stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert all(chunk.choices for chunk in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "echo: a b"


async def test_tool_call(client: openai.AsyncOpenAI) -> None:
    tools: list[Any] = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    reply = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "weather?"}], tools=tools, tool_choice="auto"
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


async def test_completions(client: openai.AsyncOpenAI) -> None:
    reply = await client.completions.create(model=MODEL, prompt="say this", max_tokens=5)
    assert reply.choices[0].text == "echo: say this"
    stream = await client.completions.create(model=MODEL, prompt="x y", stream=True)
    assert "".join([c.choices[0].text async for c in stream]) == "echo: x y"


async def test_completions_batch_of_prompts(client: openai.AsyncOpenAI) -> None:
    # OpenAI's numbering: choice j of prompt i is index i * n + j; usage is the batch's sum.
    single = await client.completions.create(model=MODEL, prompt="one", max_tokens=5)
    reply = await client.completions.create(model=MODEL, prompt=["one", "two words"], max_tokens=5, n=2)
    assert [(c.index, c.text) for c in sorted(reply.choices, key=lambda c: c.index)] == [
        (0, "echo: one"),
        (1, "echo: one"),
        (2, "echo: two words"),
        (3, "echo: two words"),
    ]
    assert single.usage is not None and reply.usage is not None
    assert reply.usage.prompt_tokens > single.usage.prompt_tokens
    stream = await client.completions.create(
        model=MODEL, prompt=["a b", "c"], stream=True, stream_options={"include_usage": True}
    )
    texts: dict[int, str] = {}
    usage = None
    async for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
        usage = chunk.usage or usage
    assert texts == {0: "echo: a b", 1: "echo: c"}
    assert usage is not None and usage.completion_tokens > 0


async def test_completions_bad_prompts_are_400(client: openai.AsyncOpenAI) -> None:
    for prompt, needle in (
        ([], "empty list"),
        (["ok", ""], "prompt[1] must not be empty"),
        (["p"] * 17, "at most 16 prompts"),
        ([1, 2, 3], "prompt"),
    ):
        with pytest.raises(openai.BadRequestError) as info:
            await client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)  # type: ignore[arg-type]
        assert needle in str(info.value)


async def test_models(client: openai.AsyncOpenAI) -> None:
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert (await client.models.retrieve(MODEL)).id == MODEL


async def test_bad_key_is_401(gw: RunningGateway) -> None:
    async with openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError) as info:
            await bad.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 401
    assert info.value.code == "invalid_api_key"


async def test_missing_key_is_401(gw: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=gw.url) as http:
        reply = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": []})
    assert reply.status_code == 401
    assert reply.json()["error"]["type"] == "authentication_error"


async def test_unknown_model_is_404(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        await client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert info.value.code == "model_not_found"


async def test_model_not_allowed_is_403(gw: RunningGateway) -> None:
    async with openai.AsyncOpenAI(base_url=gw.base_url, api_key=LIMITED_KEY, max_retries=0) as limited:
        with pytest.raises(openai.PermissionDeniedError):
            await limited.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (json.dumps({"model": MODEL, "messages": []}).encode(), "messages"),
        (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 99}).encode(), "n"),
        (json.dumps({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}).encode(), None),
    ],
)
async def test_malformed_requests_are_400(gw: RunningGateway, body: bytes, param: str | None) -> None:
    async with httpx.AsyncClient(base_url=gw.url) as http:
        reply = await http.post(
            "/v1/chat/completions",
            content=body,
            headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"},
        )
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param


@pytest.mark.parametrize("value", ["max-age=abc", "max-age=-1", "bogus-directive"])
async def test_bad_cache_control_is_400(gw: RunningGateway, value: str) -> None:
    async with httpx.AsyncClient(base_url=gw.url) as http:
        reply = await http.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
            headers={"authorization": f"Bearer {KEY}", "cache-control": value},
        )
    assert reply.status_code == 400
    assert "Cache-Control" in reply.json()["error"]["message"]


async def test_health_endpoints(gw: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=gw.url) as http:
        assert (await http.get("/healthz")).status_code == 200
        ready = await http.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["checks"]["inference"] == "ok"
        metrics = await http.get("/metrics")
        assert metrics.status_code == 200


async def test_without_cache_status_is_bypass(gw: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=gw.url) as http:
        reply = await http.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
            headers={"authorization": f"Bearer {KEY}", "x-request-id": "req-123"},
        )
    assert reply.status_code == 200
    assert reply.headers["x-cache-status"] == "BYPASS"
    assert reply.headers["x-request-id"] == "req-123"
    assert reply.json()["id"] == "chatcmpl-req-123"


async def test_chat_completions_are_answered_before_the_router(
    gw: RunningGateway, client: openai.AsyncOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gateway.api.fastpath answers the endpoint: the FastAPI route never runs for a valid request."""
    import gateway.api.chat.router as route

    async def never(*args: Any) -> None:
        raise AssertionError("the FastAPI route ran")

    monkeypatch.setattr(route, "create_chat_completion", never)
    reply = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "fast"}])
    assert reply.choices[0].message.content == "echo: fast"
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "fast"}], stream=True
    )
    assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices]) == "echo: fast"


@pytest.mark.parametrize("content_type", [None, "text/plain"])
async def test_a_body_not_sent_as_json_is_400(gw: RunningGateway, content_type: str | None) -> None:
    headers = {"authorization": f"Bearer {KEY}"}
    if content_type:
        headers["content-type"] = content_type
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}).encode()
    async with httpx.AsyncClient(base_url=gw.url) as http:
        reply = await http.post("/v1/chat/completions", content=body, headers=headers)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["type"] == "invalid_request_error"
