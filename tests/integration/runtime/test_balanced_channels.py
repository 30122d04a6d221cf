"""A channel over several instances: round robin, client-side health checking, a drain loses no call.

Real gRPC servers (``build_server``) and real policy service processes on port 0,
one channel from ``services.runtime.channels.connect`` over a list of addresses.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import urllib.request
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest
from llmesh.v1 import common_pb2, policy_pb2, policy_pb2_grpc

from services.runtime.channels import connect
from services.runtime.server import RunningServer, build_server
from services.runtime.settings import ServiceSettings
from tests.fixtures.ports import free_port
from tests.fixtures.processes import ServiceProcess, service_env
from tests.integration.runtime.chain import CALL, SERVICE, ChainServicer

POLICY = policy_pb2.DESCRIPTOR.services_by_name["PolicyService"].full_name


def _identity(b: bytes) -> bytes:
    return b


@pytest.fixture
async def chains() -> AsyncIterator[list[RunningServer]]:
    servers = [
        await build_server(ServiceSettings(port=0), [ChainServicer(hop, None).binding()]) for hop in (1, 2)
    ]
    yield servers
    for server in servers:
        await server.stop(0)


async def _hops(channel: grpc.aio.Channel, calls: int) -> Counter[int]:
    call = channel.unary_unary(CALL, _identity, _identity)
    seen: Counter[int] = Counter()
    for _ in range(calls):
        seen[json.loads(await call(b"{}", timeout=5))["views"][0]["hop"]] += 1
    return seen


async def _until_hops(channel: grpc.aio.Channel, want: set[int], limit: int = 2000) -> Counter[int]:
    """Calls until a run of 20 calls reaches exactly ``want`` (health updates arrive on a stream)."""
    for _ in range(limit // 20):
        seen = await _hops(channel, 20)
        if set(seen) == want:
            return seen
    raise AssertionError(f"calls never reached exactly {want}")


async def test_list_balances_and_skips_an_instance_that_is_not_serving(
    chains: list[RunningServer],
) -> None:
    address = ",".join(s.address for s in chains)
    async with await connect(address, health_service=SERVICE) as channel:
        both = await _until_hops(channel, {1, 2})
        assert min(both.values()) >= 5  # round robin, not pick-first
        await chains[0].set_serving(False)
        assert await _until_hops(channel, {2}) == Counter({2: 20})
        # Once seen NOT_SERVING, the instance gets nothing.
        assert await _hops(channel, 50) == Counter({2: 50})
        await chains[0].set_serving(True)
        await _until_hops(channel, {1, 2})


async def test_a_list_of_instances_that_all_stopped_serving_fails_fast(chains: list[RunningServer]) -> None:
    address = ",".join(s.address for s in chains)
    async with await connect(address, health_service=SERVICE) as channel:
        await _until_hops(channel, {1, 2})
        for server in chains:
            await server.set_serving(False)
        call = channel.unary_unary(CALL, _identity, _identity)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            for _ in range(200):  # until both health streams said NOT_SERVING
                await call(b"{}", timeout=5)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE


def _handled(metrics_port: int) -> float:
    """CheckInput calls an instance completed, from its own /metrics."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("llmesh_rpc_server_handled_total") and 'method="CheckInput"' in line
    )


@pytest.fixture
def policies(redis_url: str) -> Iterator[list[tuple[ServiceProcess, int]]]:
    started: list[tuple[ServiceProcess, int]] = []
    try:
        for _ in range(2):
            metrics = free_port()
            env = service_env(
                "LLMESH_POLICY_",
                LLMESH_POLICY_REDIS_URL=redis_url,
                LLMESH_POLICY_METRICS_PORT=str(metrics),
                LLMESH_POLICY_GRACE_SECONDS="10",
                LLMESH_POLICY_SHARED_RULESET_KEY=f"llmesh:test-ruleset:{uuid.uuid4().hex[:8]}",
            )
            started.append((ServiceProcess("policy", env), metrics))
        yield started
    finally:
        for proc, _ in started:
            proc.close()


async def test_sigterm_of_one_policy_instance_under_steady_calls_loses_none(
    policies: list[tuple[ServiceProcess, int]],
) -> None:
    (first, first_metrics), (second, second_metrics) = policies
    address = f"{first.address},{second.address}"
    request = policy_pb2.CheckInputRequest(
        messages=[common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content="What is the capital of Italy?")]
    )
    done: list[str] = []
    failures: list[str] = []
    stop = asyncio.Event()
    progressed = asyncio.Event()

    async with await connect(address, health_service=POLICY) as channel:
        stub = policy_pb2_grpc.PolicyServiceStub(channel)

        async def client() -> None:
            while not stop.is_set():
                try:
                    await stub.CheckInput(
                        request, metadata=[("x-llmesh-tenant", "acme")], timeout=10, wait_for_ready=False
                    )
                    done.append("ok")
                    progressed.set()
                except grpc.aio.AioRpcError as exc:
                    failures.append(f"{exc.code().name}: {exc.details()}")

        clients = [asyncio.create_task(client()) for _ in range(4)]
        try:
            # Both instances take calls before the drain (round robin); metrics have no change
            # event, so they are polled.
            for _ in range(600):
                counts = [await asyncio.to_thread(_handled, p) for p in (first_metrics, second_metrics)]
                if min(counts) >= 20:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"both instances did not take calls: {counts}")
            first.proc.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(first.proc.wait, 30) == 0  # drained and exited by itself
            target = len(done) + 50
            async with asyncio.timeout(60):
                while len(done) < target:  # the clients keep going on the other instance
                    progressed.clear()
                    await progressed.wait()
        finally:
            stop.set()
            with contextlib.suppress(Exception):
                await asyncio.gather(*clients)
    assert failures == []
    assert second.alive()
