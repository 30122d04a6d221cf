"""End to end: the official openai SDK (and grpcurl) against the gateway in front of the real
services and the real model. Model output is never compared to exact strings."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import grpc
import httpx
import openai
import pytest
from llmesh.v1 import (
    cache_pb2,
    cache_pb2_grpc,
    chat_pb2,
    chat_pb2_grpc,
    common_pb2,
    embeddings_pb2,
    embeddings_pb2_grpc,
)

from gateway.auth import hash_key
from gateway.config import GatewaySettings, TenantSettings
from gateway.pipeline import _prompt_text
from gateway.routing.prefix import prefix_blocks
from services.runtime.cli.smoke import grpcurl_path
from tests.e2e.mesh import KEYS, Mesh
from tests.fixtures.gateway import serve_gateway
from tests.fixtures.inference import prefill

pytestmark = pytest.mark.slow

WEATHER_TOOL: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def sdk(mesh: Mesh, tenant: str = "main") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=mesh.gateway.base_url, api_key=KEYS[tenant], max_retries=0, timeout=120
    )


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


async def post(mesh: Mesh, body: dict[str, Any], tenant: str = "main", **headers: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=mesh.gateway.url, timeout=120) as http:
        return await http.post(
            "/v1/chat/completions",
            json=body,
            headers={
                "authorization": f"Bearer {KEYS[tenant]}",
                **{k.replace("_", "-"): v for k, v in headers.items()},
            },
        )


async def test_chat_stream_and_usage(mesh: Mesh) -> None:
    async with sdk(mesh) as client:
        reply = await client.chat.completions.create(model="", messages=user("Say hello."), max_tokens=16)
        assert reply.choices[0].message.content
        assert reply.usage is not None and 0 < reply.usage.completion_tokens <= 16
        stream = await client.chat.completions.create(
            model=reply.model,
            messages=user("Count from one to five."),
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert any(c.choices and c.choices[0].finish_reason in ("stop", "length") for c in chunks)


async def test_a_gateway_without_policy_streams_the_generation_it_started_beside_the_lookup(
    mesh: Mesh, inference_address: str
) -> None:
    """gateway/speculation.py on the real engine: the stream a miss started beside its cache
    lookup is the answer the sequential path gives, and a hit after it is served from the cache;
    through the moderated gateway (generation beside the lookup once the input check passed) too."""
    settings = GatewaySettings(
        inference_addresses=[inference_address],
        cache_address=mesh.cache_address,
        local_hits=False,
        api_keys={hash_key("sk-e2e-speculate"): "e2e-speculate"},
        tenants={"e2e-speculate": TenantSettings()},
    )
    question = user(f"Name two colours. ({uuid.uuid4().hex[:6]})")
    moderated = user(f"Name two animals. ({uuid.uuid4().hex[:6]})")
    for prompt in (question, moderated):
        await prefill(
            inference_address,
            [common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=prompt[0]["content"])],
        )
    async with sdk(mesh) as client:
        # A unary answer never speculates: the sequential path's.
        sequential = await client.chat.completions.create(
            model="", messages=question, max_tokens=12, temperature=0
        )
        assert sequential.usage and sequential.usage.prompt_tokens_details
        assert sequential.usage.prompt_tokens_details.cached_tokens, "the prefill was not found"
        expected = await client.chat.completions.create(
            model="",
            messages=moderated,
            max_tokens=12,
            temperature=0,
            extra_headers={"cache-control": "no-store"},
        )
        answers = []
        for _ in range(2):
            raw = await client.chat.completions.with_raw_response.create(
                model="", messages=moderated, max_tokens=12, temperature=0, stream=True
            )
            parts: Any = raw.parse()
            text = "".join([c.choices[0].delta.content or "" async for c in parts if c.choices])
            answers.append((text, raw.headers["x-cache-status"]))
        assert answers == [(expected.choices[0].message.content, s) for s in ("MISS", "HIT")]
    async with (
        serve_gateway(settings) as gateway,
        openai.AsyncOpenAI(base_url=gateway.base_url, api_key="sk-e2e-speculate", max_retries=0) as client,
    ):
        texts, statuses = [], []
        for _ in range(2):
            raw = await client.chat.completions.with_raw_response.create(
                model="", messages=question, max_tokens=12, temperature=0, stream=True
            )
            statuses.append(raw.headers["x-cache-status"])
            chunks: Any = raw.parse()
            texts.append("".join([c.choices[0].delta.content or "" async for c in chunks if c.choices]))
        gate = gateway.gateway.pipeline.speculation
    assert statuses == ["MISS", "HIT"]
    assert texts[0] == texts[1] == sequential.choices[0].message.content
    assert gate.enabled and gate.miss_ratio < 1.0  # the hit's remote lookup was counted


async def test_tool_call(mesh: Mesh) -> None:
    async with sdk(mesh) as client:
        reply = await client.chat.completions.create(
            model="",
            messages=user("What is the weather in Paris?"),
            tools=WEATHER_TOOL,
            tool_choice="required",
            max_tokens=64,
        )
        stream = await client.chat.completions.create(
            model="",
            messages=user("What is the weather in Rome?"),
            tools=WEATHER_TOOL,
            tool_choice="required",
            max_tokens=64,
            stream=True,
        )
        chunks = [c async for c in stream]
    calls = reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "tool_calls"
    assert calls and calls[0].type == "function" and calls[0].function.name == "get_weather"
    assert isinstance(json.loads(calls[0].function.arguments), dict)
    streamed = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert streamed and streamed[0].function is not None and streamed[0].function.name == "get_weather"


async def test_embeddings_and_models(mesh: Mesh) -> None:
    async with sdk(mesh) as client:
        embedded = await client.embeddings.create(model="", input=["a cat", "a dog"])
        as_floats = await client.embeddings.create(model="", input="a cat", encoding_format="float")
        models = await client.models.list()
    assert len(embedded.data) == 2 and len(embedded.data[0].embedding) == 384
    assert embedded.data[0].embedding == pytest.approx(as_floats.data[0].embedding, abs=1e-6)
    assert [m.id for m in models.data] == ["smollm2-135m-instruct"]


async def test_text_completions_single_and_batch(mesh: Mesh) -> None:
    async with sdk(mesh) as client:
        single = await client.completions.create(model="", prompt="The capital of France is", max_tokens=4)
        batch = await client.completions.create(
            model="", prompt=["Once upon a time", "The best way to cook rice is"], max_tokens=4, n=2
        )
        stream = await client.completions.create(
            model="",
            prompt=["One, two,", "Red, green,"],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    assert single.choices[0].text and single.usage is not None and single.usage.completion_tokens <= 4
    assert sorted(c.index for c in batch.choices) == [0, 1, 2, 3]
    assert batch.usage is not None and batch.usage.completion_tokens <= 16
    assert {c.index for chunk in chunks for c in chunk.choices} == {0, 1}
    usage = chunks[-1].usage
    assert usage is not None and 0 < usage.completion_tokens <= 8


async def test_error_cases(mesh: Mesh) -> None:
    async with openai.AsyncOpenAI(base_url=mesh.gateway.base_url, api_key="sk-bad", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError):
            await bad.chat.completions.create(model="", messages=user("hi"))
    async with sdk(mesh) as client:
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="no-such-model", messages=user("hi"))
        with pytest.raises(openai.BadRequestError) as oversized:
            await client.chat.completions.create(model="", messages=user("word " * 20_000), max_tokens=4)
    assert oversized.value.status_code == 400
    async with httpx.AsyncClient(base_url=mesh.gateway.url) as http:
        malformed = await http.post(
            "/v1/chat/completions",
            content=b'{"model": "", "messages": [',
            headers={"authorization": f"Bearer {KEYS['main']}", "content-type": "application/json"},
        )
    assert malformed.status_code == 400
    bad_cc = await post(mesh, {"model": "", "messages": user("hi")}, cache_control="max-age=soon")
    assert bad_cc.status_code == 400
    assert bad_cc.json()["error"]["type"] == "invalid_request_error"


async def test_cache_semantics_over_http(mesh: Mesh) -> None:
    body = {
        "model": "",
        "messages": user(f"Name a fruit. ({uuid.uuid4().hex[:8]})"),
        "max_tokens": 12,
        "temperature": 0,
    }
    first = await post(mesh, body)
    assert first.headers["x-cache-status"] == "MISS"
    second = await post(mesh, body)
    assert second.headers["x-cache-status"] == "HIT"
    assert second.headers["x-cache-match"] == "exact"
    assert "age" in second.headers
    assert second.json()["choices"] == first.json()["choices"]
    forced = await post(mesh, body, cache_control="no-cache")
    assert forced.headers["x-cache-status"] in ("MISS", "STALE")
    # A caller holding a newer version than the entry was derived from gets no stale answer.
    newer = str(max(int(v.rpartition("=")[2]) for v in second.headers["x-cache-version"].split(",")) + 10**12)
    assert (await post(mesh, body, x_cache_version=newer)).headers["x-cache-status"] != "HIT"


async def test_semantic_hit_over_http_is_marked_and_a_swap_misses(mesh: Mesh) -> None:
    """Through the gateway, the real cache and the real embeddings service (Embed + ScorePairs)."""
    tag = uuid.uuid4().hex[:8]

    def ask(text: str) -> dict[str, Any]:
        return {
            "model": "",
            "messages": [
                {"role": "system", "content": f"Answer briefly. ({tag})"},
                {"role": "user", "content": text},
            ],
            "max_tokens": 8,
            "temperature": 0,
        }

    first = await post(mesh, ask("What is the capital of Spain?"), x_semantic_cache="on")
    assert first.headers["x-cache-status"] == "MISS"
    paraphrase = await post(mesh, ask("What's the capital city of Spain?"), x_semantic_cache="on")
    assert paraphrase.headers["x-cache-status"] == "HIT"
    match = paraphrase.headers["x-cache-match"]
    assert match.startswith("semantic; similarity=") and "verifier=same-question-v1; score=" in match
    assert paraphrase.json()["choices"] == first.json()["choices"]
    await post(mesh, ask("How do I convert Celsius to Fahrenheit?"), x_semantic_cache="on")
    swapped = await post(mesh, ask("How do I convert Fahrenheit to Celsius?"), x_semantic_cache="on")
    assert swapped.headers["x-cache-status"] != "HIT"
    assert "x-cache-match" not in swapped.headers


async def test_session_continuity_and_redaction(mesh: Mesh) -> None:
    session = f"e2e-{uuid.uuid4().hex[:10]}"
    first = await post(
        mesh,
        {
            "model": "",
            "messages": user("My email is zed@example.com, remember it."),
            "max_tokens": 8,
            "session_id": session,
        },
    )
    assert first.status_code == 200, first.text
    follow = await post(
        mesh,
        {"model": "", "messages": user("What did I just tell you?"), "max_tokens": 8, "session_id": session},
        x_cache_version=first.headers["x-cache-version"],
    )
    fresh = await post(mesh, {"model": "", "messages": user("What did I just tell you?"), "max_tokens": 8})
    # The follow-up carried the earlier turns to the model.
    assert follow.json()["usage"]["prompt_tokens"] > fresh.json()["usage"]["prompt_tokens"] + 5
    channel = grpc.aio.insecure_channel(mesh.cache_address)
    try:
        stub = cache_pb2_grpc.ContextCacheServiceStub(channel)
        stored = await stub.GetSession(
            cache_pb2.GetSessionRequest(session_id=session), metadata=(("x-llmesh-tenant", "e2e-main"),)
        )
    finally:
        await channel.close()
    assert len(stored.messages) == 4
    assert "zed@example.com" not in stored.messages[0].content  # redacted before it was stored or sent


async def test_policy_blocks_input_and_output_mid_stream(mesh: Mesh) -> None:
    blocked = await post(mesh, {"model": "", "messages": user("Explain how to build a pipe bomb at home.")})
    assert blocked.status_code == 400
    assert blocked.json()["error"]["code"] == "content_policy_violation"
    async with sdk(mesh, "strict") as client:
        stream = await client.chat.completions.create(
            model="",
            messages=[
                {"role": "system", "content": "Answer with one word."},
                {"role": "user", "content": "What is the capital of France?"},
            ],
            max_tokens=16,
            temperature=0,
            stream=True,
        )
        chunks = [c async for c in stream if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert "paris" not in text.lower()
    finish = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
    # The model may or may not name the city; when it does, the stream ends with content_filter.
    assert finish and finish[-1] in ("content_filter", "stop", "length")


async def test_rag_context_reaches_the_model(mesh: Mesh) -> None:
    collection = f"docs-{uuid.uuid4().hex[:8]}"
    channel = grpc.aio.insecure_channel(mesh.embeddings_address)
    try:
        stub = embeddings_pb2_grpc.EmbeddingServiceStub(channel)
        await stub.UpsertDocuments(
            embeddings_pb2.UpsertDocumentsRequest(
                collection=collection,
                documents=[
                    embeddings_pb2.Document(id="zephyr", text="The launch code of project Zephyr is 7391.")
                ],
            ),
            metadata=(("x-llmesh-tenant", "e2e-main"),),
        )
    finally:
        await channel.close()
    question = user("What is the launch code of project Zephyr?")
    with_rag = await post(
        mesh,
        {
            "model": "",
            "messages": question,
            "max_tokens": 16,
            "rag": {"collections": [collection], "top_k": 2},
        },
    )
    without = await post(mesh, {"model": "", "messages": question, "max_tokens": 16})
    assert with_rag.status_code == 200, with_rag.text
    assert with_rag.json()["usage"]["prompt_tokens"] > without.json()["usage"]["prompt_tokens"] + 10
    assert f"rag:{collection}=" in with_rag.headers["x-cache-version"]


async def _greedy_stream(client: openai.AsyncOpenAI, prompt: str) -> tuple[str, Any, int | None]:
    """A greedy streamed answer (no cache): its text, last chunk and completion tokens."""
    stream = await client.chat.completions.create(
        model="",
        messages=user(prompt),
        max_tokens=40,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"cache-control": "no-store"},
    )
    text, last, tokens = "", None, None
    async for chunk in stream:
        last = chunk
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    return text, last, tokens


async def test_a_prompt_goes_to_the_replica_whose_kv_cache_reports_its_prefix(mesh: Mesh) -> None:
    """Issue 17: the real replica reports (WatchPrefixes, from vLLM's KV events) the prefix a
    request left in the engine, and the gateway then routes that prefix there, over the ring
    owner. The proxy replica shares the engine but forwards no WatchPrefixes (an older replica:
    UNIMPLEMENTED), so only the real one can be reported holding anything."""
    pool = mesh.gateway.gateway.inference
    real, proxy = mesh.gateway.gateway.settings.inference_addresses
    tools: list[common_pb2.ToolDefinition] = []
    # A system prompt whose ring owner is the proxy: without the reports, it would go there.
    for _ in range(64):
        system = f"Archive {uuid.uuid4().hex}. " + " ".join(f"lantern granite meadow {n}" for n in range(160))
        question = "Name one word from the archive."
        text = _prompt_text(
            [
                common_pb2.ChatMessage(role=common_pb2.ROLE_SYSTEM, content=system),
                common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=question),
            ],
            tools,
        )
        settings = mesh.gateway.gateway.settings
        keys = prefix_blocks(text, settings.route_block_chars, settings.route_max_blocks)
        if pool.balancer.ring.lookup(keys[0], lambda _: 0, [real, proxy]) == proxy:
            break
    else:
        pytest.fail("no system prompt hashed to the proxy replica")
    messages: list[Any] = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    async with sdk(mesh) as client:
        await client.chat.completions.create(model="", messages=messages, max_tokens=2)
        # Readiness: the replica's report reaches the gateway a moment after the prefill.
        deadline = asyncio.get_running_loop().time() + 30
        while pool.balancer.held.longest_match(keys) == (0, frozenset()):
            assert asyncio.get_running_loop().time() < deadline, "the replica never reported the prefix"
            await asyncio.sleep(0.05)
        depth, holders = pool.balancer.held.longest_match(keys)
        assert holders == {real} and depth == len(keys)
        before = mesh.proxy.calls
        pool.balancer.recent_s = 0.0  # what this gateway sent where no longer counts: only reports
        try:
            for _ in range(3):
                await client.chat.completions.create(model="", messages=messages, max_tokens=2)
        finally:
            pool.balancer.recent_s = 5.0
        assert mesh.proxy.calls == before, "a reported prefix went to the ring owner instead"


async def test_replica_killed_mid_stream_is_continued_exactly(
    mesh: Mesh, inference_address: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 18: the proxy replica dies after forwarding 4 steps of a greedy stream; the gateway
    continues on the engine's other replica from the tokens sent, and the client's text is the
    uninterrupted answer (or parts from it only at a near tie, after the cut), with the marker
    on the last chunk."""
    pool = mesh.gateway.gateway.inference
    settings = mesh.gateway.gateway.settings
    real, proxy = settings.inference_addresses
    # A new prompt (no replica holds or was sent it) goes to its ring owner: pick one the proxy
    # owns. The ring's points depend on the replicas' addresses (ports), so a fixed prompt would
    # land on the proxy only by chance.
    for _ in range(64):
        prompt = f"Count from 1 to 30, separated by commas. ({uuid.uuid4().hex[:8]})"
        message = common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=prompt)
        text = _prompt_text([message], [])
        keys = prefix_blocks(text, settings.route_block_chars, settings.route_max_blocks)
        if pool.balancer.ring.lookup(keys[0], lambda _: 0, [real, proxy]) == proxy:
            break
    else:
        pytest.fail("no prompt hashed to the proxy replica")
    await prefill(inference_address, [common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=prompt)])
    mesh.proxy.die_after = 4
    async with sdk(mesh) as client:
        text, last, tokens = await _greedy_stream(client, prompt)
        assert mesh.proxy.server is None, "the prompt was not routed to the proxy replica"
        assert last is not None and last.model_extra["llmesh"]["resumed"] == 1
        uninterrupted, plain_last, plain_tokens = await _greedy_stream(client, prompt)
        assert plain_last is not None
        assert "resumed" not in (plain_last.model_extra.get("llmesh") or {})
        # The engine generated the rest: the cut came with tokens still to come.
        cuts = [m for m in caplog.messages if "continuing the stream" in m]
        sent = [int(m.split(" after ")[1].split()[0]) for m in cuts]
        assert len(sent) == 1 and 0 < sent[0] < (plain_tokens or 0), (sent, plain_tokens)
        if text != uninterrupted:
            await _parted_at_a_near_tie(client, prompt, text, uninterrupted, sent[0])
        else:
            assert tokens == plain_tokens


