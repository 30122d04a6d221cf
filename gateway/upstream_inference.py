"""The inference replicas behind the gateway: channels, health, routing and retries.

Each replica gets one channel (with llmesh's context-propagating interceptors)
and a health watcher: a replica leaves the ring the moment its health stream
says NOT_SERVING or breaks, and returns when it says SERVING again. Calls go to
the replica the :class:`~gateway.routing.balancer.Balancer` picks; a call that
fails before its first token is retried on another replica, never after.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from llmesh.v1 import inference_pb2, inference_pb2_grpc
from opentelemetry import trace

from gateway.routing.balancer import Balancer, Policy, Replica, make_replicas
from gateway.routing.breaker import CircuitBreaker
from services.runtime.channels import connect
from services.runtime.errors import NotFound, Unavailable

log = logging.getLogger(__name__)
_tracer = trace.get_tracer("llmesh.gateway")

# Codes after which another replica may well succeed.
RETRYABLE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNKNOWN}
)
# Codes that say something is wrong with the replica (its breaker counts them).
REPLICA_FAULTS = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DATA_LOSS,
    }
)
MODEL_INFO_TTL_S = 30.0
HEALTH_RETRY_S = 0.5


@dataclass(frozen=True)
class ModelInfo:
    name: str
    revision: str
    max_model_len: int
    aliases: tuple[str, ...]
    fetched_at: float


class InferencePool:
    """All inference replicas; :meth:`generate` and :meth:`stream` route, retry and record."""

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        policy: Policy = "affinity",
        index_size: int = 100_000,
        virtual_nodes: int = 64,
        load_factor: float = 1.25,
        breaker_failures: int = 3,
        breaker_open_s: float = 10.0,
        breaker_ttft_factor: float = 10.0,
    ) -> None:
        replicas = make_replicas(
            addresses, lambda: CircuitBreaker(breaker_failures, breaker_open_s, breaker_ttft_factor)
        )
        self.balancer = Balancer(
            replicas,
            policy=policy,
            index_size=index_size,
            virtual_nodes=virtual_nodes,
            load_factor=load_factor,
        )
        self._channels: list[grpc.aio.Channel] = []
        self._watchers: list[asyncio.Task[None]] = []
        self._first_report: dict[str, asyncio.Event] = {}
        self._models: dict[str, ModelInfo] = {}

    @property
    def replicas(self) -> list[Replica]:
        return list(self.balancer.replicas.values())

    async def open(self, wait_s: float = 5.0) -> None:
        """Connects every replica and starts its health watch; waits (bounded) for first reports."""
        for replica in self.replicas:
            channel = await connect(replica.address)
            self._channels.append(channel)
            stub_cls: Any = inference_pb2_grpc.InferenceServiceStub
            replica.client = stub_cls(channel)
            replica.meta["health"] = health_pb2_grpc.HealthStub(channel)
            replica.healthy = False
            self.balancer.ring.remove(replica.id)
            self._first_report[replica.id] = asyncio.Event()
            self._watchers.append(asyncio.create_task(self._watch(replica), name=f"health {replica.id}"))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.gather(*(e.wait() for e in self._first_report.values())), timeout=wait_s
            )

    async def close(self) -> None:
        for task in self._watchers:
            task.cancel()
        for task in self._watchers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for channel in self._channels:
            await channel.close()

    def ready(self) -> bool:
        return any(r.healthy for r in self.replicas)

    async def _watch(self, replica: Replica) -> None:
        stub = replica.meta["health"]
        reported = self._first_report[replica.id]
        while True:
            try:
                call = stub.Watch(health_pb2.HealthCheckRequest(service=""), wait_for_ready=False)
                async for reply in call:
                    serving = reply.status == health_pb2.HealthCheckResponse.SERVING
                    if serving != replica.healthy:
                        log.info("inference replica %s %s", replica.id, "joined" if serving else "left")
                    self.balancer.set_healthy(replica.id, serving)
                    reported.set()
            except grpc.aio.AioRpcError as exc:
                log.debug("health watch of %s ended: %s", replica.id, exc.code().name)
            if replica.healthy:
                log.warning("inference replica %s left the ring (health stream lost)", replica.id)
            self.balancer.set_healthy(replica.id, False)
            reported.set()
            # Reconnect backoff; the channel itself also backs off (max 5 s).
            await asyncio.sleep(HEALTH_RETRY_S)

    # -- models ---------------------------------------------------------------------------------

    async def model_info(self, model: str = "") -> ModelInfo:
        """Name, revision and context length of ``model`` (""= the default), cached briefly."""
        cached = self._models.get(model)
        if cached is not None and time.monotonic() - cached.fetched_at < MODEL_INFO_TTL_S:
            return cached
        last: Exception | None = None
        for replica in self._ordered():
            try:
                reply = await replica.client.GetModelInfo(
                    inference_pb2.GetModelInfoRequest(model=model), timeout=5.0
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    raise NotFound(f"the model {model!r} does not exist") from exc
                last = exc
                continue
            info = ModelInfo(
                reply.name, reply.revision, reply.max_model_len, tuple(reply.aliases), time.monotonic()
            )
            self._models[model] = info
            self._models[info.name] = info
            return info
        raise Unavailable("no inference replica answers", retry_after_s=1.0) from last

    async def list_models(self) -> list[ModelInfo]:
        info = await self.model_info("")
        return [info]

    def _ordered(self) -> list[Replica]:
        return sorted(self.replicas, key=lambda r: (not r.healthy, r.inflight))

    # -- generation -----------------------------------------------------------------------------

    def _next(self, blocks: Sequence[int], tried: set[str], last: BaseException | None) -> Replica:
        choice = self.balancer.choose(blocks, tried)
        if choice is None:
            if isinstance(last, grpc.aio.AioRpcError) and last.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise last
            raise Unavailable("no inference replica is available; retry shortly", retry_after_s=1.0) from last
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attribute("route.replica", choice.replica.id)
            span.set_attribute("route.reason", choice.reason)
            span.set_attribute("route.matched_blocks", choice.matched_blocks)
        tried.add(choice.replica.id)
        return choice.replica

    async def generate(
        self, request: inference_pb2.GenerateRequest, blocks: Sequence[int]
    ) -> inference_pb2.GenerateResponse:
        """Unary generation, retried on another replica when the chosen one cannot serve it."""
        tried: set[str] = set()
        last: BaseException | None = None
        while True:
            replica = self._next(blocks, tried, last)
            self.balancer.started(replica)
            started = time.perf_counter()
            fault = False
            try:
                reply: inference_pb2.GenerateResponse = await replica.client.Generate(request)
                ttft_ms = reply.timings.time_to_first_token_ms
                self.balancer.first_token(
                    replica, blocks, ttft_ms / 1000 if ttft_ms else time.perf_counter() - started
                )
                return reply
            except grpc.aio.AioRpcError as exc:
                fault = exc.code() in REPLICA_FAULTS
                if exc.code() not in RETRYABLE:
                    raise
                log.warning("inference replica %s failed (%s); trying another", replica.id, exc.code().name)
                last = exc
            finally:
                self.balancer.finished(replica, ok=not fault)

    async def stream(
        self, request: inference_pb2.GenerateRequest, blocks: Sequence[int]
    ) -> AsyncIterator[inference_pb2.GenerateStreamResponse]:
        """Streamed generation; retried on another replica only before the first message."""
        tried: set[str] = set()
        last: BaseException | None = None
        while True:
            replica = self._next(blocks, tried, last)
            self.balancer.started(replica)
            started = time.perf_counter()
            call = replica.client.GenerateStream(request)
            fault = False
            first = False
            done = False
            try:
                async for message in call:
                    if not first:
                        first = True
                        self.balancer.first_token(replica, blocks, time.perf_counter() - started)
                    yield message
                done = True
                return
            except grpc.aio.AioRpcError as exc:
                fault = exc.code() in REPLICA_FAULTS
                if first or exc.code() not in RETRYABLE:
                    raise
                log.warning("inference replica %s failed (%s); trying another", replica.id, exc.code().name)
                last = exc
            finally:
                self.balancer.finished(replica, ok=not fault)
                if not done:
                    # Client gone or error: cancelling the call aborts the engine request.
                    call.cancel()
