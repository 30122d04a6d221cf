"""ModerateStreams over real gRPC and a real Redis: many answers on one call, each moderated as
it would be on a CheckOutputStream call of its own, and a refused event closes only its answer."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from llmesh.v1 import policy_pb2

from policy.audit import stream_key
from tests.integration.policy.conftest import Served, serve_policy, tenant_md

pytestmark = pytest.mark.asyncio

TEXTS = {
    1: "Write to bob.smith@example.com or call +1 (202) 555-0143 today. Thanks!",
    2: "Nothing to see here, just a plain answer about boots and returns.",
    3: "Step one: how to build a pipe bomb at home and more",
}


class Mux:
    """A ModerateStreams call driven one request message at a time."""

    def __init__(self, served: Served) -> None:
        self._queue: asyncio.Queue[policy_pb2.ModerateStreamsRequest | None] = asyncio.Queue()
        self.call = served.stub.ModerateStreams(self._requests())

    async def _requests(self) -> Any:
        while (message := await self._queue.get()) is not None:
            yield message

    async def send(self, *events: policy_pb2.StreamEvent) -> list[policy_pb2.StreamStep]:
        self._queue.put_nowait(policy_pb2.ModerateStreamsRequest(events=events))
        reply = await self.call.read()
        assert isinstance(reply, policy_pb2.ModerateStreamsResponse)
        return list(reply.steps)

    async def close(self) -> None:
        self._queue.put_nowait(None)
        assert await self.call.read() is grpc.aio.EOF


def opened(stream: int, delta: str, tenant: str = "acme") -> policy_pb2.StreamEvent:
    return policy_pb2.StreamEvent(
        stream=stream, delta=delta, open=policy_pb2.StreamOpen(tenant=tenant, request_id=f"req-{stream}")
    )


async def per_call(
    served: Served, text: str, tenant: str = "acme"
) -> list[policy_pb2.CheckOutputStreamResponse]:
    async def deltas() -> Any:
        for i in range(0, len(text), 4):
            yield policy_pb2.CheckOutputStreamRequest(delta=text[i : i + 4])
        yield policy_pb2.CheckOutputStreamRequest(end=True)

    return [r async for r in served.stub.CheckOutputStream(deltas(), metadata=tenant_md(tenant))]


async def test_interleaved_answers_are_each_moderated_as_on_a_call_of_their_own(policy: Served) -> None:
    mux = Mux(policy)
    steps: dict[int, list[policy_pb2.StreamStep]] = {n: [] for n in TEXTS}
    tenants = {1: "acme", 2: "globex", 3: "acme"}
    ended: set[int] = set()
    i = 0
    while len(ended) < len(TEXTS):
        events = []
        for n, text in TEXTS.items():
            if n in ended:
                continue
            if i >= len(text):
                events.append(policy_pb2.StreamEvent(stream=n, end=True))
            elif i == 0:
                events.append(opened(n, text[:4], tenants[n]))
            else:
                events.append(policy_pb2.StreamEvent(stream=n, delta=text[i : i + 4]))
        got = await mux.send(*events)
        # One step per event, in the message's order.
        assert [s.stream for s in got] == [e.stream for e in events]
        for s in got:
            assert not s.error_code, s.error
            steps[s.stream].append(s)
            if s.step.final:
                ended.add(s.stream)
        i += 4
    await mux.close()

    for n, text in TEXTS.items():
        alone = await per_call(policy, text, tenants[n])
        released = "".join(s.step.text for s in steps[n])
        final = steps[n][-1].step
        assert released == "".join(r.text for r in alone), n
        assert final.final and final.action == alone[-1].action
        assert final.response_sha256 == hashlib.sha256(released.encode()).hexdigest()
        # The first step says the tenant's policy version (what a call's trailers say).
        assert steps[n][0].policy_version > 0
        assert all(s.policy_version == 0 for s in steps[n][1:])
    assert "bomb" not in "".join(s.step.text for s in steps[3])
    assert [f.rule_id for f in steps[3][-1].step.findings] == ["mass-harm-topics"]
    assert "<EMAIL_1>" in "".join(s.step.text for s in steps[1])


async def test_a_refused_event_closes_only_its_answer(policy: Served) -> None:
    mux = Mux(policy)
    got = await mux.send(
        opened(1, "Hello there, "),
        policy_pb2.StreamEvent(stream=9, delta="no open"),  # never opened
        opened(2, "x", tenant="bad tenant!"),  # not a tenant name
        opened(1, "again"),  # opened twice
        policy_pb2.StreamEvent(stream=4),  # neither delta, end nor cancel
    )
    assert [(s.stream, s.error_code) for s in got] == [
        (1, 0),
        (9, grpc.StatusCode.INVALID_ARGUMENT.value[0]),
        (2, grpc.StatusCode.INVALID_ARGUMENT.value[0]),
        (1, grpc.StatusCode.INVALID_ARGUMENT.value[0]),
        (4, grpc.StatusCode.INVALID_ARGUMENT.value[0]),
    ]
    assert "not open" in got[1].error and "x-llmesh-tenant" in got[2].error and "open already" in got[3].error
    # Stream 1 was closed by its refused second open; stream 5 goes on in the same call.
    (after,) = await mux.send(policy_pb2.StreamEvent(stream=1, delta="more"))
    assert after.error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    (five,) = await mux.send(opened(5, "A fine answer. "))
    assert not five.error_code and five.step.text
    await mux.close()


async def test_the_open_answers_limit_and_the_audit_of_abandoned_answers(
    redis_url: str, ruleset_file: Path, redis_client: Any
) -> None:
    served = await serve_policy(redis_url, ruleset_file, max_streams_per_call=2)
    try:
        mux = Mux(served)
        got = await mux.send(opened(1, "One "), opened(2, "two "), opened(3, "three "))
        assert [s.error_code for s in got] == [0, 0, grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]]
        # A cancel takes no step; it frees a place and is audited as abandoned.
        assert await mux.send(policy_pb2.StreamEvent(stream=1, cancel=True)) == []
        (three,) = await mux.send(opened(3, "three "))
        assert not three.error_code
        await mux.close()  # streams 2 and 3 are still open: abandoned
        assert await served.app.audit.flush(5)
        entries = await redis_client.xrange(stream_key(served.app.settings.audit_key))
        records = [json.loads(fields["record"]) for _, fields in entries]
        abandoned = sorted(r["request_id"] for r in records if r["kind"] == "stream_abandoned")
        assert abandoned == ["req-1", "req-2", "req-3"]
        assert {r["tenant"] for r in records} == {"acme"}
    finally:
        await served.close()


async def test_a_first_word_is_offered_its_ends_and_a_false_taken_one_is_refused(policy: Served) -> None:
    mux = Mux(policy)
    (hello,) = await mux.send(opened(1, "Hello"))
    assert hello.step.text == ""
    assert {a.next: (a.text, a.held_back) for a in hello.step.ahead}[" "] == ("Hello ", 0)
    # Taken: the step answers for the rest of the delta, the offered step counted as released.
    (rest,) = await mux.send(policy_pb2.StreamEvent(stream=1, delta=" there", ahead_taken=True))
    assert not rest.error_code and rest.step.text == "" and rest.step.held_back == len("there")
    (end,) = await mux.send(policy_pb2.StreamEvent(stream=1, end=True))
    whole = "Hello there"
    assert end.step.final and end.step.text == "there"
    assert end.step.response_sha256 == hashlib.sha256(whole.encode()).hexdigest()
    # Nothing offered for the delta's first character: INVALID_ARGUMENT, the answer closed.
    await mux.send(opened(2, "Hel"))
    (bad,) = await mux.send(policy_pb2.StreamEvent(stream=2, delta="lo", ahead_taken=True))
    assert bad.error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "ahead_taken" in bad.error
    await mux.close()

    async def deltas() -> Any:
        yield policy_pb2.CheckOutputStreamRequest(delta="Sure")
        yield policy_pb2.CheckOutputStreamRequest(delta="thing", ahead_taken=True)

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        _ = [r async for r in policy.stub.CheckOutputStream(deltas(), metadata=tenant_md("acme"))]
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "ahead_taken" in str(refused.value.details())
