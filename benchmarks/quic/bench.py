"""``llmesh bench quic``: gRPC over TCP vs gRPC over the QUIC tunnel on the emulated link.

Layout (root and /dev/net/tun needed)::

    netns A: measuring process ── TCP ──────────────┐        netns B: echo gRPC server (0.0.0.0)
             (gRPC client + QUIC client endpoint)   ├─ link ─▶        + QUIC server endpoint
                                  └── QUIC/UDP ─────┘  (delay, jitter, loss: linkemu)

The echo server and the measuring client each run in their own process inside their namespace (so
gRPC's own sockets live there too), and the link emulator in a third. For every link condition the
client alternates TCP and QUIC batches (unary round trips, then timed server-streaming transfers),
so machine noise hits both sides alike; ratios are the figures to read.

Conditions: clean (0 ms), 20 ± 10 ms RTT, 20 ± 10 ms with 2 % loss. Jitter is netem-style (each
packet's delay drawn independently, so packets reorder) unless ``--fifo-jitter``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import BenchReport, percentile

logger = logging.getLogger(__name__)

_READY = "BENCH_READY"


# -- worker: the server side (netns B) -----------------------------------------------------------


async def _serve(args: argparse.Namespace) -> None:
    from benchmarks.quic.echo import start_echo_server
    from services.runtime.quic import QuicSettings, start_server_endpoint

    echo = await start_echo_server(host="0.0.0.0", port=0)
    settings = QuicSettings(
        cert_file=str(Path(args.certs) / "inference.pem"), key_file=str(Path(args.certs) / "inference.key")
    )
    endpoint = await start_server_endpoint(echo.target, f"{args.listen}:0", settings)
    print(f"{_READY} grpc={echo.port} quic={endpoint.port}", flush=True)
    loop = asyncio.get_running_loop()
    stop = loop.create_future()

    def on_stdin() -> None:
        if not stop.done():
            stop.set_result(None)

    loop.add_reader(sys.stdin.fileno(), on_stdin)
    await stop  # stdin closes when the parent is done
    await endpoint.close()
    await echo.server.stop(0)


# -- worker: the measuring client (netns A) ------------------------------------------------------


async def _unary_batch(stub: Any, count: int, payload: bytes) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        await stub.unary(payload, timeout=30)
        samples.append(time.perf_counter() - started)
    return samples


async def _stream_rate(stub: Any, total: int, size: int, cap_s: float) -> float:
    """MB/s of one server-streaming call of ``total`` bytes (cancelled after ``cap_s`` if slower)."""
    from benchmarks.quic.echo import stream_request

    call = stub.stream(stream_request(max(1, total // size), size), timeout=cap_s + 30)
    received = 0
    started = time.perf_counter()
    async for message in call:
        received += len(message)
        if time.perf_counter() - started >= cap_s:
            call.cancel()  # its unread bytes still drain through the connection before the next call
            break
    return received / (time.perf_counter() - started) / 1e6


async def _measure(args: argparse.Namespace) -> None:
    import grpc

    from benchmarks.quic.echo import CHANNEL_OPTIONS, EchoClient
    from services.runtime.quic import QuicSettings, close_client_endpoints, get_client_endpoint

    # The server endpoint requires a client certificate; the bench's one certificate serves.
    settings = QuicSettings(
        ca_file=str(Path(args.certs) / "ca.pem"),
        cert_file=str(Path(args.certs) / "inference.pem"),
        key_file=str(Path(args.certs) / "inference.key"),
    )
    endpoint = await get_client_endpoint(args.quic, settings)
    channels = {
        "tcp": grpc.aio.insecure_channel(args.tcp, options=CHANNEL_OPTIONS),
        "quic": grpc.aio.insecure_channel(endpoint.address, options=CHANNEL_OPTIONS),
    }
    stubs = {name: EchoClient(channel) for name, channel in channels.items()}
    payload = b"x" * args.payload
    for stub in stubs.values():  # connect and warm up both
        await _unary_batch(stub, 5, payload)
    unary: dict[str, list[float]] = {"tcp": [], "quic": []}
    rates: dict[str, list[float]] = {"tcp": [], "quic": []}
    per_round = max(1, args.unary // args.rounds)
    for round_no in range(args.rounds):
        order = ("tcp", "quic") if round_no % 2 == 0 else ("quic", "tcp")
        for name in order:
            unary[name].extend(await _unary_batch(stubs[name], per_round, payload))
    for round_no in range(args.stream_rounds):
        order = ("tcp", "quic") if round_no % 2 == 0 else ("quic", "tcp")
        for name in order:
            total = int(args.stream_mb * 1e6)
            rates[name].append(await _stream_rate(stubs[name], total, args.message, args.stream_seconds))
    conn = await endpoint.connection()
    loss = conn._quic._loss
    result = {
        "unary": unary,
        "rates": rates,
        "quic_state": {
            "srtt_ms": round(loss._rtt_smoothed * 1000, 2),
            "cwnd_bytes": loss.congestion_window,
            "spurious_losses": getattr(loss, "spurious_losses", 0),
        },
    }
    for channel in channels.values():
        await channel.close()
    await close_client_endpoints()
    print(json.dumps(result), flush=True)


# -- orchestration ----------------------------------------------------------------------------


def _worker(ns: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", ns, sys.executable, "-m", "benchmarks.quic.bench", *args]


def _start_server(ns: str, certs: Path, listen: str) -> tuple[subprocess.Popen[str], int, int]:
    proc = subprocess.Popen(
        _worker(ns, "serve", "--certs", str(certs), "--listen", listen),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 60.0)
    line = proc.stdout.readline().strip() if ready else ""
    if not line.startswith(_READY):
        proc.kill()
        raise RuntimeError(f"bench server did not start: {line!r}")
    fields = dict(part.split("=") for part in line.split()[1:])
    return proc, int(fields["grpc"]), int(fields["quic"])


def _row(condition: str, data: dict[str, Any]) -> dict[str, Any]:
    tcp_u, quic_u = data["unary"]["tcp"], data["unary"]["quic"]
    tcp_r, quic_r = statistics.median(data["rates"]["tcp"]), statistics.median(data["rates"]["quic"])
    row = {
        "link": condition,
        "tcp_p50_ms": round(percentile(tcp_u, 50) * 1000, 2),
        "quic_p50_ms": round(percentile(quic_u, 50) * 1000, 2),
        "tcp_p99_ms": round(percentile(tcp_u, 99) * 1000, 2),
        "quic_p99_ms": round(percentile(quic_u, 99) * 1000, 2),
        "p99_ratio": round(percentile(quic_u, 99) / percentile(tcp_u, 99), 3),
        "tcp_MBps": round(tcp_r, 2),
        "quic_MBps": round(quic_r, 2),
        "MBps_ratio": round(quic_r / tcp_r, 3) if tcp_r else float("nan"),
        "unary_n": len(quic_u),
    }
    row.update({f"quic_{k}": v for k, v in data["quic_state"].items()})
    return row


def run(argv: list[str]) -> BenchReport:
    """Run the comparison on an emulated link and return the report (``llmesh bench quic``)."""
    from benchmarks.quic.linkemu import EmulatedLink, LinkSpec, unavailable_reason
    from services.runtime import certs

    parser = argparse.ArgumentParser(prog="llmesh bench quic")
    parser.add_argument("--unary", type=int, default=400, help="unary calls per transport and condition")
    parser.add_argument("--rounds", type=int, default=8, help="alternating unary batches")
    parser.add_argument("--payload", type=int, default=256, help="unary message bytes")
    parser.add_argument("--stream-rounds", type=int, default=4)
    parser.add_argument("--stream-mb", type=float, default=16.0, help="bytes per streaming call (MB)")
    parser.add_argument("--stream-mb-loss", type=float, default=2.0, help="the same on the lossy link")
    parser.add_argument("--stream-seconds", type=float, default=15.0, help="cap per streaming call")
    parser.add_argument("--message", type=int, default=64 * 1024, help="streamed message bytes")
    parser.add_argument("--fifo-jitter", action="store_true", help="jitter without reordering")
    parser.add_argument("--quick", action="store_true", help="fewer samples (smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.unary, args.rounds, args.stream_rounds, args.stream_mb, args.stream_mb_loss = 80, 4, 2, 4, 1
    reason = unavailable_reason()
    if reason is not None:
        raise SystemExit(f"llmesh bench quic: {reason}")
    reorder = not args.fifo_jitter
    conditions = [
        ("clean", LinkSpec()),
        ("20±10ms", LinkSpec(rtt_ms=20, jitter_ms=10, reorder=reorder)),
        ("20±10ms 2% loss", LinkSpec(rtt_ms=20, jitter_ms=10, loss=0.02, reorder=reorder)),
    ]
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp, EmulatedLink(conditions[0][1]) as link:
        cert_dir = Path(tmp)
        certs.cli(["create", "--dir", tmp, "--service", "inference", "--san", link.addr_b])
        os.chmod(tmp, 0o755)
        server, grpc_port, quic_port = _start_server(link.ns_b, cert_dir, link.addr_b)
        try:
            for name, spec in conditions:
                link.set(spec)
                measure = _worker(
                    link.ns_a, "measure", "--certs", tmp,
                    "--tcp", f"{link.addr_b}:{grpc_port}",
                    "--quic", f"quic://{link.addr_b}:{quic_port}?server_name=inference",
                    "--unary", str(args.unary), "--rounds", str(args.rounds), "--payload", str(args.payload),
                    "--stream-rounds", str(args.stream_rounds), "--stream-seconds", str(args.stream_seconds),
                    "--stream-mb", str(args.stream_mb_loss if spec.loss else args.stream_mb),
                    "--message", str(args.message),
                )  # fmt: skip
                done = subprocess.run(measure, capture_output=True, text=True, timeout=900, check=False)
                if done.returncode != 0:
                    raise RuntimeError(f"measuring {name} failed:\n{done.stderr[-4000:]}")
                results[name] = json.loads(done.stdout.strip().splitlines()[-1])
                print(f"measured {name}", file=sys.stderr, flush=True)
        finally:
            if server.stdin is not None:
                server.stdin.close()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
            if server.stdout is not None:
                server.stdout.close()
    rows = [_row(name, results[name]) for name, _ in conditions]
    clean, jitter, lossy = rows
    headline = {
        "unary_p99_ratio_loss": lossy["p99_ratio"],
        "stream_throughput_ratio_20ms": jitter["MBps_ratio"],
        "clean_added_p50_ms": round(clean["quic_p50_ms"] - clean["tcp_p50_ms"], 3),
    }
    notes = [
        "goals: unary_p99_ratio_loss <= 0.5, stream_throughput_ratio_20ms >= 0.8, clean_added_p50_ms <= 2",
        f"jitter: {'independent per packet (reordering, netem-like)' if reorder else 'FIFO (no reordering)'}",
        f"unary: {args.unary} x {args.payload} B calls per transport and link, in {args.rounds} "
        f"alternating batches; streaming: {args.stream_rounds} alternating calls of {args.stream_mb:g} MB "
        f"({args.stream_mb_loss:g} MB on the lossy link) in {args.message} B messages, capped at "
        f"{args.stream_seconds:g} s, median MB/s; each transport keeps one gRPC connection",
        "TCP = grpc.aio over kernel TCP across the same emulated link; QUIC = the same channel through "
        "the llmesh QUIC tunnel (client and server endpoints in the measuring and serving processes)",
    ]
    return BenchReport(name="quic", rows=rows, headline=headline, notes=notes)


def main(argv: list[str] | None = None) -> int:
    """Worker entry (``python -m benchmarks.quic.bench serve|measure``) or the whole bench."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["serve"], ["measure"]):
        parser = argparse.ArgumentParser()
        parser.add_argument("mode")
        parser.add_argument("--certs", required=True)
        parser.add_argument("--listen", default="0.0.0.0")
        parser.add_argument("--tcp", default="")
        parser.add_argument("--quic", default="")
        for name in ("--unary", "--rounds", "--payload", "--stream-rounds", "--message"):
            parser.add_argument(name, type=int, default=1)
        parser.add_argument("--stream-seconds", type=float, default=1.0)
        parser.add_argument("--stream-mb", type=float, default=1.0)
        args = parser.parse_args(argv)
        logging.basicConfig(level=logging.WARNING)
        # Streams the client cancels after its timed read make grpc log a failed write; expected here.
        logging.getLogger("grpc._cython.cygrpc").setLevel(logging.CRITICAL)
        asyncio.run(_serve(args) if args.mode == "serve" else _measure(args))
        return 0
    run(argv).write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
