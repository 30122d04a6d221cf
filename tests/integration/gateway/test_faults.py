"""Upstreams that stop answering, on real processes: a SIGSTOPped cache service, a
SIGSTOPped inference replica, a replica killed mid-stream (RELIABILITY.md findings 1-3), and a
stream continued on another replica after its replica was killed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from gateway.auth import hash_key
from gateway.config import GatewaySettings
from gateway.upstream_inference import GONE_MID_STREAM
from tests.fixtures.fake_inference import MODEL, FakeInference, start_fake
from tests.fixtures.gateway import serve_gateway
from tests.fixtures.processes import ServiceProcess, service_env

KEY = "sk-faults"
HEADERS = {"authorization": f"Bearer {KEY}"}


def _replica(**env: str) -> ServiceProcess:
    return ServiceProcess("tests.fixtures.fake_inference", service_env("LLMESH_", **env))


@pytest.fixture
def cache_process(redis_url: str) -> Iterator[ServiceProcess]:
    proc = ServiceProcess(
        "cache",
        service_env("LLMESH_CACHE_", REDIS_URL=redis_url, LLMESH_CACHE_SEMANTIC_ENABLED="false"),
    )
    try:
        yield proc
    finally:
        os.kill(proc.proc.pid, signal.SIGCONT)
        proc.close()


async def _stream(http: httpx.AsyncClient, body: dict[str, object]) -> list[str]:
    """The SSE lines of one streamed chat completion."""
    lines: list[str] = []
    async with http.stream(
        "POST", "/v1/chat/completions", json={**body, "stream": True}, headers=HEADERS
    ) as reply:
        assert reply.status_code == 200
        async for line in reply.aiter_lines():
            if line:
                lines.append(line)
    return lines


async def test_frozen_cache_costs_a_stream_its_cache_not_its_deadline(cache_process: ServiceProcess) -> None:
    fake = FakeInference("r1")
    server = await start_fake(fake)
    settings = GatewaySettings(
        inference_addresses=[server.address],
        cache_address=cache_process.address,
        api_keys={hash_key(KEY): "t-frozen-cache"},
        request_timeout_s=120,
    )
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "a b c"}],
        "session_id": "s1",
        "temperature": 0,  # cacheable: MISS / HIT when the cache answers, BYPASS only when it does not
    }
    try:
        async with serve_gateway(settings) as gw, httpx.AsyncClient(base_url=gw.url, timeout=120) as http:
            lines = await _stream(http, body)
            assert any("x-cache-status=MISS" in line for line in lines), lines
            os.kill(cache_process.proc.pid, signal.SIGSTOP)
            try:
                lines = await _stream(http, body)
            finally:
                os.kill(cache_process.proc.pid, signal.SIGCONT)
            # Every token, the end of the stream, no error: only the cache was given up on.
            assert not any('"error"' in line for line in lines), lines
            assert any("x-cache-status=BYPASS" in line for line in lines), lines
            assert lines[-1] == "data: [DONE]"
            text = "".join(line for line in lines if '"content"' in line)
            for word in ("echo:", "a", "b", "c"):
                assert word in text
            # The cache is back: served with it again.
            lines = await _stream(http, body)
            assert any("x-cache-status=MISS" in line for line in lines), lines
    finally:
        await server.stop(0)


async def test_frozen_replica_leaves_the_ring_and_requests_go_elsewhere() -> None:
    frozen, other = _replica(FAKE_NAME="frozen"), _replica(FAKE_NAME="other")
    settings = GatewaySettings(
        inference_addresses=[frozen.address, other.address],
        api_keys={hash_key(KEY): "t-frozen-replica"},
        route_policy="round_robin",
        inference_probe_interval_s=0.2,
        inference_probe_timeout_s=0.5,
        first_token_cold_s=1.0,
        request_timeout_s=120,
    )
    try:
        async with serve_gateway(settings) as gw, httpx.AsyncClient(base_url=gw.url, timeout=120) as http:
            pool = gw.gateway.inference
            victim = pool.balancer.replicas[frozen.address]
            assert victim.healthy
            os.kill(frozen.proc.pid, signal.SIGSTOP)
            # Streams and unary requests started while it is frozen (round robin sends every
            # other one to it until it leaves the ring) are all served by the other replica.
            for i in range(4):
                body: dict[str, object] = {"model": MODEL, "messages": [{"role": "user", "content": f"q{i}"}]}
                lines = await _stream(http, body)
                assert not any('"error"' in line for line in lines), lines
                assert lines[-1] == "data: [DONE]"
                reply = await http.post("/v1/chat/completions", json=body, headers=HEADERS)
                assert reply.status_code == 200, reply.text
                assert reply.json()["choices"][0]["message"]["content"] == f"echo: q{i}"
            assert not victim.healthy
            assert victim.served == 0
    finally:
        os.kill(frozen.proc.pid, signal.SIGCONT)
        frozen.close()
        other.close()


async def test_replica_killed_mid_stream_ends_it_with_a_clear_error() -> None:
    replica = _replica(FAKE_NAME="doomed", FAKE_HOLD="1")
    settings = GatewaySettings(
        inference_addresses=[replica.address], api_keys={hash_key(KEY): "t-killed"}, request_timeout_s=120
    )
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a b c d"}], "stream": True}
    try:
        async with (
            serve_gateway(settings) as gw,
            httpx.AsyncClient(base_url=gw.url, timeout=120) as http,
            http.stream("POST", "/v1/chat/completions", json=body, headers=HEADERS) as reply,
        ):
            assert reply.status_code == 200
            lines: list[str] = []
            async for line in reply.aiter_lines():
                if not line:
                    continue
                lines.append(line)
                if "echo:" in line:  # the first word: the replica holds the stream now
                    replica.proc.kill()
            errors = [line for line in lines if '"error"' in line]
            assert len(errors) == 1, lines
            assert GONE_MID_STREAM in errors[0]
            assert '"service_unavailable"' in errors[0]
            assert "Socket closed" not in errors[0]
            assert lines[-1] == "data: [DONE]"
    finally:
        replica.close()


async def _kill_mid_stream(
    http: httpx.AsyncClient, body: dict[str, object], held: ServiceProcess, victim: Any
) -> tuple[list[str], bool]:
    """One stream (round robin): kills ``held`` once it holds the stream after its first word.

    Returns the SSE lines and whether the kill happened (False: the other replica served it).
    """
    lines: list[str] = []
    killed = False
    async with http.stream("POST", "/v1/chat/completions", json=body, headers=HEADERS) as reply:
        assert reply.status_code == 200
        async for line in reply.aiter_lines():
            if not line:
                continue
            lines.append(line)
            if not killed and "echo:" in line and victim.inflight == 1:
                held.proc.kill()  # kill -9 while it holds the stream after its first word
                killed = True
    return lines, killed


@contextlib.asynccontextmanager
async def _doomed_stream(
    body: dict[str, object], tenant: str
) -> AsyncIterator[tuple[list[str], httpx.AsyncClient]]:
    """Two replicas, one holding its streams after the first word; a stream of ``body`` that
    landed there (round robin: the first or the second) with that replica killed mid-stream.
    Yields the stream's SSE lines and a client of the same gateway."""
    doomed, other = _replica(FAKE_NAME="doomed", FAKE_HOLD="1"), _replica(FAKE_NAME="other")
    settings = GatewaySettings(
        inference_addresses=[doomed.address, other.address],
        api_keys={hash_key(KEY): tenant},
        route_policy="round_robin",
        request_timeout_s=120,
    )
    try:
        async with serve_gateway(settings) as gw, httpx.AsyncClient(base_url=gw.url, timeout=120) as http:
            victim = gw.gateway.inference.balancer.replicas[doomed.address]
            for _ in range(2):
                lines, killed = await _kill_mid_stream(http, body, doomed, victim)
                if killed:
                    break
            assert killed
            yield lines, http
    finally:
        doomed.close()
        other.close()