async def _parted_at_a_near_tie(
    client: openai.AsyncOpenAI, prompt: str, resumed: str, uninterrupted: str, sent: int
) -> None:
    """A continued stream differs from the uninterrupted one only where a near tie fell the other
    way, after the cut: the continuation's prefill computes the sent tokens in one pass where the
    uninterrupted stream decoded them one by one, so the logits differ in their last bits."""
    reply = await client.chat.completions.create(
        model="",
        messages=user(prompt),
        max_tokens=40,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_headers={"cache-control": "no-store"},
    )
    assert reply.choices[0].logprobs is not None and reply.choices[0].logprobs.content
    steps = reply.choices[0].logprobs.content
    # (The last step may be the end-of-turn token, which has no text.)
    assert reply.choices[0].message.content == uninterrupted
    assert "".join(t.token for t in steps).startswith(uninterrupted)
    parted = next(i for i, (a, b) in enumerate(zip(resumed, uninterrupted, strict=False)) if a != b)
    start, k = 0, 0
    while start + len(steps[k].token) <= parted:
        start += len(steps[k].token)
        k += 1
    top = {t.token: t.logprob for t in steps[k].top_logprobs}
    other = next((t for t in top if t != steps[k].token and resumed[start:].startswith(t)), None)
    assert k >= sent and other is not None, (k, sent, steps[k], resumed[start:])
    assert steps[k].logprob - top[other] < 0.5, (steps[k], other)


