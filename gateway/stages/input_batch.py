"""The input checks of requests that arrive together, in one call (policy ``CheckInputs``).

At concurrency requests come in bunches (the answers of one decode step end together, and their
clients' next requests arrive together), and each needs its input check before any engine sees
it. The policy service runs checks one after another, and a ``CheckInput`` call costs about as
much in gRPC and interceptor work as in rules, so the k-th check of a bunch of 16 started some
k x 1.8 ms late (BENCHMARKS.md, "where a moderated c16 request waits before generation").

Here a check goes out at once, as a ``CheckInput`` call of its own made in its request's context,
while fewer than ``calls`` calls are out and none is queued (so a request at low concurrency
takes exactly the path it took without batching: through the mesh a ``CheckInputs`` call of one
cost a few ms more at c1, BENCHMARKS.md); otherwise it queues, and when a call ends, what queued
goes out in one ``CheckInputs`` call (no window: a check never waits for another to arrive).
The policy service answers each check as soon as it is done (one streamed response per check),
so the first checks of a call do not wait for the last. Each check names its tenant, request id
and trace parent; the call is made outside any request's context (it must not take one
request's tenant, deadline or trace: the interceptors read them from the context) with the
latest deadline of its checks, and each check keeps its own deadline here. A refused check fails
only its request, with the status a call of its own would have had; a failed call fails its
unanswered checks with its status (each request's fail-open or fail-closed rule applies). A
policy service without ``CheckInputs`` (UNIMPLEMENTED) turns batching off for good: checks go
per call. A call is at most ``max_checks`` checks (``LLMESH_GATEWAY_POLICY_MAX_CHECKS_PER_CALL``);
a policy service that refuses a call of several checks as a whole (INVALID_ARGUMENT before any
answer: its ``LLMESH_POLICY_MAX_CHECKS_PER_CALL`` is lower) checked none of them, so they go
again at the front of the queue and this gateway sends at most half as many per call from then
on: no check is lost, and the gateway settles on what the service takes.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import grpc
from llmesh.v1 import policy_pb2, policy_pb2_grpc
from prometheus_client import Counter

from gateway.stages.moderation_mux import Unsupported, broken
from services.runtime import context as rc
from services.runtime import namespaces
from services.runtime.interceptors import outgoing_traceparent

log = logging.getLogger(__name__)

CALLS = Counter(
    "llmesh_gateway_input_check_calls_total",
    "CheckInputs calls the gateway sent (its batched input checks; a check alone goes as CheckInput).",
)
CHECKS = Counter(
    "llmesh_gateway_input_checks_total",
    "Input checks those calls carried.",
)

# google.rpc codes to grpc's (a check's error comes as a number).
_CODES = {code.value[0]: code for code in grpc.StatusCode}
# Bytes of checks in one call, unless one check alone is larger (it then goes alone): well under
# the services' 16 MiB message limit.
MAX_CALL_BYTES = 4 * 1024 * 1024

Verdict = tuple[policy_pb2.CheckInputResponse, int]


@dataclass(slots=True)
class _Pending:
    check: policy_pb2.InputCheck
    future: asyncio.Future[Verdict]
    # The request's deadline (time.monotonic()), or None.
    deadline: float | None
    size: int


class InputBatcher:
    """The gateway's batched input checks (module doc)."""

    def __init__(
        self, stub: policy_pb2_grpc.PolicyServiceAsyncStub, calls: int = 2, max_checks: int = 256
    ) -> None:
        self._stub = stub
        self._calls = calls
        self._max_checks = max_checks
        self.supported = True
        self._queue: deque[_Pending] = deque()
        self._tasks: set[asyncio.Task[None]] = set()
        # CheckInput calls of checks that went alone, out now.
        self._alone = 0
        # Calls and checks sent (what batching saves shows in their ratio); CheckInputs calls.
        self.calls = 0
        self.checks = 0
        self.batched = 0

    @property
    def max_checks(self) -> int:
        """Checks sent in one call at most now."""
        return self._max_checks

    @property
    def queued(self) -> int:
        """Checks waiting for a call."""
        return sum(not p.future.done() for p in self._queue)

    async def check(self, request: policy_pb2.CheckInputRequest) -> Verdict:
        """The verdict on the current request's input and its tenant's ``policy`` version (0:
        not reported). Raises ``grpc.aio.AioRpcError`` as a call of its own would, or
        :class:`Unsupported` when the policy service has no ``CheckInputs``."""
        if not self.supported:
            raise Unsupported()
        if not self._queue and self._out() < self._calls:
            return await self._check_alone(request)
        ctx = rc.current()
        loop = asyncio.get_running_loop()
        check = policy_pb2.InputCheck(
            tenant=ctx.tenant,
            request_id=ctx.request_id,
            input=request,
            traceparent=outgoing_traceparent(ctx),
        )
        pending = _Pending(check, loop.create_future(), ctx.deadline, check.ByteSize())
        self._queue.append(pending)
        self._pump()
        remaining = ctx.time_remaining()
        expiry = None if remaining is None else loop.call_later(remaining, _expire, pending.future)
        try:
            return await pending.future
        finally:
            if expiry is not None:
                expiry.cancel()
            # Cancelled or expired while queued: the next call leaves it out.
            pending.future.cancel()

    async def _check_alone(self, request: policy_pb2.CheckInputRequest) -> Verdict:
        self._alone += 1
        self.calls += 1
        self.checks += 1
        try:
            return await check_input_call(self._stub, request)
        finally:
            self._alone -= 1
            if self._queue:
                self._pump()

    def _out(self) -> int:
        return len(self._tasks) + self._alone

    def _pump(self) -> None:
        """Sends what queued while fewer than ``calls`` calls are out."""
        while self._queue and self._out() < self._calls:
            batch = self._take()
            if not batch:
                return
            task = asyncio.get_running_loop().create_task(self._call(batch), context=contextvars.Context())
            self._tasks.add(task)
            task.add_done_callback(self._done)

    def _take(self) -> list[_Pending]:
        batch: list[_Pending] = []
        size = 0
        while self._queue and len(batch) < self._max_checks:
            pending = self._queue[0]
            if pending.future.done():
                self._queue.popleft()
                continue
            if batch and size + pending.size > MAX_CALL_BYTES:
                break
            batch.append(self._queue.popleft())
            size += pending.size
        return batch

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._queue:
            self._pump()

    async def _call(self, batch: list[_Pending]) -> None:
        deadlines = [p.deadline for p in batch if p.deadline is not None]
        timeout = None if len(deadlines) < len(batch) else max(0.0, max(deadlines) - time.monotonic())
        self.calls += 1
        self.checks += len(batch)
        self.batched += 1
        CALLS.inc()
        CHECKS.inc(len(batch))
        call = self._stub.CheckInputs(
            policy_pb2.CheckInputsRequest(checks=[p.check for p in batch]), timeout=timeout
        )
        answered = 0
        try:
            # One response per check, in order, each as soon as its check is done.
            async for result in call:
                if answered == len(batch):
                    call.cancel()  # more responses than checks: nothing to give them to
                    break
                pending = batch[answered]
                answered += 1
                if pending.future.done():
                    continue
                if result.error_code:
                    code = _CODES.get(result.error_code, grpc.StatusCode.INTERNAL)
                    pending.future.set_exception(broken(result.error, code))
                else:
                    pending.future.set_result((result.verdict, result.policy_version))
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT and answered == 0 and len(batch) > 1:
                # Refused as a whole, nothing checked: again, in smaller calls.
                self._max_checks = max(1, min(self._max_checks, len(batch) // 2))
                log.warning(
                    "the policy service refused %d input checks in one call (%s); sending at most %d "
                    "per call (set LLMESH_GATEWAY_POLICY_MAX_CHECKS_PER_CALL to its limit)",
                    len(batch),
                    exc.details(),
                    self._max_checks,
                )
                self._queue.extendleft(reversed([p for p in batch if not p.future.done()]))
                return
            error: Exception = exc
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                self.supported = False
                error = Unsupported()
            _fail(batch[answered:], error)
            if not self.supported:
                queued, self._queue = self._queue, deque()
                _fail(queued, Unsupported())
            return
        except BaseException:
            call.cancel()
            _fail(batch, broken("the gateway is closing"))
            raise
        if answered < len(batch):
            _fail(batch[answered:], broken(f"CheckInputs answered {answered} of {len(batch)} checks"))

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def check_input_call(
    stub: policy_pb2_grpc.PolicyServiceAsyncStub, request: policy_pb2.CheckInputRequest
) -> Verdict:
    """A CheckInput call of the current request's own (the interceptors carry its tenant,
    deadline, trace and versions, and take in its trailers): the verdict and the ``policy``
    version the trailers name (0: none)."""
    call = stub.CheckInput(request)
    reply = await call
    trailers = dict(await call.trailing_metadata() or ())
    versions = rc.parse_versions(str(trailers.get(rc.CACHE_VERSION, "")))
    return reply, versions.get(namespaces.POLICY, 0)


def _fail(batch: Iterable[_Pending], error: Exception) -> None:
    for pending in batch:
        if not pending.future.done():
            pending.future.set_exception(error)


def _expire(future: asyncio.Future[Verdict]) -> None:
    if not future.done():
        future.set_exception(
            broken("the input check passed the request's deadline", grpc.StatusCode.DEADLINE_EXCEEDED)
        )
