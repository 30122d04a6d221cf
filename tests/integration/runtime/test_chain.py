"""Context, versions, deadlines, errors and traces across a chain of three real gRPC servers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.runtime import context as rc
from services.runtime.channels import connect
from services.runtime.server import RunningServer, build_server
from services.runtime.settings import ServiceSettings
from tests.fixtures.context import activated
from tests.fixtures.spans import capture_spans
from tests.integration.runtime.chain import BIDI, CALL, STREAM, ChainServicer


def _identity(b: bytes) -> bytes:
    return b


@pytest.fixture(scope="module")
def spans() -> InMemorySpanExporter:
    return capture_spans()


@pytest.fixture(scope="module")
async def chain(spans: InMemorySpanExporter) -> AsyncIterator[list[RunningServer]]:
    servers: list[RunningServer] = []
    next_address: str | None = None
    for hop in (3, 2, 1):
        running = await build_server(ServiceSettings(port=0), [ChainServicer(hop, next_address).binding()])
        servers.insert(0, running)
        next_address = running.address
    yield servers
    for running in servers:
        await running.stop(0)


@pytest.fixture
async def channel(chain: list[RunningServer]) -> AsyncIterator[grpc.aio.Channel]:
    ch = grpc.aio.insecure_channel(chain[0].address)
    yield ch
    await ch.close()


METADATA = (
    ("x-request-id", "req-123"),
    ("x-llmesh-tenant", "acme"),
    ("x-llmesh-cache-version", "session:s1=41,7"),
    ("x-llmesh-max-age", "5000"),
    ("x-llmesh-no-store", "1"),
    ("x-llmesh-semantic", "on"),
)


def _check_views(views: list[dict[str, Any]]) -> None:
    assert [v["hop"] for v in views] == [1, 2, 3]
    for view in views:
        assert view["request_id"] == "req-123"
        assert view["tenant"] == "acme"
        assert view["floors"] == {"session:s1": 41, "": 7}
        assert view["max_age_ms"] == 5000
        assert view["no_store"] is True
        assert view["semantic"] is True
    remaining = [v["remaining"] for v in views]
    # grpc-timeout is encoded with a few significant digits (rounded up), so the caller
    # uses a sub-second timeout where that rounding is a millisecond.
    assert all(r is not None and 0 < r <= 0.91 for r in remaining)
    # Each hop waits 100 ms before relaying: the next hop's deadline is that much closer.
    assert remaining[0] - remaining[1] >= 0.09
    assert remaining[1] - remaining[2] >= 0.09


async def test_unary_context_reaches_third_hop(channel: grpc.aio.Channel) -> None:
    call = channel.unary_unary(CALL, _identity, _identity)(
        json.dumps(
            {"produce": {"session:s1": 50, "rag:docs": 9}, "status": "HIT", "age_ms": 12, "relay_delay": 0.1}
        ).encode(),
        metadata=METADATA,
        timeout=0.9,
    )
    answer = json.loads(await call)
    _check_views(answer["views"])
    trailers = {k: v for k, v in await call.trailing_metadata() if isinstance(v, str)}
    # Versions produced at hop 3 reach the caller, merged (max) with its own floors.
    assert rc.parse_versions(trailers["x-llmesh-cache-version"]) == {"": 7, "session:s1": 50, "rag:docs": 9}
    assert trailers["x-llmesh-cache-status"] == "HIT"
    assert trailers["x-llmesh-age"] == "12"


async def test_stream_context_reaches_third_hop(channel: grpc.aio.Channel) -> None:
    call = channel.unary_stream(STREAM, _identity, _identity)(
        json.dumps({"count": 4, "produce": {"rag:docs": 99}, "relay_delay": 0.1}).encode(),
        metadata=METADATA,
        timeout=0.9,
    )
    items = [json.loads(m) async for m in call]
    assert [i["i"] for i in items] == [0, 1, 2, 3]
    for item in items:
        _check_views(item["views"])
    trailers = {k: v for k, v in await call.trailing_metadata() if isinstance(v, str)}
    assert rc.parse_versions(trailers["x-llmesh-cache-version"])["rag:docs"] == 99


async def test_context_from_caller_task_propagates(chain: list[RunningServer]) -> None:
    """A client that starts a request (like the gateway) gets merged versions back in its context."""
    ctx = rc.new_context(tenant="t2", floors={"policy": 3})
    with activated(ctx):
        channel = await connect(chain[0].address)
        answer = json.loads(
            await channel.unary_unary(CALL, _identity, _identity)(
                json.dumps({"produce": {"policy": 8}}).encode(), timeout=5
            )
        )
        await channel.close()
    assert all(v["tenant"] == "t2" and v["request_id"] == ctx.request_id for v in answer["views"])
    assert ctx.observed["policy"] == 8


@pytest.mark.parametrize("kind", ["unary", "stream"])
async def test_deadline_at_third_hop_surfaces_at_first(channel: grpc.aio.Channel, kind: str) -> None:
    request = json.dumps({"sleep": 2.0}).encode()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        if kind == "unary":
            await channel.unary_unary(CALL, _identity, _identity)(request, timeout=0.3)
        else:
            async for _ in channel.unary_stream(STREAM, _identity, _identity)(request, timeout=0.3):
                pass
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_one_trace_across_hops(channel: grpc.aio.Channel, spans: InMemorySpanExporter) -> None:
    spans.clear()
    answer = json.loads(await channel.unary_unary(CALL, _identity, _identity)(b"{}", timeout=5))
    trace_ids = {v["trace_id"] for v in answer["views"]}
    assert len(trace_ids) == 1 and trace_ids != {"0" * 32}
    finished = [s for s in spans.get_finished_spans() if s.name == CALL.lstrip("/")]
    assert len(finished) == 3
    assert {f"{s.context.trace_id:032x}" for s in finished} == trace_ids
    # Each hop's span is the child of the previous hop's span.
    by_id = {s.context.span_id: s for s in finished}
    roots = [s for s in finished if s.parent is None or s.parent.span_id not in by_id]
    assert len(roots) == 1


async def test_bidi_stream_through_interceptors(chain: list[RunningServer]) -> None:
    """Bidirectional calls (policy's CheckOutputStream) keep context and versions, written with write()."""
    ctx = rc.new_context(tenant="bidi-t")
    with activated(ctx):
        channel = await connect(chain[0].address)
        call = channel.stream_stream(BIDI, _identity, _identity)(timeout=10)
        replies = []
        for n in (1, 5, 3):
            await call.write(json.dumps({"n": n}).encode())
            reply = await call.read()
            assert isinstance(reply, bytes)
            replies.append(json.loads(reply))
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        await channel.close()
    assert [r["n"] for r in replies] == [1, 5, 3]
    for reply in replies:
        assert [v["hop"] for v in reply["views"]] == [1, 2, 3]
        assert {v["tenant"] for v in reply["views"]} == {"bidi-t"}
    assert ctx.observed["bidi"] == 5
