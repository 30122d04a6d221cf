"""WatchPrefixes on the real engine: the prefixes a replica reports come from vLLM's own KV events."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import grpc
import pytest
from llmesh.v1 import common_pb2 as c
from llmesh.v1 import inference_pb2 as pb
from llmesh.v1 import inference_pb2_grpc as pbg

from gateway.routing.prefix import conversation_text, prefix_blocks
from services.inference.engine import CPU_BLOCK_SIZE
from services.inference.kv_holdings import key_depths

pytestmark = pytest.mark.slow

BLOCK_CHARS = 256


@pytest.fixture
async def stub(inference_address: str) -> AsyncIterator[pbg.InferenceServiceAsyncStub]:
    channel = grpc.aio.insecure_channel(inference_address)
    yield pbg.InferenceServiceStub(channel)
    await channel.close()


def request(system: str, question: str) -> tuple[pb.GenerateRequest, list[int]]:
    """A chat request carrying the gateway's prefix keys for it, and those keys."""
    messages = [
        c.ChatMessage(role=c.ROLE_SYSTEM, content=system),
        c.ChatMessage(role=c.ROLE_USER, content=question),
    ]
    text = conversation_text([("system", system), ("user", question)])
    keys = prefix_blocks(text, BLOCK_CHARS, 16)
    route = pb.RoutePrefix(keys=keys, block_chars=BLOCK_CHARS, text_chars=len(text))
    return (
        pb.GenerateRequest(messages=messages, sampling=c.SamplingParams(max_tokens=2), route_prefix=route),
        keys,
    )


class Watch:
    """A WatchPrefixes stream applied to a set, as a gateway keeps it."""

    def __init__(self, stub: pbg.InferenceServiceAsyncStub) -> None:
        self.call = stub.WatchPrefixes(pb.WatchPrefixesRequest())
        self.held: set[int] = set()
        self.first: pb.WatchPrefixesResponse | None = None
        self.last = pb.WatchPrefixesResponse()

    async def until(self, wanted: set[int], timeout_s: float = 30.0) -> pb.WatchPrefixesResponse:
        """Reads changes until every wanted key is held; the last message read."""

        async def read() -> pb.WatchPrefixesResponse:
            while self.first is None or not wanted <= self.held:
                reply = await self.call.read()
                assert isinstance(reply, pb.WatchPrefixesResponse), "the stream ended"
                if self.first is None:
                    self.first = reply
                if reply.reset:
                    self.held.clear()
                self.held |= set(reply.held)
                self.held -= set(reply.released)
                self.last = reply
            return self.last

        return await asyncio.wait_for(read(), timeout_s)


def long_system(salt: str) -> str:
    words = " ".join(f"{salt}-{i} lantern granite meadow" for i in range(120))
    return f"You answer questions about the archive {salt}. {words}"


async def test_a_served_prompt_is_reported_held_with_every_key(stub: pbg.InferenceServiceAsyncStub) -> None:
    watch = Watch(stub)
    try:
        salt = uuid.uuid4().hex[:8]
        generate, keys = request(long_system(salt), "Summarise it.")
        assert len(keys) >= 8
        assert not set(keys) & watch.held
        reply = await stub.Generate(generate)
        deep = set(keys[len(keys) // 2 :])
        last = await watch.until(deep)
        assert watch.first is not None and watch.first.reset
        assert last.blocks_total > 0 and 0 < last.blocks_held <= last.blocks_total
        held = {k for k in keys if k in watch.held}
        # Exactly the keys whose share of the prompt covers a whole KV block (the engine's, 32
        # tokens on CPU): a key covering less is never held.
        text_chars = generate.route_prefix.text_chars
        depths = key_depths(keys, BLOCK_CHARS, text_chars, reply.usage.prompt_tokens, CPU_BLOCK_SIZE)
        assert held == {k for k, d in zip(keys, depths, strict=True) if d > 0}
        assert held == set(keys[len(keys) - len(held) :])
        # A second prompt on the same system prompt shares its keys up to where the texts part.
        other, other_keys = request(long_system(salt), "List the key terms, please, in order.")
        shared = {a for a, b in zip(keys, other_keys, strict=False) if a == b}
        assert shared & held
        await stub.Generate(other)
        await watch.until(set(other_keys[len(other_keys) // 2 :]))
    finally:
        watch.call.cancel()


async def test_a_new_watcher_starts_from_a_snapshot_of_what_is_held(
    stub: pbg.InferenceServiceAsyncStub,
) -> None:
    generate, keys = request(long_system(uuid.uuid4().hex[:8]), "Summarise it.")
    first = Watch(stub)
    try:
        await stub.Generate(generate)
        await first.until(set(keys[-4:]))
    finally:
        first.call.cancel()
    second = Watch(stub)
    try:
        reply = await second.until(set(keys[-4:]), timeout_s=5.0)
        assert reply.reset, "the keys came in the first (snapshot) message"
    finally:
        second.call.cancel()


async def test_a_bad_route_prefix_is_invalid_argument(stub: pbg.InferenceServiceAsyncStub) -> None:
    generate, _ = request("system", "question")
    generate.route_prefix.block_chars = 0
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Generate(generate)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "route_prefix" in (err.value.details() or "")
