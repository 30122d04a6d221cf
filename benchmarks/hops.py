"""``llmesh bench hops``: what llmesh's interceptors cost per hop.

A chain of relay servers (raw bytes over generic handlers, no service logic):
the client calls relay 1, which calls relay 2, ... which calls the leaf. With
N relays a request crosses N + 1 gRPC hops. Every configuration — 0, 1 and 3
relays, with and without llmesh's interceptors (server interceptor on every
server, client interceptors on every channel, a request context with realistic
metadata at the client) — runs in the same process, interleaved in rounds, so
machine noise hits all of them alike.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from benchmarks.harness import BenchReport, percentile, summarize_ms
from services.runtime import context as rc
from services.runtime.channels import channel_options, connect
from services.runtime.server import RunningServer, ServiceBinding, build_server
from services.runtime.settings import ServiceSettings

SERVICE = "llmesh.bench.Relay"
UNARY = f"/{SERVICE}/Unary"
STREAM = f"/{SERVICE}/Stream"
PAYLOAD = b"x" * 64


def _identity(b: bytes) -> bytes:
    return b


class Relay:
    """Forwards to the next server, or answers when it is the leaf."""

    def __init__(self, channel: grpc.aio.Channel | None) -> None:
        self._unary = channel.unary_unary(UNARY, _identity, _identity) if channel else None
        self._stream = channel.unary_stream(STREAM, _identity, _identity) if channel else None

    async def unary(self, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        if self._unary is None:
            return request
        return await self._unary(request)

    async def stream(
        self, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        if self._stream is None:
            for _ in range(int(request)):
                yield PAYLOAD
            return
        async for message in self._stream(request):
            yield message

    def binding(self) -> ServiceBinding:
        handler = grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Unary": grpc.unary_unary_rpc_method_handler(self.unary, _identity, _identity),
                "Stream": grpc.unary_stream_rpc_method_handler(self.stream, _identity, _identity),
            },
        )
        return ServiceBinding(
            SERVICE, lambda _s, server: server.add_generic_rpc_handlers((handler,)), self, reflect=False
        )


@dataclass
class Chain:
    relays: int
    intercepted: bool
    servers: list[RunningServer]
    channels: list[grpc.aio.Channel]
    entry: grpc.aio.Channel

    @property
    def label(self) -> str:
        return f"{self.relays} relays, {'llmesh interceptors' if self.intercepted else 'plain grpc'}"

    async def close(self) -> None:
        for channel in [self.entry, *self.channels]:
            await channel.close()
        for server in self.servers:
            await server.stop(0)


async def _channel(address: str, intercepted: bool) -> grpc.aio.Channel:
    if intercepted:
        return await connect(address)
    return grpc.aio.insecure_channel(address, options=channel_options())


async def build_chain(relays: int, intercepted: bool) -> Chain:
    servers: list[RunningServer] = []
    channels: list[grpc.aio.Channel] = []
    upstream: grpc.aio.Channel | None = None
    for _ in range(relays + 1):  # the leaf first, then each relay in front of it
        server = await build_server(
            ServiceSettings(port=0), [Relay(upstream).binding()], interceptors=intercepted
        )
        servers.append(server)
        upstream = await _channel(server.address, intercepted)
        channels.append(upstream)
    assert upstream is not None
    return Chain(relays, intercepted, servers, channels[:-1], channels[-1])


def _client_context() -> rc.RequestContext:
    return rc.new_context(
        tenant="bench", floors={"session:s-1": 1795000000000000}, max_age_ms=60_000, semantic=False
    )


async def _unary_round(chain: Chain, calls: int) -> list[float]:
    call = chain.entry.unary_unary(UNARY, _identity, _identity)
    samples = []
    for _ in range(calls):
        token = rc.activate(_client_context()) if chain.intercepted else None
        started = time.perf_counter()
        await call(PAYLOAD, timeout=30)
        samples.append(time.perf_counter() - started)
        if token is not None:
            rc.deactivate(token)
    return samples


async def _stream_round(chain: Chain, messages: int) -> float:
    call = chain.entry.unary_stream(STREAM, _identity, _identity)
    token = rc.activate(_client_context()) if chain.intercepted else None
    started = time.perf_counter()
    received = 0
    async for _ in call(str(messages).encode(), timeout=60):
        received += 1
    elapsed = time.perf_counter() - started
    if token is not None:
        rc.deactivate(token)
    assert received == messages
    return received / elapsed


async def measure(rounds: int, calls: int, messages: int, relay_counts: list[int]) -> BenchReport:
    chains = [await build_chain(n, i) for n in relay_counts for i in (False, True)]
    unary: dict[str, list[float]] = {c.label: [] for c in chains}
    stream: dict[str, list[float]] = {c.label: [] for c in chains}
    try:
        for chain in chains:  # warm-up: connections, caches
            await _unary_round(chain, 50)
            await _stream_round(chain, 100)
        for r in range(rounds):
            order = chains if r % 2 == 0 else list(reversed(chains))
            for chain in order:
                unary[chain.label].extend(await _unary_round(chain, calls))
                stream[chain.label].append(await _stream_round(chain, messages))
    finally:
        for chain in chains:
            await chain.close()

    rows: list[dict[str, Any]] = []
    p50: dict[tuple[int, bool], float] = {}
    for chain in chains:
        stats = summarize_ms(unary[chain.label])
        p50[(chain.relays, chain.intercepted)] = stats["p50_ms"]
        rows.append(
            {
                "relays": chain.relays,
                "grpc_hops": chain.relays + 1,
                "interceptors": "llmesh" if chain.intercepted else "none",
                "unary_p50_ms": stats["p50_ms"],
                "unary_p99_ms": stats["p99_ms"],
                "unary_calls": stats["n"],
                "stream_msgs_per_s": round(percentile(stream[chain.label], 50), 1),
            }
        )
    per_hop = {n: (p50[(n, True)] - p50[(n, False)]) / (n + 1) for n in relay_counts if (n, True) in p50}
    deepest = max(relay_counts)
    headline = {
        # The median of the per-hop figures of every depth: robust to one noisy configuration.
        "interceptor_overhead_p50_ms_per_hop": round(statistics.median(per_hop.values()), 4),
        "unary_p50_ms_0hop": p50[(0, True)],
        "unary_p50_ms_3hop": p50[(deepest, True)],
        "unary_p50_ms_0hop_plain": p50[(0, False)],
        "unary_p50_ms_3hop_plain": p50[(deepest, False)],
        "overhead_p50_ms_per_hop_by_depth": {str(n): round(v, 4) for n, v in per_hop.items()},
    }
    notes = [
        "N relays = N + 1 gRPC hops; overhead per hop = (p50 with - p50 without) / (N + 1); "
        "the headline is the median over the depths.",
        "One process, one event loop: client, relays and leaf share the CPU, so a hop's cost is "
        "its whole CPU cost (client + server side).",
        f"{rounds} interleaved rounds of {calls} sequential unary calls and one {messages}-message stream "
        "per configuration.",
    ]
    return BenchReport("hops", rows, headline, notes)


def run(argv: list[str]) -> BenchReport:
    parser = argparse.ArgumentParser(prog="llmesh bench hops")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--messages", type=int, default=2000)
    args = parser.parse_args(argv)
    return asyncio.run(measure(args.rounds, args.calls, args.messages, [0, 1, 3]))
