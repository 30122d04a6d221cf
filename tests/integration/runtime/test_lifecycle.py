"""A service process: grpcurl (health, reflection), `llmesh smoke`, and drain on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.runtime.cli.smoke import grpcurl_path
from tests.fixtures.processes import ROOT, ServiceProcess
from tests.integration.runtime.chain import STREAM


def _identity(b: bytes) -> bytes:
    return b


@pytest.fixture
def service() -> Iterator[ServiceProcess]:
    svc = ServiceProcess("tests.integration.runtime.chain")
    yield svc
    svc.close()


def grpcurl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [grpcurl_path(), "-plaintext", *args], capture_output=True, text=True, timeout=30, check=False
    )


def test_grpcurl_health_list_describe(service: ServiceProcess) -> None:
    listed = grpcurl(service.address, "list")
    assert listed.returncode == 0, listed.stderr
    assert "grpc.health.v1.Health" in listed.stdout.split()
    described = grpcurl(service.address, "describe", "grpc.health.v1.Health")
    assert described.returncode == 0 and "rpc Check" in described.stdout
    health = grpcurl("-d", '{"service": ""}', service.address, "grpc.health.v1.Health/Check")
    assert health.returncode == 0, health.stderr
    assert json.loads(health.stdout)["status"] == "SERVING"


def _smoke(address: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.runtime.cli.main", "smoke", "--address", address, "--timeout", "3"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )


def test_smoke_passes_on_running_and_fails_on_stopped(service: ServiceProcess) -> None:
    ok = _smoke(service.address)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "0 failure(s)" in ok.stdout
    assert service.stop() == 0
    failed = _smoke(service.address)
    assert failed.returncode == 1
    assert "FAIL" in failed.stdout


@pytest.fixture
async def channel(service: ServiceProcess) -> AsyncIterator[grpc.aio.Channel]:
    ch = grpc.aio.insecure_channel(service.address)
    yield ch
    await ch.close()


async def test_sigterm_drains_in_flight_stream(service: ServiceProcess, channel: grpc.aio.Channel) -> None:
    stream = channel.unary_stream(STREAM, _identity, _identity)(
        json.dumps({"count": 8, "interval": 0.15}).encode(), timeout=30
    )
    first = await stream.read()
    assert isinstance(first, bytes)
    received = [json.loads(first)]
    # Watch health on the open connection: NOT_SERVING says the drain has begun.
    watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=30)
    assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
    service.proc.send_signal(signal.SIGTERM)
    assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
    watch.cancel()

    # New calls are refused while the stream goes on (a fresh channel: a new connection). The
    # listener closes right after health flips, so a call may still slip in just before it.
    refused: grpc.aio.AioRpcError | None = None
    deadline = asyncio.get_running_loop().time() + 10
    while refused is None and asyncio.get_running_loop().time() < deadline:
        async with grpc.aio.insecure_channel(service.address) as fresh:
            try:
                await fresh.unary_unary("/llmesh.test.Chain/Call", _identity, _identity)(b"{}", timeout=3)
            except grpc.aio.AioRpcError as exc:
                refused = exc
    assert refused is not None, "new calls were still served 10 s after SIGTERM"
    # Depending on whether the connection raced the listener's close, gRPC reports the
    # refusal as UNAVAILABLE (no connection) or CANCELLED (RPC rejected by the server).
    assert refused.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)

    while True:
        message = await stream.read()
        if message is grpc.aio.EOF:
            break
        assert isinstance(message, bytes)
        received.append(json.loads(message))
    assert [m["i"] for m in received] == list(range(8))
    assert await stream.code() == grpc.StatusCode.OK
    assert await asyncio.to_thread(service.proc.wait, 30) == 0