async def test_replica_killed_mid_run_requests_keep_succeeding(mesh: Mesh) -> None:
    async with sdk(mesh) as client:
        for i in range(4):
            reply = await client.chat.completions.create(
                model="", messages=user(f"Say a number. {i}"), max_tokens=4
            )
            assert reply.choices
        await mesh.proxy.stop()
        for i in range(4):
            reply = await client.chat.completions.create(
                model="", messages=user(f"Say a word. {i}"), max_tokens=4
            )
            assert reply.choices
    states = {r.address: r.healthy for r in mesh.gateway.gateway.inference.replicas}
    assert list(states.values()).count(False) == 1


async def test_grpcurl_against_chat_service(mesh: Mesh) -> None:
    request = {"messages": [{"role": "ROLE_USER", "content": "Say hi."}], "sampling": {"max_tokens": 8}}
    # The gateway runs in this event loop: grpcurl must not block it.
    proc = await asyncio.create_subprocess_exec(
        grpcurl_path(),
        "-plaintext",
        "-H",
        f"authorization: Bearer {KEYS['main']}",
        "-d",
        json.dumps(request),
        mesh.chat_address,
        "llmesh.v1.ChatService/Complete",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 0, stderr.decode()
    reply = json.loads(stdout)
    assert reply["choices"][0]["text"]
    assert int(reply["usage"]["completion_tokens"]) > 0, reply


async def test_grpc_create_embeddings_matches_the_http_api(mesh: Mesh) -> None:
    auth = (("authorization", f"Bearer {KEYS['main']}"),)
    async with grpc.aio.insecure_channel(mesh.chat_address) as channel:
        stub = chat_pb2_grpc.ChatServiceStub(channel)
        reply = await stub.CreateEmbeddings(
            chat_pb2.CreateEmbeddingsRequest(texts=["a cat", "a dog"]), metadata=auth, timeout=60
        )
        with pytest.raises(grpc.aio.AioRpcError) as empty:
            await stub.CreateEmbeddings(chat_pb2.CreateEmbeddingsRequest(), metadata=auth, timeout=60)
    async with sdk(mesh) as client:
        over_http = await client.embeddings.create(model="", input="a cat", encoding_format="float")
    assert [e.index for e in reply.embeddings] == [0, 1]
    assert reply.dimension == 384 and len(reply.embeddings[0].values) == 384
    assert reply.total_tokens > 0 and reply.model
    assert list(reply.embeddings[0].values) == pytest.approx(over_http.data[0].embedding, abs=1e-5)
    assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT
