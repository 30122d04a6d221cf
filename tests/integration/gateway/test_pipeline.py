"""The pipeline over HTTP with the real cache and policy services: cache consistency headers,
redaction and blocks (input and mid-stream output), sessions, degradation."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import openai
import pytest

from tests.fixtures.fake_inference import MODEL
from tests.fixtures.gateway import RunningGateway, serve_gateway
from tests.integration.gateway.conftest import Tenant, Upstreams, make_settings


def _body(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "temperature": 0, **extra}


async def _post(gw: RunningGateway, tenant: Tenant, body: dict[str, Any], **headers: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
        return await http.post(
            "/v1/chat/completions",
            json=body,
            headers={
                "authorization": f"Bearer {tenant.key}",
                **{k.replace("_", "-"): v for k, v in headers.items()},
            },
        )


async def test_second_identical_request_is_a_hit_with_age(gateway: RunningGateway, tenant: Tenant) -> None:
    body = _body(f"cache me {uuid.uuid4().hex}")
    first = await _post(gateway, tenant, body)
    assert first.status_code == 200, first.text
    assert first.headers["x-cache-status"] == "MISS"
    second = await _post(gateway, tenant, body)
    assert second.headers["x-cache-status"] == "HIT"
    assert int(second.headers["age"]) >= 0
    assert second.json()["choices"] == first.json()["choices"]
    assert "x-cache-version" in second.headers


async def test_stream_hit_replays_the_answer(gateway: RunningGateway, tenant: Tenant) -> None:
    body = _body(f"stream cache {uuid.uuid4().hex}")
    async with openai.AsyncOpenAI(base_url=gateway.base_url, api_key=tenant.key, max_retries=0) as client:
        texts, statuses = [], []
        for _ in range(2):
            raw = await client.chat.completions.with_raw_response.create(**body, stream=True)
            statuses.append(raw.headers["x-cache-status"])
            stream = raw.parse()
            texts.append("".join([c.choices[0].delta.content or "" async for c in stream if c.choices]))
    assert statuses == ["MISS", "HIT"]
    assert texts[0] == texts[1] and texts[0].startswith("echo:")


async def test_no_cache_forces_a_miss(gateway: RunningGateway, tenant: Tenant) -> None:
    body = _body(f"no-cache {uuid.uuid4().hex}")
    await _post(gateway, tenant, body)
    forced = await _post(gateway, tenant, body, cache_control="no-cache")
    assert forced.headers["x-cache-status"] in ("MISS", "STALE")
    assert (await _post(gateway, tenant, body)).headers["x-cache-status"] == "HIT"


async def test_no_store_writes_nothing(gateway: RunningGateway, tenant: Tenant) -> None:
    body = _body(f"no-store {uuid.uuid4().hex}")
    await _post(gateway, tenant, body, cache_control="no-store")
    assert (await _post(gateway, tenant, body)).headers["x-cache-status"] == "MISS"


async def test_uncacheable_sampling_bypasses(gateway: RunningGateway, tenant: Tenant) -> None:
    body = _body(f"sampled {uuid.uuid4().hex}", temperature=0.8)
    reply = await _post(gateway, tenant, body)
    assert reply.headers["x-cache-status"] == "BYPASS"


async def test_session_continuity_and_newer_version_misses(gateway: RunningGateway, tenant: Tenant) -> None:
    session = f"s-{uuid.uuid4().hex[:12]}"
    first = await _post(gateway, tenant, _body("hello one", session_id=session))
    assert first.status_code == 200, first.text
    version = first.headers["x-cache-version"]
    assert f"session:{session}=" in version
    seen = await _post(
        gateway, tenant, _body("what did you see?", session_id=session), x_cache_version=version
    )
    # The model saw the earlier user turn and answer plus the new question.
    assert "turns=3" in seen.json()["choices"][0]["message"]["content"]
    newer = seen.headers["x-cache-version"]
    assert newer != version
    # A plain question cached before the session moved on is not served to a caller
    # holding the newer version: the floor is above what the entry was derived from.
    plain = _body(f"plain {uuid.uuid4().hex}")
    assert (await _post(gateway, tenant, plain)).headers["x-cache-status"] == "MISS"
    assert (await _post(gateway, tenant, plain)).headers["x-cache-status"] == "HIT"
    bumped = str(max(int(v.rpartition("=")[2]) for v in newer.split(",")) + 1_000_000_000)
    assert (await _post(gateway, tenant, plain, x_cache_version=bumped)).headers["x-cache-status"] != "HIT"


async def test_input_pii_is_redacted(gateway: RunningGateway, tenant: Tenant) -> None:
    reply = await _post(gateway, tenant, _body("mail bob@example.com please"))
    text = reply.json()["choices"][0]["message"]["content"]
    assert "bob@example.com" not in text
    assert text.startswith("echo: mail")


async def test_input_block_is_400_with_rule_ids(gateway: RunningGateway, tenant: Tenant) -> None:
    reply = await _post(gateway, tenant, _body("how do I build a pipe bomb at home"))
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["code"] == "content_policy_violation"
    assert "mass-harm-topics" in error["param"]


async def test_output_redacted_mid_stream(gateway: RunningGateway, tenant: Tenant) -> None:
    async with openai.AsyncOpenAI(base_url=gateway.base_url, api_key=tenant.key, max_retries=0) as client:
        stream = await client.chat.completions.create(
            **_body("who to contact?", temperature=0.5), stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert "alice@example.com" not in text
    assert text.startswith("write to")


async def test_output_block_mid_stream_ends_with_content_filter(
    gateway: RunningGateway, tenant: Tenant
) -> None:
    async with openai.AsyncOpenAI(base_url=gateway.base_url, api_key=tenant.key, max_retries=0) as client:
        stream = await client.chat.completions.create(**_body("how to do it?", temperature=0.5), stream=True)
        chunks = [c async for c in stream if c.choices]
        reply = await client.chat.completions.create(**_body("how to do it?", temperature=0.5))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert "pipe bomb" not in text
    assert chunks[-1].choices[0].finish_reason == "content_filter"
    assert reply.choices[0].finish_reason == "content_filter"
    assert "pipe bomb" not in (reply.choices[0].message.content or "")


async def test_cache_down_is_bypass(upstreams: Upstreams, tenant: Tenant) -> None:
    settings = make_settings(upstreams, tenant)
    settings.cache_address = "127.0.0.1:1"  # nothing listens there
    async with serve_gateway(settings) as gw:
        reply = await _post(gw, tenant, _body("still served"))
    assert reply.status_code == 200
    assert reply.headers["x-cache-status"] == "BYPASS"


@pytest.mark.parametrize("fail_open", [False, True])
async def test_policy_down_fails_closed_unless_tenant_opts_out(
    upstreams: Upstreams, tenant: Tenant, fail_open: bool
) -> None:
    settings = make_settings(upstreams, tenant, policy_fail_open=fail_open)
    settings.policy_address = "127.0.0.1:1"
    async with serve_gateway(settings) as gw:
        reply = await _post(gw, tenant, _body("hello"))
    if fail_open:
        assert reply.status_code == 200
    else:
        assert reply.status_code == 503
        assert "retry-after" in reply.headers


async def test_request_rate_limit_is_429_with_retry_after(upstreams: Upstreams, tenant: Tenant) -> None:
    async with serve_gateway(make_settings(upstreams, tenant, requests_per_minute=2)) as gw:
        codes = [(await _post(gw, tenant, _body(f"r{i}"))).status_code for i in range(3)]
        limited = await _post(gw, tenant, _body("again"))
    assert codes == [200, 200, 429]
    assert limited.status_code == 429
    assert int(limited.headers["retry-after"]) >= 1
    assert limited.json()["error"]["code"] == "rate_limit_exceeded"


async def test_token_rate_limit_charges_usage(upstreams: Upstreams, tenant: Tenant) -> None:
    async with serve_gateway(make_settings(upstreams, tenant, tokens_per_minute=5)) as gw:
        first = await _post(gw, tenant, _body("one two three four five six"))
        second = await _post(gw, tenant, _body("more"))
    assert first.status_code == 200
    assert second.status_code == 429
