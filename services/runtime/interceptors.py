"""Server and client interceptors that carry the request context across hops.

Server side (:class:`ServerInterceptor`): reads the incoming metadata once into a
:class:`~services.runtime.context.RequestContext`, opens the server span, checks
the caller against the access table (:mod:`services.runtime.authz`), maps
domain exceptions to status codes, records RPC metrics and returns the versions,
cache status and age in trailing metadata.

Client side (one class per call type — grpc.aio silently uses a class that
subclasses several interceptor types for unary calls only): copies the current
context onto every outgoing call, shrinks the timeout to the remaining deadline,
injects the trace context, and merges the trailing versions of the answer into
the current context.

Hot path: the wrapped handler of each method is built once and cached, so a call
costs one metadata parse, one span and two metric updates.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any, TypeAlias

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import Getter, Setter
from prometheus_client import Counter, Histogram

from services.runtime import context as rc
from services.runtime.authz import Authorizer
from services.runtime.errors import InvalidArgument, LlmeshError
from services.runtime.status import RETRY_AFTER, status_for

log = logging.getLogger(__name__)
_tracer = trace.get_tracer("llmesh.runtime")

# Health and reflection answer probes and tools; they never carry a request context.
_UNWRAPPED_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")

# The server interceptor wraps every method of every service, so its handlers and contexts
# carry whichever request and response messages the method has. (A string: grpcio's
# RpcMethodHandler is generic only in its type stubs, not at run time.)
_Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
_Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]

RPC_HANDLED = Counter(
    "llmesh_rpc_server_handled_total",
    "RPCs completed by the server, by method and status code.",
    ["service", "method", "code"],
)
RPC_LATENCY = Histogram(
    "llmesh_rpc_server_handling_seconds",
    "Time from the start of an RPC to its end, by method.",
    ["service", "method"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
# The response-cache hit rate of the dashboard (deploy/observability): whatever a service set
# with ``set_cache_status`` for a call that completed OK.
RPC_CACHE_STATUS = Counter(
    "llmesh_rpc_server_cache_status_total",
    "RPCs completed OK with a cache status (HIT, MISS, STALE, BYPASS), by method.",
    ["service", "method", "status"],
)


def _metadata_getter(carrier: list[tuple[str, str]], key: str) -> list[str]:
    return [v for k, v in carrier if k == key]


class _Getter(Getter[Any]):
    def get(self, carrier: Any, key: str) -> list[str] | None:
        values = _metadata_getter(carrier, key)
        return values or None

    def keys(self, carrier: Any) -> list[str]:
        return [k for k, _ in carrier]


class _Setter(Setter[Any]):
    def set(self, carrier: Any, key: str, value: str) -> None:
        carrier.append((key, value))


_GETTER = _Getter()
_SETTER = _Setter()
_tracing = False
_UNKNOWN = object()
_PROVIDER_FROM_ENV = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


def tracing_enabled() -> bool:
    """True once an SDK tracer provider is installed (an exporter or a test's in-memory one).

    Without one, spans would be no-ops: the interceptors then skip span work and pass
    the caller's ``traceparent`` on unchanged, so trace context still crosses hops.
    """
    global _tracing
    if not _tracing:
        # Until a provider is set the API answers its proxy; asking it costs an environment
        # lookup (OTEL_PYTHON_TRACER_PROVIDER) on every call, on every stage of every request.
        # The API's own global says "none set" without one (when the API still has it).
        if getattr(trace, "_TRACER_PROVIDER", _UNKNOWN) is None and not _PROVIDER_FROM_ENV:
            return False
        provider = trace.get_tracer_provider()
        _tracing = not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))
    return _tracing


# What start_span gives without a tracer provider: no span work, and a span to set attributes on
# that records nothing (trace.get_current_span() answers the same one).
_NO_SPAN = contextlib.nullcontext(trace.INVALID_SPAN)


def start_span(tracer: trace.Tracer, name: str) -> AbstractContextManager[trace.Span]:
    """``tracer.start_as_current_span(name)`` when tracing is on; otherwise a context that does
    nothing (a no-op tracer still makes a span object and sets and resets the context per span,
    which the gateway paid on every stage of every request)."""
    if not tracing_enabled():
        return _NO_SPAN
    return tracer.start_as_current_span(name)


def stream_span(name: str, traceparent: str | None) -> AbstractContextManager[trace.Span]:
    """A server span for one stream of a multiplexed call (the call's own span covers them all),
    child of the traceparent its order carried; nothing when tracing is off."""
    if not tracing_enabled():
        return _NO_SPAN
    parent = propagate.extract({rc.TRACEPARENT: traceparent}) if traceparent else None
    return _tracer.start_as_current_span(name, context=parent, kind=trace.SpanKind.SERVER)


def outgoing_traceparent(ctx: rc.RequestContext | None) -> str:
    """The traceparent a call made now would carry (the current span's when tracing is on,
    else the request's own), for an order sent on a multiplexed call."""
    if tracing_enabled():
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        if rc.TRACEPARENT in carrier:
            return carrier[rc.TRACEPARENT]
    return (ctx.traceparent if ctx is not None else None) or ""


class _MethodStats:
    """Pre-resolved metric children of one method."""

    __slots__ = ("_cache_counters", "_counters", "_service", "latency", "method")

    def __init__(self, service: str, method: str) -> None:
        self._service = service
        self.method = method
        self.latency = RPC_LATENCY.labels(service, method)
        self._counters: dict[grpc.StatusCode, Any] = {}
        self._cache_counters: dict[str, Any] = {}

    def done(self, code: grpc.StatusCode, started: float) -> None:
        self.latency.observe(time.perf_counter() - started)
        counter = self._counters.get(code)
        if counter is None:
            counter = self._counters[code] = RPC_HANDLED.labels(self._service, self.method, code.name)
        counter.inc()

    def cache_status(self, status: str) -> None:
        counter = self._cache_counters.get(status)
        if counter is None:
            counter = RPC_CACHE_STATUS.labels(self._service, self.method, status)
            self._cache_counters[status] = counter
        counter.inc()


class ServerInterceptor(grpc.aio.ServerInterceptor):
    """Request context, tracing, error mapping, metrics and trailing metadata for every RPC."""

    def __init__(self, service: str, authorizer: Authorizer | None = None) -> None:
        self._service = service
        # None: every caller may call everything (servers built without interceptors' checks).
        self._authorizer = authorizer
        self._wrapped: dict[str, tuple[_Handler, _Handler]] = {}
        # time.monotonic() of the latest call other than health and reflection (the drain
        # waits until clients have stopped sending before it stops accepting).
        self.last_call = 0.0

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[_Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> _Handler | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(_UNWRAPPED_PREFIXES):
            return handler
        self.last_call = time.monotonic()
        cached = self._wrapped.get(method)
        if cached is None or cached[0] is not handler:
            cached = (handler, self._wrap(handler, method))
            self._wrapped[method] = cached
        return cached[1]

    def _wrap(self, handler: _Handler, method: str) -> _Handler:
        stats = _MethodStats(self._service, method.rsplit("/", 1)[-1])
        span_name = method.lstrip("/")
        kind = (handler.request_streaming, handler.response_streaming)
        inner = {
            (False, False): handler.unary_unary,
            (False, True): handler.unary_stream,
            (True, False): handler.stream_unary,
            (True, True): handler.stream_stream,
        }[kind]
        check = _Check(self._authorizer, method)
        if inspect.isasyncgenfunction(inner) or (
            inspect.ismethod(inner) and inspect.isasyncgenfunction(inner.__func__)
        ):
            behavior: Any = self._streaming(inner, stats, span_name, handler.request_streaming, check)
        elif inspect.iscoroutinefunction(inner):
            behavior = self._unary(inner, stats, span_name, handler.request_streaming, check)
        elif self._authorizer is not None:
            # A synchronous handler cannot be wrapped here, so it could not be checked either.
            raise TypeError(f"{method}: llmesh servers serve async handlers only")
        else:
            return handler  # a synchronous handler runs in a thread; leave it alone
        factory = {
            (False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler,
        }[kind]
        return factory(  # type: ignore[operator]
            behavior,
            request_deserializer=_tolerant(handler.request_deserializer),
            response_serializer=handler.response_serializer,
        )

    def _unary(
        self, inner: Any, stats: _MethodStats, span_name: str, request_streaming: bool, check: _Check
    ) -> Any:
        async def behavior(request: Any, context: _Context) -> Any:
            async with _observed(context, span_name, stats, check):
                return await inner(_checked(request, request_streaming), context)

        return behavior

    def _streaming(
        self, inner: Any, stats: _MethodStats, span_name: str, request_streaming: bool, check: _Check
    ) -> Any:
        async def behavior(request: Any, context: _Context) -> AsyncIterator[Any]:
            async with _observed(context, span_name, stats, check):
                async for message in inner(_checked(request, request_streaming), context):
                    yield message

        return behavior


class _Check:
    """The access check of one method (nothing to check without an authorizer)."""

    __slots__ = ("_authorizer", "_method")

    def __init__(self, authorizer: Authorizer | None, method: str) -> None:
        self._authorizer = authorizer
        self._method = method

    def __call__(self, context: _Context, ctx: rc.RequestContext) -> None:
        if self._authorizer is not None:
            self._authorizer.check(context, self._method, ctx)


@contextlib.asynccontextmanager
async def _observed(
    context: _Context, span_name: str, stats: _MethodStats, check: _Check
) -> AsyncIterator[None]:
    """One call's span, request context, access check, metrics and error mapping around the handler.

    Bad metadata is refused with INVALID_ARGUMENT before the handler runs, a caller the access
    table refuses with its status; an exception from the handler becomes its status (``_fail``)
    and is re-raised."""
    started = time.perf_counter()
    try:
        ctx, span = _begin(context, span_name)
    except LlmeshError as exc:
        stats.done(grpc.StatusCode.INVALID_ARGUMENT, started)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.message)
        raise  # abort() raises; this only tells the type checker
    code = grpc.StatusCode.OK
    try:
        check(context, ctx)
        yield
        _finish_ok(context, ctx, stats)
    except BaseException as exc:
        code = await _fail(exc, context, ctx, span)
        raise
    finally:
        span.end()
        stats.done(code, started)


class _Undecodable:
    """Stands in for a request message that did not parse (see :func:`_tolerant`)."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


def _tolerant(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """Wraps a request deserializer so that bytes that do not parse (truncated, mangled,
    invalid UTF-8 in a string field) become INVALID_ARGUMENT instead of grpc's INTERNAL."""
    if deserialize is None:
        return None
    owner = getattr(deserialize, "__self__", None)
    descriptor = getattr(owner, "DESCRIPTOR", None)
    type_name = getattr(descriptor, "full_name", "request")

    def tolerant(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:  # the parser's errors have no common base class
            reason = str(exc).removeprefix(f"Error parsing message with type '{type_name}': ")
            return _Undecodable(f"request is not a valid {type_name} message: {reason}")

    return tolerant


def _checked(request: Any, streaming: bool) -> Any:
    """Raises InvalidArgument for a request that did not parse (lazily, for request streams)."""
    if not streaming:
        if isinstance(request, _Undecodable):
            raise InvalidArgument(request.message)
        return request

    async def messages() -> AsyncIterator[Any]:
        async for message in request:
            if isinstance(message, _Undecodable):
                raise InvalidArgument(message.message)
            yield message

    return messages()


def _begin(context: _Context, span_name: str) -> tuple[rc.RequestContext, Any]:
    """Context and span of an incoming call; raises InvalidArgument on bad metadata."""
    metadata = context.invocation_metadata() or ()
    ctx = rc.from_metadata(metadata, context.time_remaining())
    if not tracing_enabled():
        rc.activate(ctx)
        return ctx, trace.INVALID_SPAN
    parent = propagate.extract(list(metadata), getter=_GETTER) if ctx.traceparent else None
    span = _tracer.start_span(span_name, context=parent, kind=trace.SpanKind.SERVER)
    if span.is_recording():
        span.set_attribute("rpc.system", "grpc")
        span.set_attribute("llmesh.request_id", ctx.request_id)
        span.set_attribute("llmesh.tenant", ctx.tenant)
    # Each RPC runs in its own task, so the context set here lives exactly as long
    # as the call and needs no reset (resetting from a generator's finally fails
    # when gRPC finalises it from another context).
    otel_context.attach(trace.set_span_in_context(span))
    rc.activate(ctx)
    return ctx, span


def _finish_ok(context: _Context, ctx: rc.RequestContext, stats: _MethodStats) -> None:
    if ctx.cache_status is not None:
        stats.cache_status(ctx.cache_status)
    trailers = ctx.trailing_metadata()
    if trailers:
        context.set_trailing_metadata(tuple(context.trailing_metadata() or ()) + tuple(trailers))


async def _fail(exc: BaseException, context: _Context, ctx: rc.RequestContext, span: Any) -> grpc.StatusCode:
    """Turns a handler's exception into a status (by aborting); returns the code to record."""
    if isinstance(exc, grpc.aio.AbortError):
        code = context.code()
        return code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN
    if isinstance(exc, (GeneratorExit, KeyboardInterrupt, SystemExit)) or _is_cancel(exc):
        return grpc.StatusCode.CANCELLED
    code, message, retry_after = status_for(exc, ctx.request_id)
    if code is grpc.StatusCode.INTERNAL:
        log.error("unhandled error in %s", span.name if hasattr(span, "name") else "rpc", exc_info=exc)
    if span.is_recording():
        span.set_status(trace.Status(trace.StatusCode.ERROR, code.name))
    trailers = list(ctx.trailing_metadata())
    if retry_after is not None:
        trailers.append((RETRY_AFTER, f"{retry_after:g}"))
    await context.abort(code, message, trailing_metadata=tuple(trailers))
    return code  # unreachable: abort raises


def _is_cancel(exc: BaseException) -> bool:
    return isinstance(exc, asyncio.CancelledError)


class _ClientBase:
    @staticmethod
    def _details(details: grpc.aio.ClientCallDetails, ctx: rc.RequestContext | None) -> Any:
        given = list(details.metadata or ())
        outgoing: list[tuple[str, str]] = []
        timeout = details.timeout
        tracing = tracing_enabled()
        if ctx is not None:
            present = {k for k, _ in given}
            outgoing = [
                (k, v)
                for k, v in ctx.outgoing_metadata()
                if k not in present and not (tracing and k == rc.TRACEPARENT)
            ]
            remaining = ctx.time_remaining()
            if remaining is not None:
                timeout = remaining if timeout is None else min(timeout, remaining)
        if tracing:
            propagate.inject(outgoing, setter=_SETTER)
        return grpc.aio.ClientCallDetails(
            method=details.method,
            timeout=timeout,
            metadata=grpc.aio.Metadata(*given, *outgoing),
            credentials=details.credentials,
            wait_for_ready=details.wait_for_ready,
        )


async def _absorb(call: Any, ctx: rc.RequestContext) -> None:
    trailers = await call.trailing_metadata()
    if trailers:
        ctx.absorb_trailers(trailers)


async def _stream_and_absorb(call: Any, ctx: rc.RequestContext) -> AsyncIterator[Any]:
    async for message in call:
        yield message
    await _absorb(call, ctx)


class UnaryUnaryClientInterceptor(_ClientBase, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        ctx = rc.peek()
        call = await continuation(self._details(client_call_details, ctx), request)
        if ctx is not None:
            with contextlib.suppress(grpc.aio.AioRpcError):  # the caller sees it when it awaits
                await call
            await _absorb(call, ctx)
        return call


class UnaryStreamClientInterceptor(_ClientBase, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        ctx = rc.peek()
        call = await continuation(self._details(client_call_details, ctx), request)
        return call if ctx is None else _stream_and_absorb(call, ctx)


class StreamUnaryClientInterceptor(_ClientBase, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        ctx = rc.peek()
        call = await continuation(self._details(client_call_details, ctx), request_iterator)
        if ctx is not None:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await call
            await _absorb(call, ctx)
        return call


class StreamStreamClientInterceptor(_ClientBase, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        ctx = rc.peek()
        call = await continuation(self._details(client_call_details, ctx), request_iterator)
        return call if ctx is None else _stream_and_absorb(call, ctx)


def client_interceptors() -> list[grpc.aio.ClientInterceptor]:
    """The interceptors every llmesh channel gets, one per call type."""
    return [
        UnaryUnaryClientInterceptor(),
        UnaryStreamClientInterceptor(),
        StreamUnaryClientInterceptor(),
        StreamStreamClientInterceptor(),
    ]
