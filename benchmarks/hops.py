"""``llmesh bench hops``: what llmesh's interceptors cost per hop.

A chain of relay servers (raw bytes over generic handlers, no service logic):
the client calls relay 1, which calls relay 2, ... which calls the leaf. With
N relays a request crosses N + 1 gRPC hops. Every configuration — 0, 1 and 3
relays, with and without llmesh's interceptors (server interceptor on every
server, client interceptors on every channel, a request context with realistic
metadata at the client), and with the interceptors over mutual TLS (every server
requires a client certificate, every hop authorised by the caller's identity) —
runs in the same process, interleaved in rounds, so machine noise hits all of
them alike.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from benchmarks.harness import BenchReport, percentile, summarize_ms
from services.runtime import certs
from services.runtime import context as rc
from services.runtime.authz import GATEWAY, allow
from services.runtime.channels import channel_options, connect
from services.runtime.server import RunningServer, ServiceBinding, build_server
from services.runtime.settings import ServiceSettings
from services.runtime.tls import TLSSettings

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
            SERVICE,
            lambda _s, server: server.add_generic_rpc_handlers((handler,)),
            self,
            reflect=False,
            # Under mutual TLS every hop presents the gateway's certificate.
            access={"Unary": allow(GATEWAY), "Stream": allow(GATEWAY)},
        )


# The three configurations: plain grpc, llmesh's interceptors, llmesh's interceptors over mTLS.
MODES = ("none", "llmesh", "llmesh+mtls")


@dataclass
class Chain:
    relays: int
    mode: str
    servers: list[RunningServer]
    channels: list[grpc.aio.Channel]
    entry: grpc.aio.Channel

    @property
    def intercepted(self) -> bool:
        return self.mode != "none"

    @property
    def label(self) -> str:
        return f"{self.relays} relays, {self.mode}"

    async def close(self) -> None:
        for channel in [self.entry, *self.channels]:
            await channel.close()
        for server in self.servers:
            await server.stop(0)


def mtls_settings(directory: Path) -> TLSSettings:
    """A CA and a ``gateway`` certificate in ``directory``, used by every server and channel."""
    certs.create_ca(directory)
    issued = certs.issue(directory, GATEWAY)
    return TLSSettings(
        cert_file=str(issued.cert), key_file=str(issued.key), ca_file=str(directory / "ca.pem")
    )


async def _channel(address: str, mode: str, tls: TLSSettings) -> grpc.aio.Channel:
    if mode == "none":
        return grpc.aio.insecure_channel(address, options=channel_options())
    return await connect(address, tls=tls if mode == "llmesh+mtls" else TLSSettings())


async def build_chain(relays: int, mode: str, tls: TLSSettings) -> Chain:
    servers: list[RunningServer] = []
    channels: list[grpc.aio.Channel] = []
    upstream: grpc.aio.Channel | None = None
    server_tls = tls if mode == "llmesh+mtls" else TLSSettings()
    for _ in range(relays + 1):  # the leaf first, then each relay in front of it
        server = await build_server(
            ServiceSettings(port=0),
            [Relay(upstream).binding()],
            interceptors=mode != "none",
            tls=server_tls,
        )
        servers.append(server)
        upstream = await _channel(f"127.0.0.1:{server.port}", mode, tls)
        channels.append(upstream)
    assert upstream is not None
    return Chain(relays, mode, servers, channels[:-1], channels[-1])


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
    with tempfile.TemporaryDirectory(prefix="llmesh-hops-certs-") as directory:
        tls = mtls_settings(Path(directory))
        chains = [await build_chain(n, mode, tls) for n in relay_counts for mode in MODES]
        return await _measure(chains, rounds, calls, messages, relay_counts)


async def _measure(
    chains: list[Chain], rounds: int, calls: int, messages: int, relay_counts: list[int]
) -> BenchReport:
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
    p50: dict[tuple[int, str], float] = {}
    for chain in chains:
        stats = summarize_ms(unary[chain.label])
        p50[(chain.relays, chain.mode)] = stats["p50_ms"]
        rows.append(
            {
                "relays": chain.relays,
                "grpc_hops": chain.relays + 1,
                "interceptors": "none" if chain.mode == "none" else "llmesh",
                "mtls": chain.mode == "llmesh+mtls",
                "unary_p50_ms": stats["p50_ms"],
                "unary_p99_ms": stats["p99_ms"],
                "unary_calls": stats["n"],
                "stream_msgs_per_s": round(percentile(stream[chain.label], 50), 1),
            }
        )

    def hop_cost(mode: str, base: str) -> dict[int, float]:
        return {n: (p50[(n, mode)] - p50[(n, base)]) / (n + 1) for n in relay_counts}

    per_hop = hop_cost("llmesh", "none")
    tls_per_hop = hop_cost("llmesh+mtls", "llmesh")
    deepest = max(relay_counts)
    headline = {
        # The median of the per-hop figures of every depth: robust to one noisy configuration.
        "interceptor_overhead_p50_ms_per_hop": round(statistics.median(per_hop.values()), 4),
        "unary_p50_ms_0hop": p50[(0, "llmesh")],
        "unary_p50_ms_3hop": p50[(deepest, "llmesh")],
        "unary_p50_ms_0hop_plain": p50[(0, "none")],
        "unary_p50_ms_3hop_plain": p50[(deepest, "none")],
        "overhead_p50_ms_per_hop_by_depth": {str(n): round(v, 4) for n, v in per_hop.items()},
        # What mutual TLS adds on top of the interceptors, per hop (same median rule).
        "mtls_overhead_p50_ms_per_hop": round(statistics.median(tls_per_hop.values()), 4),
        "unary_p50_ms_3hop_mtls": p50[(deepest, "llmesh+mtls")],
        "mtls_overhead_p50_ms_per_hop_by_depth": {str(n): round(v, 4) for n, v in tls_per_hop.items()},
    }
    notes = [
        "N relays = N + 1 gRPC hops; overhead per hop = (p50 with - p50 without) / (N + 1); "
        "the headline is the median over the depths. mTLS overhead: llmesh+mtls against llmesh "
        "(P-256 certificates from services/runtime/certs.py, TLS 1.3, connections kept open).",
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