async def test_replica_killed_mid_stream_is_continued_on_another() -> None:
    """Resume (issue 18): the words sent stay, the rest comes from the other replica, one stream."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "a b c d"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with _doomed_stream(body, "t-resumed") as (lines, http):
        assert not any('"error"' in line for line in lines), lines
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: {")]
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        assert text == "echo: a b c d"  # each word once, in order
        finals = [c for c in chunks if not c["choices"]]
        assert finals[-1]["llmesh"]["resumed"] == 1
        assert finals[-1]["usage"]["completion_tokens"] == 5
        assert any("x-llmesh-resumed=1" in line for line in lines if line.startswith(":"))
        # The next stream is an ordinary one: no marker.
        plain = await _stream(http, {"model": MODEL, "messages": [{"role": "user", "content": "e f"}]})
        assert not any("resumed" in line for line in plain), plain


async def test_a_stream_that_cannot_be_continued_ends_with_a_clear_error() -> None:
    """n = 2 choices cannot be resumed from one token list: the old clear error, not a mix."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a b c d"}], "stream": True, "n": 2}
    async with _doomed_stream(body, "t-not-resumed") as (lines, _):
        errors = [line for line in lines if '"error"' in line]
        assert len(errors) == 1 and GONE_MID_STREAM in errors[0], lines
        assert lines[-1] == "data: [DONE]"
