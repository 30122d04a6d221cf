"""The gateway's streams over shared GenerateStreams calls (gateway/inference_mux.py), through
the inference pool against fake replicas over real gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from llmesh.v1 import common_pb2, inference_pb2

from gateway.inference_mux import MESSAGES, PARTS, GenerationMux
from gateway.upstream_inference import InferencePool
from services.runtime import context as rc
from services.runtime.server import RunningServer
from tests.fixtures.fake_inference import FakeInference, start_fake


def ask(text: str, model: str = "") -> inference_pb2.GenerateRequest:
    return inference_pb2.GenerateRequest(
        model=model, messages=[common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=text)]
    )


def text_of(messages: list[Any]) -> str:
    return "".join(d.text for m in messages for d in m.deltas)


@contextlib.asynccontextmanager
async def pool_of(fake: FakeInference, **options: Any) -> AsyncIterator[InferencePool]:
    server: RunningServer = await start_fake(fake)
    pool = InferencePool([server.address], **options)
    await pool.open()
    try:
        yield pool
    finally:
        await pool.close()
        await server.stop(0)


def mux_of(pool: InferencePool) -> GenerationMux:
    mux: GenerationMux = pool.replicas[0].meta["mux"]
    return mux


async def collect(pool: InferencePool, request: inference_pb2.GenerateRequest) -> list[Any]:
    return [m async for m in pool.stream(request, [])]


def counted() -> tuple[float, float]:
    return MESSAGES._value.get(), PARTS._value.get()


async def test_concurrent_streams_share_one_call_and_its_messages() -> None:
    fake = FakeInference("r1")
    async with pool_of(fake) as pool:
        messages, parts = counted()
        answers = await asyncio.gather(*(collect(pool, ask(f"q{i} a b c")) for i in range(8)))
        assert [text_of(a) for a in answers] == [f"echo: q{i} a b c" for i in range(8)]
        assert all(a[-1].usage.completion_tokens == 5 for a in answers)
        assert fake.stream_calls == 1  # one GenerateStreams call carried all eight
        sent = MESSAGES._value.get() - messages
        carried = PARTS._value.get() - parts
        assert carried == 8 * 7  # 5 words, the usage message and the end of each
        assert sent < carried / 4, (sent, carried)


async def test_cancelling_one_stream_aborts_it_and_leaves_the_others() -> None:
    fake = FakeInference("r1", hold=asyncio.Event())
    async with pool_of(fake) as pool:
        first = pool.stream(ask("one two three"), [])
        second = pool.stream(ask("four five six"), [])
        assert text_of([await anext(first)]) == "echo:"
        assert text_of([await anext(second)]) == "echo:"
        await first.aclose()  # type: ignore[attr-defined]  # the client left: the pool cancels its stream
        await asyncio.wait_for(fake.cancel_seen.wait(), 10)
        assert fake.cancelled == 1
        assert fake.hold is not None
        fake.hold.set()
        rest = [m async for m in second]
        assert text_of(rest) == " four five six"
        assert fake.cancelled == 1 and fake.stream_calls == 1


async def test_an_error_ends_only_its_stream() -> None:
    fake = FakeInference("r1")
    async with pool_of(fake) as pool:
        good = asyncio.ensure_future(collect(pool, ask("still here")))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await collect(pool, ask("x", model="no-such-model"))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert "no-such-model" in (caught.value.details() or "")
        assert text_of(await good) == "echo: still here"
        assert fake.stream_calls == 1


async def test_a_replica_without_generate_streams_is_streamed_per_call() -> None:
    fake = FakeInference("r1", multiplexed=False)
    async with pool_of(fake) as pool:
        assert text_of(await collect(pool, ask("old replica"))) == "echo: old replica"
        assert not mux_of(pool).supported
        assert text_of(await collect(pool, ask("again"))) == "echo: again"
        assert fake.stream_calls == 0 and len(fake.calls) == 2


async def test_the_request_deadline_ends_a_stream_the_replica_holds() -> None:
    fake = FakeInference("r1", hold=asyncio.Event())
    async with pool_of(fake) as pool:
        rc.activate(rc.new_context(request_id="late-1", deadline=time.monotonic() + 0.5))
        stream = pool.stream(ask("a b c"), [])
        assert text_of([await anext(stream)]) == "echo:"
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await anext(stream)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await asyncio.wait_for(fake.cancel_seen.wait(), 10)  # the replica's stream was aborted


async def test_lanes_rotate_and_a_retired_lane_ends_after_its_last_stream() -> None:
    fake = FakeInference("r1", hold=asyncio.Event())
    async with pool_of(fake, mux_lane_s=30.0) as pool:
        mux = mux_of(pool)
        first = pool.stream(ask("one two"), [])
        await anext(first)
        old = mux._lane
        assert old is not None
        old.started -= 60  # past its time: the next stream starts a new call
        second = pool.stream(ask("three four"), [])
        await anext(second)
        assert fake.stream_calls == 2 and mux._lane is not old and old.retired
        assert fake.hold is not None
        fake.hold.set()
        assert text_of([m async for m in first]) == " one two"
        await asyncio.wait_for(old.closed(), 10)  # its last stream ended: the call ended
        assert text_of([m async for m in second]) == " three four"
        assert old not in mux._lanes and mux._lane is not None
