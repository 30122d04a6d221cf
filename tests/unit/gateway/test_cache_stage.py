"""CacheStage's per-call bound: a stalled cache is given up on (BYPASS), a slow but live
one (e.g. a single-flight waiter) is waited for. Fakes stand behind the stubs."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import grpc
from grpc_health.v1 import health_pb2
from llmesh.v1 import cache_pb2, cache_pb2_grpc, common_pb2

from gateway.routing.breaker import CircuitBreaker
from gateway.stages.cache import CacheStage
from services.runtime import context as rc


class _Stub:
    """Every RPC waits on ``release`` (never set = a frozen cache), then answers."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.called = asyncio.Event()
        self.calls = 0

    async def _answer(self, reply: Any) -> Any:
        self.calls += 1
        self.called.set()
        await self.release.wait()
        return reply

    def LookupResponse(self, request: Any) -> Any:
        return self._answer(cache_pb2.LookupResponseResponse(status=common_pb2.CACHE_STATUS_MISS))

    def AppendTurns(self, request: Any) -> Any:
        return self._answer(cache_pb2.AppendTurnsResponse())

    def Check(self, request: Any, timeout: float) -> Any:  # grpc's stub signature
        return self._check(timeout)

    async def _check(self, bound_s: float) -> Any:
        serving = health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)
        try:
            return await asyncio.wait_for(self._answer(serving), bound_s)
        except TimeoutError:  # what grpc does with the call's timeout
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(), grpc.aio.Metadata()
            ) from None


def _fake(stub: _Stub) -> cache_pb2_grpc.ContextCacheServiceAsyncStub:
    """The fake in the stub's place (it has the methods the stage calls)."""
    return cast("cache_pb2_grpc.ContextCacheServiceAsyncStub", stub)


def _key() -> cache_pb2.ResponseKey:
    return cache_pb2.ResponseKey(model="m", prompt="p")


async def test_a_frozen_cache_is_bypassed_within_the_bound() -> None:
    stub, health = _Stub(), _Stub()  # neither answers
    stage = CacheStage(_fake(stub), health=health, read_timeout_s=0.05, write_timeout_s=0.05)
    rc.activate(rc.new_context())
    lookup = await stage.lookup(_key())
    assert lookup.status == "BYPASS"
    await stage.append("s", [common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content="x")])
    assert rc.current().cache_status == "BYPASS"
    assert health.calls == 2


async def test_a_slow_but_live_cache_is_waited_for() -> None:
    stub, health = _Stub(), _Stub()
    health.release.set()  # the cache answers its health check: it is alive, only this call waits
    stage = CacheStage(_fake(stub), health=health, read_timeout_s=0.01)
    rc.activate(rc.new_context())
    lookup = asyncio.ensure_future(stage.lookup(_key()))
    await asyncio.wait_for(health.called.wait(), timeout=10)
    assert not lookup.done()
    stub.release.set()
    assert (await lookup).status == "MISS"


def test_first_token_bound_cold_then_factor_times_norm_with_a_floor() -> None:
    breaker = CircuitBreaker(3, 10, 10, ttft_floor_s=0.5, ttft_cold_s=7)
    assert breaker.first_token_bound() == 7  # no norm yet
    for _ in range(CircuitBreaker.MIN_SAMPLES):
        breaker.success(0.01)
    assert breaker.first_token_bound() == 0.5  # 10 x 10 ms is under the floor
    for _ in range(60):
        breaker.success(0.2)
    assert abs(breaker.first_token_bound() - 10 * breaker.ttft_norm_s) < 1e-9  # type: ignore[operator]
    breaker.success(100.0)  # far over the bound: counted as a failure, not folded into the norm
    assert breaker.first_token_bound() < 100
