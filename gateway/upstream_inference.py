"""The inference replicas behind the gateway: channels, health, routing and retries.

Each replica gets one channel (with llmesh's context-propagating interceptors)
and a health watcher: a replica leaves the ring the moment its health stream
says NOT_SERVING or breaks, or when it does not answer a health check within
``probe_timeout_s`` (checked every ``probe_interval_s``: a frozen process keeps
its TCP connection, and so its health stream, open); it returns when it says
SERVING again. A replica that stops answering also has its calls in flight cut
(as a broken connection would), so they fail over or end with a clear error
instead of waiting for their deadline.

Calls go to the replica the :class:`~gateway.routing.balancer.Balancer` picks; a
call that fails before its first token is retried on another replica, never
after. A stream whose first token is overdue (the replica's breaker says when)
counts as a breaker failure and, when another replica is eligible, moves there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from llmesh.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from opentelemetry import trace
from prometheus_client import Counter

from gateway.inference_mux import GenerationMux, Unsupported
from gateway.routing.balancer import Balancer, Policy, Replica, make_replicas
from gateway.routing.breaker import CircuitBreaker
from services.runtime import context as rc
from services.runtime import twins
from services.runtime.channels import connect
from services.runtime.errors import NotFound, Unavailable
from services.runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)
_tracer = trace.get_tracer("llmesh.gateway")

# Codes after which another replica may well succeed.
RETRYABLE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNKNOWN}
)
# Codes that say something is wrong with the replica (its breaker counts them).
# DEADLINE_EXCEEDED counts only before the first token (a stream that was producing
# tokens when the request's own deadline passed says nothing against the replica).
REPLICA_FAULTS = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DATA_LOSS,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    }
)
# grpc's own details when the connection to the replica was lost (not a status the
# replica sent): "Socket closed", "Stream removed", "Connection reset by peer", ...
_CONNECTION_LOST = (
    "socket closed",
    "stream removed",
    "connection reset",
    "broken pipe",
    "goaway",
    "keepalive",
)
GONE_MID_STREAM = "the inference replica serving this stream went away mid-stream; retry the request"
# Codes a replica (or grpc, for it) ends a stream with when the replica itself failed: the
# stream may continue elsewhere. Not DEADLINE_EXCEEDED: that is the request's own deadline.
MID_STREAM_FAULTS = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DATA_LOSS,
    }
)
RESUMED_KEY = "x-llmesh-resumed"
RESUMES = Counter(
    "llmesh_gateway_stream_resumes_total",
    "Streams continued on another inference replica after the one generating them failed.",
)
# Why each request went where it went (gateway/routing/balancer.py: prefix, kv, ring, evicted,
# room, round_robin, least_loaded), retries included.
ROUTES = Counter(
    "llmesh_gateway_route_choices_total",
    "Inference replicas chosen for requests, by the routing rule that chose them.",
    ["reason"],
)
MODEL_INFO_TTL_S = 30.0
HEALTH_RETRY_S = 0.5
PREFIXES_RETRY_MAX_S = 30.0


class _Overdue(Exception):
    """No first token within the replica's bound, and another replica can take the request."""


def connection_lost(exc: grpc.aio.AioRpcError) -> bool:
    """True when grpc itself ended the call because the connection to the replica broke."""
    details = (exc.details() or "").lower()
    return exc.code() == grpc.StatusCode.UNAVAILABLE and any(p in details for p in _CONNECTION_LOST)


@dataclass(frozen=True)
class ModelInfo:
    name: str
    revision: str
    max_model_len: int
    aliases: tuple[str, ...]
    fetched_at: float


