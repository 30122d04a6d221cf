"""GenerateStreams (many streams over one call) on the real vLLM engine and the default model."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import pytest
from llmesh.v1 import common_pb2 as c
from llmesh.v1 import inference_pb2 as pb
from llmesh.v1 import inference_pb2_grpc as pbg

from tests.fixtures.inference import prefill
from tests.integration.inference.test_service import idle, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
async def stub(inference_address: str) -> AsyncIterator[pbg.InferenceServiceAsyncStub]:
    channel = grpc.aio.insecure_channel(inference_address)
    yield pbg.InferenceServiceStub(channel)
    await channel.close()


def streamed(text: str, **sampling: object) -> pb.GenerateStreamRequest:
    return pb.GenerateStreamRequest(
        messages=[c.ChatMessage(role=c.ROLE_USER, content=text)],
        sampling=c.SamplingParams(**sampling),  # type: ignore[arg-type]
    )


@dataclass
class Stream:
    text: str = ""
    ids: set[str] = field(default_factory=set)
    messages: int = 0
    tokens: int = 0
    ended: bool = False
    code: int = 0
    error: str = ""
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    over: asyncio.Event = field(default_factory=asyncio.Event)


class Call:
    """One GenerateStreams call: orders in, parts sorted by stream."""

    def __init__(self, stub: pbg.InferenceServiceAsyncStub) -> None:
        self._orders: asyncio.Queue[pb.GenerateStreamsRequest | None] = asyncio.Queue()
        self.call = stub.GenerateStreams(self._requests(), timeout=300)
        self.streams: dict[int, Stream] = defaultdict(Stream)
        # How many streams each response message carried parts of.
        self.spread: list[int] = []
        self._reader = asyncio.ensure_future(self._read())

    async def _requests(self) -> AsyncIterator[pb.GenerateStreamsRequest]:
        while (message := await self._orders.get()) is not None:
            yield message

    async def _read(self) -> None:
        async for reply in self.call:
            self.spread.append(len({part.stream for part in reply.parts}))
            for part in reply.parts:
                stream = self.streams[part.stream]
                if part.end:
                    stream.ended, stream.code, stream.error = True, part.error_code, part.error
                    stream.over.set()
                else:
                    stream.messages += 1
                    stream.ids.add(part.message.id)
                    stream.text += "".join(d.text for d in part.message.deltas)
                    stream.tokens += sum(len(d.token_ids) for d in part.message.deltas)
                    stream.arrived.set()

    def send(self, *orders: pb.StreamOrder) -> None:
        self._orders.put_nowait(pb.GenerateStreamsRequest(orders=orders))

    async def end(self) -> None:
        self._orders.put_nowait(None)
        await self._reader
        assert await self.call.code() == grpc.StatusCode.OK


async def test_streams_over_one_call_match_their_own_calls_and_share_messages(
    stub: pbg.InferenceServiceAsyncStub, inference_address: str
) -> None:
    await wait_until(lambda: idle(stub))
    alone = streamed("Count from 1 to 9, one number per line.", max_tokens=16, temperature=0)
    await prefill(inference_address, alone.messages)
    expected = ""
    async for message in stub.GenerateStream(alone, timeout=120):
        expected += "".join(d.text for d in message.deltas)

    call = Call(stub)
    call.send(pb.StreamOrder(stream=1, start=alone, request_id="mux-alone"))
    await asyncio.wait_for(call.streams[1].over.wait(), 120)
    # Alone in the engine, greedy: exactly what its own call streamed.
    assert (call.streams[1].code, call.streams[1].text) == (0, expected)
    assert call.streams[1].ids == {next(iter(call.streams[1].ids))}
    assert next(iter(call.streams[1].ids)).startswith("gen-mux-alone-")

    # Four at once (batched decoding: their texts may differ in the last bits from a lone run).
    together = [streamed(f"Count from {i} to {i + 8}.", max_tokens=16, min_tokens=16) for i in range(4)]
    call.send(*(pb.StreamOrder(stream=i + 2, start=r, request_id=f"mux-{i}") for i, r in enumerate(together)))
    for i in range(2, 6):
        await asyncio.wait_for(call.streams[i].over.wait(), 120)
    await call.end()
    for i in range(2, 6):
        stream = call.streams[i]
        assert (stream.code, stream.error) == (0, "")
        assert stream.tokens == 16 and stream.text
        (engine_id,) = stream.ids
        assert engine_id.startswith(f"gen-mux-{i - 2}-")
    # They decode together: their tokens of a step travel in one message.
    assert max(call.spread) >= 2, call.spread
    total = sum(s.messages + 1 for s in call.streams.values())
    assert len(call.spread) < total


async def test_an_error_a_cancel_or_a_deadline_ends_only_its_stream(
    stub: pbg.InferenceServiceAsyncStub,
) -> None:
    await wait_until(lambda: idle(stub))
    long = streamed("Tell me a very long story.", max_tokens=2000, min_tokens=2000)
    call = Call(stub)
    call.send(
        pb.StreamOrder(stream=1, start=long),
        pb.StreamOrder(stream=2, start=streamed("hi", temperature=-1.0)),
        pb.StreamOrder(stream=3, start=long, timeout_ms=1500),
        pb.StreamOrder(stream=4, start=streamed("Say hello.", max_tokens=4)),
    )
    await asyncio.wait_for(call.streams[1].arrived.wait(), 120)
    bad = call.streams[2]
    await asyncio.wait_for(bad.over.wait(), 60)
    assert bad.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "temperature" in bad.error

    late = call.streams[3]
    await asyncio.wait_for(late.over.wait(), 60)
    assert late.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
    assert "deadline" in late.error

    short = call.streams[4]
    await asyncio.wait_for(short.over.wait(), 60)
    assert short.code == 0 and short.text

    # Stream 1 is still generating; cancelling it aborts its engine request.
    assert not call.streams[1].ended
    info = await stub.GetModelInfo(pb.GetModelInfoRequest())
    assert info.unfinished_requests == 1
    call.send(pb.StreamOrder(stream=1, cancel=True))
    await wait_until(lambda: idle(stub))

    # The call still serves new streams, and a number in use is refused for both.
    call.send(pb.StreamOrder(stream=5, start=long))
    await asyncio.wait_for(call.streams[5].arrived.wait(), 60)
    call.send(pb.StreamOrder(stream=5, start=streamed("again")))
    await asyncio.wait_for(call.streams[5].over.wait(), 60)
    assert call.streams[5].code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "already open" in call.streams[5].error
    await wait_until(lambda: idle(stub))
    await call.end()
    assert not call.streams[1].ended  # a cancelled stream gets no part after the cancel
