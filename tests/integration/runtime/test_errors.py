"""The error table and bad metadata, over a real server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import grpc
import pytest
from llmesh.v1.common_pb2 import VersionStamp

from services.runtime import errors
from services.runtime.server import RunningServer, build_server
from services.runtime.settings import ServiceSettings
from services.runtime.status import STATUS_BY_ERROR
from tests.integration.runtime.chain import CALL, TYPED, TYPED_STREAM, ChainServicer


def _identity(b: bytes) -> bytes:
    return b


@pytest.fixture(scope="module")
async def leaf() -> AsyncIterator[RunningServer]:
    running = await build_server(ServiceSettings(port=0), [ChainServicer(1, None).binding()])
    yield running
    await running.stop(0)


@pytest.fixture
async def call(leaf: RunningServer) -> AsyncIterator[grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]]:
    channel = grpc.aio.insecure_channel(leaf.address)
    yield channel.unary_unary(CALL, _identity, _identity)
    await channel.close()


ERROR_CLASSES = sorted(STATUS_BY_ERROR, key=lambda c: c.__name__)


@pytest.mark.parametrize("error", ERROR_CLASSES, ids=[c.__name__ for c in ERROR_CLASSES])
async def test_each_error_maps_to_its_status(
    call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes], error: type[errors.LlmeshError]
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(json.dumps({"raise": error.__name__}).encode(), timeout=5)
    assert info.value.code() == STATUS_BY_ERROR[error]
    assert info.value.details() == f"{error.__name__} from hop 1"


async def test_unexpected_error_is_internal_without_details(
    call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes],
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(json.dumps({"raise": "boom"}).encode(), metadata=(("x-request-id", "rid-9"),), timeout=5)
    assert info.value.code() == grpc.StatusCode.INTERNAL
    details = info.value.details() or ""
    assert details == "internal error (request id rid-9)"
    assert "passwd" not in details and "Traceback" not in details


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("x-llmesh-max-age", "soon"),
        ("x-llmesh-max-age", "-5"),
        ("x-llmesh-cache-version", "-1"),
        ("x-llmesh-cache-version", "session:a=-3"),
        ("x-llmesh-cache-version", "=4"),
        ("x-llmesh-cache-version", "9" * 30),
        ("x-llmesh-cache-version", ",".join(f"ns{i}=1" for i in range(800))),
        ("x-llmesh-tenant", "t" * 200),
        ("x-llmesh-tenant", "a b"),
        ("x-request-id", "r" * 300),
        ("x-llmesh-no-store", "maybe"),
        ("x-llmesh-semantic", "sometimes"),
    ],
)
async def test_bad_metadata_is_invalid_argument_naming_the_key(
    call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes], key: str, value: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(b"{}", metadata=((key, value),), timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert key in (info.value.details() or "")


async def test_retry_after_travels_in_trailers(call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]) -> None:
    """Domain errors with a retry hint (admission control) say when to retry."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(json.dumps({"raise": "ResourceExhausted", "retry_after": 2}).encode(), timeout=5)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert dict(info.value.trailing_metadata() or ())["retry-after"] == "2"


# Field 1 (namespace, a string) holding bytes that are not UTF-8.
BAD_UTF8 = b"\x0a\x02\xc3\x28"


@pytest.mark.parametrize(
    "payload", [b"\xff\xff\xff\xff", b"\x0a\x10abc", BAD_UTF8], ids=["garbage", "truncated", "utf8"]
)
async def test_undecodable_request_is_invalid_argument(leaf: RunningServer, payload: bytes) -> None:
    async with grpc.aio.insecure_channel(leaf.address) as channel:
        typed = channel.unary_unary(TYPED, _identity, VersionStamp.FromString)
        assert (
            await typed(VersionStamp(namespace="a", version=1).SerializeToString(), timeout=5)
        ).version == 2
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await typed(payload, timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "llmesh.v1.VersionStamp" in (info.value.details() or "")


async def test_undecodable_message_in_a_request_stream(leaf: RunningServer) -> None:
    async with grpc.aio.insecure_channel(leaf.address) as channel:
        call = channel.stream_stream(TYPED_STREAM, _identity, VersionStamp.FromString)(timeout=5)
        await call.write(VersionStamp(namespace="a", version=1).SerializeToString())
        reply = await call.read()
        assert isinstance(reply, VersionStamp)
        assert reply.version == 2
        await call.write(BAD_UTF8)
        await call.done_writing()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.read()
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