def _client(replica: Replica) -> inference_pb2_grpc.InferenceServiceAsyncStub:
    """The replica's inference stub (the balancer keeps clients untyped: it never calls them)."""
    client: inference_pb2_grpc.InferenceServiceAsyncStub = replica.client
    return client


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
        room_margin: int = 16,
        breaker_failures: int = 3,
        breaker_open_s: float = 10.0,
        breaker_ttft_factor: float = 10.0,
        first_token_floor_s: float = 2.0,
        first_token_cold_s: float = 30.0,
        probe_interval_s: float = 1.0,
        probe_timeout_s: float = 2.0,
        kv_events: bool = True,
        mux: bool = True,
        mux_lane_s: float = 30.0,
    ) -> None:
        replicas = make_replicas(
            addresses,
            lambda: CircuitBreaker(
                breaker_failures,
                breaker_open_s,
                breaker_ttft_factor,
                ttft_floor_s=first_token_floor_s,
                ttft_cold_s=first_token_cold_s,
            ),
        )
        self._probe_interval_s = probe_interval_s
        self._probe_timeout_s = probe_timeout_s
        # Calls in flight per replica, and those cut because their replica stopped answering.
        self._calls: dict[str, set[Any]] = {}
        self._cut: set[Any] = set()
        self.balancer = Balancer(
            replicas,
            policy=policy,
            index_size=index_size,
            virtual_nodes=virtual_nodes,
            load_factor=load_factor,
            room_margin=room_margin,
        )
        self._channels: list[grpc.aio.Channel] = []
        self._watchers: list[asyncio.Task[None]] = []
        self._first_report: dict[str, asyncio.Event] = {}
        self._models: dict[str, ModelInfo] = {}
        self._kv_events = kv_events and policy == "affinity"
        # Streams over one shared GenerateStreams call per replica (gateway/inference_mux.py).
        self._mux = mux
        self._mux_lane_s = mux_lane_s

    @property
    def replicas(self) -> list[Replica]:
        return list(self.balancer.replicas.values())

    async def open(self, wait_s: float = 5.0) -> None:
        """Connects every replica and starts its health watch; waits (bounded) for first reports."""
        for replica in self.replicas:
            channel = await connect(replica.address)
            self._channels.append(channel)
            replica.client = inference_pb2_grpc.InferenceServiceStub(channel)
            replica.meta["health"] = health_pb2_grpc.HealthStub(channel)
            if self._mux:
                replica.meta["mux"] = GenerationMux(replica.client, self._mux_lane_s)
            replica.healthy = False
            self.balancer.ring.remove(replica.id)
            self._first_report[replica.id] = asyncio.Event()
            self._watchers.append(asyncio.create_task(self._watch(replica), name=f"health {replica.id}"))
            if self._kv_events:
                self._watchers.append(
                    asyncio.create_task(self._watch_prefixes(replica), name=f"prefixes {replica.id}")
                )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.gather(*(e.wait() for e in self._first_report.values())), timeout=wait_s
            )

    async def close(self) -> None:
        for task in self._watchers:
            await cancel_and_wait(task)
        for replica in self.replicas:
            mux = replica.meta.get("mux")
            if mux is not None:
                await mux.close()
        for channel in self._channels:
            await channel.close()

    def ready(self) -> bool:
        return any(r.healthy for r in self.replicas)

    async def _watch(self, replica: Replica) -> None:
        stub = replica.meta["health"]
        reported = self._first_report[replica.id]
        while True:
            call = stub.Watch(health_pb2.HealthCheckRequest(service=""), wait_for_ready=False)
            follow = asyncio.ensure_future(self._follow(replica, call, reported))
            probe = asyncio.ensure_future(self._probe(replica))
            try:
                done, _ = await asyncio.wait({follow, probe}, return_when=asyncio.FIRST_COMPLETED)
                stalled = probe in done
            finally:
                call.cancel()
                for task in (follow, probe):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            if replica.healthy:
                why = "no answer to its health check" if stalled else "health stream lost"
                log.warning("inference replica %s left the ring (%s)", replica.id, why)
            self.balancer.set_healthy(replica.id, False)
            _retire_lane(replica)
            if stalled:
                self._cut_calls(replica)
            reported.set()
            # Reconnect backoff; the channel itself also backs off (max 5 s).
            await asyncio.sleep(HEALTH_RETRY_S)

    async def _follow(self, replica: Replica, call: Any, reported: asyncio.Event) -> None:
        """Follows the health stream until it ends or breaks."""
        try:
            async for reply in call:
                serving = reply.status == health_pb2.HealthCheckResponse.SERVING
                if serving != replica.healthy:
                    log.info("inference replica %s %s", replica.id, "joined" if serving else "left")
                    if not serving:
                        _retire_lane(replica)  # draining: its shared call ends with its last stream
                self.balancer.set_healthy(replica.id, serving)
                reported.set()
        except grpc.aio.AioRpcError as exc:
            log.debug("health watch of %s ended: %s", replica.id, exc.code().name)

    async def _watch_prefixes(self, replica: Replica) -> None:
        """Follows the replica's WatchPrefixes stream into the balancer's held index.

        Whatever breaks the stream (the replica restarting, a lost connection) forgets what
        the replica was known to hold until a new snapshot arrives; a replica without KV
        events (UNAVAILABLE from the replica itself, or an older one: UNIMPLEMENTED) is asked
        again every PREFIXES_RETRY_MAX_S.
        """
        balancer = self.balancer
        delay = HEALTH_RETRY_S
        while True:
            call = _client(replica).WatchPrefixes(inference_pb2.WatchPrefixesRequest())
            try:
                async for reply in call:
                    if reply.reset:
                        balancer.watched.add(replica.id)
                        delay = HEALTH_RETRY_S
                    balancer.held.update(
                        replica.id, reset=reply.reset, held=reply.held, released=reply.released
                    )
                    replica.meta["kv_blocks"] = (reply.blocks_held, reply.blocks_total)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED or (
                    exc.code() == grpc.StatusCode.UNAVAILABLE and "KV-cache events" in (exc.details() or "")
                ):
                    delay = PREFIXES_RETRY_MAX_S
                log.debug("prefix watch of %s ended: %s", replica.id, exc.code().name)
            finally:
                call.cancel()
                balancer.watched.discard(replica.id)
                balancer.held.forget_replica(replica.id)
            await asyncio.sleep(delay)
            delay = min(PREFIXES_RETRY_MAX_S, delay * 2)

    async def _probe(self, replica: Replica) -> None:
        """Returns when the replica does not answer a health check within the bound.

        A frozen process (SIGSTOP, a wedged event loop) keeps its connection and health
        stream open; only a call that needs an answer tells it apart from a quiet one.
        """
        stub = replica.meta["health"]
        request = health_pb2.HealthCheckRequest(service="")
        while True:
            await asyncio.sleep(self._probe_interval_s)
            if not replica.healthy:
                continue  # out of the ring already: the health stream brings it back
            try:
                await stub.Check(request, timeout=self._probe_timeout_s)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    return
                # Any other failure shows on the health stream too.

    def _cut_calls(self, replica: Replica) -> None:
        calls = self._calls.get(replica.id, set())
        if calls:
            log.warning("cutting %d call(s) in flight on inference replica %s", len(calls), replica.id)
        for call in list(calls):
            self._cut.add(call)
            call.cancel()

    def _track(self, replica: Replica, call: Any) -> None:
        self._calls.setdefault(replica.id, set()).add(call)

    def _untrack(self, replica: Replica, call: Any) -> None:
        self._calls.get(replica.id, set()).discard(call)
        self._cut.discard(call)

    def _was_cut(self, call: Any) -> bool:
        """A cancellation that came from :meth:`_cut_calls`, not from the caller's own task."""
        task = asyncio.current_task()
        return call in self._cut and (task is None or task.cancelling() == 0)

    # -- models ---------------------------------------------------------------------------------

    async def model_info(self, model: str = "") -> ModelInfo:
        """Name, revision and context length of ``model`` (""= the default), cached briefly."""
        cached = self._models.get(model)
        if cached is not None and time.monotonic() - cached.fetched_at < MODEL_INFO_TTL_S:
            return cached
        last: Exception | None = None
        for replica in self._ordered():
            try:
                reply = await _client(replica).GetModelInfo(
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

    def _start(
        self, blocks: Sequence[int], tried: set[str], last: BaseException | None
    ) -> tuple[Replica, int, float]:
        """The next replica, counted as started: (replica, its load before this call, start time)."""
        replica = self._next(blocks, tried, last)
        load = replica.inflight
        self.balancer.started(replica)
        return replica, load, time.perf_counter()

    def _next(self, blocks: Sequence[int], tried: set[str], last: BaseException | None) -> Replica:
        choice = self.balancer.choose(blocks, tried)
        if choice is None:
            if isinstance(last, grpc.aio.AioRpcError) and last.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise last
            raise Unavailable("no inference replica is available; retry shortly", retry_after_s=1.0) from last
        ROUTES.labels(choice.reason).inc()
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "route %s -> %s (%s, %d blocks matched)",
                f"{blocks[0]:016x}" if blocks else "-",
                choice.replica.id,
                choice.reason,
                choice.matched_blocks,
            )
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
            replica, load, started = self._start(blocks, tried, last)
            fault = False
            call = _client(replica).Generate(request)
            self._track(replica, call)
            try:
                reply: inference_pb2.GenerateResponse = await call
                ttft_ms = reply.timings.time_to_first_token_ms
                self.balancer.first_token(
                    replica, blocks, ttft_ms / 1000 if ttft_ms else time.perf_counter() - started, load
                )
                return reply
            except asyncio.CancelledError:
                if not self._was_cut(call):
                    raise
                fault = True
                log.warning("inference replica %s stopped answering; trying another", replica.id)
                last = Unavailable(f"inference replica {replica.id} stopped answering")
            except grpc.aio.AioRpcError as exc:
                fault = exc.code() in REPLICA_FAULTS
                if exc.code() not in RETRYABLE:
                    raise
                log.warning("inference replica %s failed (%s); trying another", replica.id, exc.code().name)
                last = exc
            finally:
                self._untrack(replica, call)
                self.balancer.finished(replica, ok=not fault)

    async def _first(self, replica: Replica, call: Any, tried: set[str], load: int) -> Any:
        """The call's first message; :class:`_Overdue` when it is late and another replica
        is eligible (it then counts against the replica's breaker), else waits on."""
        read = asyncio.ensure_future(call.read())
        bound = replica.breaker.first_token_bound(load)
        try:
            done, _ = await asyncio.wait({read}, timeout=bound)
            if not done:
                others = self.balancer.eligible(tried)
                log.warning(
                    "inference replica %s: first token overdue (%.1f s)%s",
                    replica.id,
                    bound,
                    "; trying another" if others else "; no other replica, waiting on",
                )
                if others:
                    raise _Overdue
            return await read
        finally:
            if not read.done():
                read.cancel()

    async def stream(
        self, request: inference_pb2.GenerateRequest, blocks: Sequence[int], stream_interval: int = 0
    ) -> AsyncGenerator[inference_pb2.GenerateStreamResponse, None]:
        """Streamed generation: retried on another replica before the first message; after it,
        continued on another replica when the one generating fails (:func:`resumable` requests).

        A continuation asks the next replica for what follows the prompt plus every token
        already sent (``resume_token_ids``), so the caller reads one stream: with greedy
        decoding the same tokens an uninterrupted stream would have had. The request's context
        counts the resumes (:data:`RESUMED_KEY`); a stream that cannot be continued (n > 1,
        tools, a JSON format, no other replica) ends with :data:`GONE_MID_STREAM`.
        ``stream_interval``: engine steps per message once the first word is out (0: the
        replica's own setting).
        """
        tried: set[str] = set()
        last: BaseException | None = None
        streamed = twins.convert(request, inference_pb2.GenerateStreamRequest)
        streamed.stream_interval = stream_interval
        can_resume = resumable(request)
        # Token ids of the one choice sent to the caller so far, over every replica.
        emitted: list[int] = []
        resumes = 0
        while True:
            replica, load, started = self._start(blocks, tried, last)
            mux: GenerationMux | None = replica.meta.get("mux")
            if mux is not None and mux.supported:
                call: Any = mux.open(streamed)
            else:
                call = _client(replica).GenerateStream(streamed)
            self._track(replica, call)
            fault = False
            first = False
            done = False
            why = ""
            cause: BaseException | None = None
            try:
                try:
                    message = await self._first(replica, call, tried, load)
                    while message is not grpc.aio.EOF:
                        if not first:
                            first = True
                            # A late first token (waited for: no other replica) counts as slow here.
                            self.balancer.first_token(replica, blocks, time.perf_counter() - started, load)
                        if can_resume:
                            for delta in message.deltas:
                                emitted.extend(delta.token_ids)
                        yield message
                        message = await call.read()
                    done = True
                    return
                except Unsupported:
                    # The replica has no GenerateStreams (an older build): per call from now on.
                    tried.discard(replica.id)
                    continue
                except _Overdue:
                    fault = True
                    last = Unavailable(f"inference replica {replica.id}: first token overdue")
                    continue
                except asyncio.CancelledError:
                    if not self._was_cut(call):
                        raise
                    fault = True
                    why = "stopped answering"
                except grpc.aio.AioRpcError as exc:
                    code = exc.code()
                    midstream = first or resumes > 0
                    fault = code in REPLICA_FAULTS and not (
                        midstream and code == grpc.StatusCode.DEADLINE_EXCEEDED
                    )
                    if not midstream and code in RETRYABLE:
                        log.warning("inference replica %s failed (%s); trying another", replica.id, code.name)
                        last = exc
                        continue
                    if not midstream or not (connection_lost(exc) or code in MID_STREAM_FAULTS):
                        raise
                    why = f"failed mid-stream ({code.name}: {exc.details()})"
                    cause = exc
                if not (first or resumes > 0):
                    log.warning("inference replica %s %s; trying another", replica.id, why)
                    last = Unavailable(f"inference replica {replica.id} {why}")
                    continue
                if not (can_resume and self.balancer.eligible(tried)):
                    log.warning("inference replica %s %s; the stream cannot be continued", replica.id, why)
                    raise Unavailable(GONE_MID_STREAM, retry_after_s=1.0) from cause
                resumes += 1
                del streamed.resume_token_ids[:]
                streamed.resume_token_ids.extend(emitted)
                mark_resumed(rc.current())
                RESUMES.inc()
                log.warning(
                    "inference replica %s %s; continuing the stream on another replica after %d token(s)",
                    replica.id,
                    why,
                    len(emitted),
                )
                last = Unavailable(f"inference replica {replica.id} {why}")
            finally:
                self._untrack(replica, call)
                self.balancer.finished(replica, ok=not fault)
                if not done:
                    # Client gone or error: cancelling the call aborts the engine request.
                    call.cancel()


def _retire_lane(replica: Replica) -> None:
    mux: GenerationMux | None = replica.meta.get("mux")
    if mux is not None:
        mux.retire()


def resumable(request: inference_pb2.GenerateRequest) -> bool:
    """Whether a stream of ``request`` can continue on another replica from its tokens.

    One plain-text choice only: tool-call parsing and structured output follow the whole
    answer from its first token, and n > 1 choices would each need their own continuation.
    """
    return (
        request.sampling.n <= 1
        and not request.tools
        and request.response_format.type
        in (common_pb2.ResponseFormat.TYPE_UNSPECIFIED, common_pb2.ResponseFormat.TYPE_TEXT)
    )


def mark_resumed(ctx: rc.RequestContext) -> None:
    """Counts one more resumed stream on the request (the ``x-llmesh-resumed`` trailer)."""
    ctx.set_trailer(RESUMED_KEY, str(resumed_count(ctx) + 1))


def resumed_count(ctx: rc.RequestContext) -> int:
    """How many times this request's streams continued on another replica."""
    return int(ctx.trailer(RESUMED_KEY) or 0)
