"""Gateway drain on SIGTERM, as a balancer sees it: /readyz turns 503 at once, requests that still
arrive are served, and once they stop the process exits 0."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator

import httpx
import pytest

from services.runtime.server import RunningServer
from tests.fixtures.fake_inference import MODEL, FakeInference, start_fake
from tests.fixtures.ports import free_port
from tests.fixtures.processes import ServiceProcess, service_env


@pytest.fixture
async def replica() -> AsyncIterator[RunningServer]:
    server = await start_fake(FakeInference("r1"))  # in this process; the gateway is its own
    yield server
    await server.stop(0)


async def test_sigterm_turns_readyz_503_first_and_serves_what_still_arrives(replica: RunningServer) -> None:
    http_port = free_port()
    gateway = ServiceProcess(
        "gateway",
        service_env(
            "LLMESH_GATEWAY_",
            LLMESH_GATEWAY_INFERENCE_ADDRESSES=replica.address,
            LLMESH_GATEWAY_HTTP_PORT=str(http_port),
            # Long enough that the request below lands inside the quiet period on any machine.
            LLMESH_GATEWAY_DRAIN_QUIET_S="8",
            LLMESH_GATEWAY_DRAIN_DELAY_S="60",
        ),
    )
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a b c"}]}
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}", timeout=30) as http:
            for _ in range(500):  # ready once its health watch has seen the replica serve
                if (await http.get("/readyz")).status_code == 200:
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("the gateway never became ready")
            gateway.proc.send_signal(signal.SIGTERM)
            for _ in range(500):
                reply = await http.get("/readyz")
                if reply.status_code == 503:
                    break
                await asyncio.sleep(0.02)  # the signal's arrival has no event to wait on
            assert reply.status_code == 503 and reply.json()["status"] == "draining"
            # Not ready, still serving: a request a balancer sent before it noticed succeeds.
            answer = await http.post("/v1/chat/completions", json=body)
            assert answer.status_code == 200, answer.text
        assert await asyncio.to_thread(gateway.proc.wait, 60) == 0
    finally:
        gateway.close()
