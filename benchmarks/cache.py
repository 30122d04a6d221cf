"""``llmesh bench cache``: Redis floor, exact hits over gRPC, semantic search, stampede.

In one run, against a cache server in its own process (the real ``python -m cache``)
and a Redis of the benchmark's own (or ``--redis-url``):

* the Redis GET floor from the same client process (redis-py asyncio, one small key);
* LookupResponse exact hits over gRPC at concurrency 1 and 16, interleaved in rounds
  with the Redis GETs so machine noise hits both alike;
* the semantic search step at 10k and 100k entries in one partition (HNSW vs an exact
  flat scan, both FAISS), queries and entries from real all-MiniLM-L6-v2 embeddings;
* true- and false-hit rates on the labeled pair set at the configured threshold;
* a 100-way single-flight stampede on one key (how many producers were elected).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from llmesh.v1 import cache_pb2, cache_pb2_grpc, common_pb2

from benchmarks.harness import BenchReport, summarize_ms
from benchmarks.semantic_pairs import Rates, load_pairs, rates, similarities, split, tune
from cache.config import CacheSettings
from cache.vectors import Partition, normalize, set_search_threads
from services.runtime import redis_client

ROOT = Path(__file__).resolve().parents[1]


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="llmesh bench cache")
    parser.add_argument("--redis-url", default="", help="a Redis to use (default: start a throwaway one)")
    parser.add_argument("--requests", type=int, default=3000, help="exact lookups per concurrency level")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds (Redis GET vs lookup)")
    parser.add_argument("--entries", type=int, default=100_000, help="largest semantic partition")
    parser.add_argument("--queries", type=int, default=1000, help="semantic searches per index")
    return parser.parse_args(argv)


@contextlib.contextmanager
def _throwaway_redis(url: str) -> Iterator[str]:
    if url:
        yield url
        return
    import socket
    import tempfile

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix="llmesh-bench-redis-")
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir, "--maxmemory", "1gb", "--maxmemory-policy", "allkeys-lfu"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if "Ready to accept connections" in line:
            break
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


@contextlib.asynccontextmanager
async def _cache_process(redis_url: str) -> AsyncIterator[str]:
    """``python -m cache`` on a free port; yields its address once it prints its ready line."""
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        LLMESH_CACHE_PORT="0",
        LLMESH_CACHE_REDIS_URL=redis_url,
        LLMESH_CACHE_SEMANTIC_ENABLED="false",
        LLMESH_CACHE_TOKENIZER_DIR="/nonexistent",
        LLMESH_CACHE_LOG_LEVEL="WARNING",
        LLMESH_CACHE_LEASE_MS="30000",
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cache", env=env, cwd=ROOT, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdout is not None
    address = ""
    while line := (await proc.stdout.readline()).decode():
        match = re.search(r"LLMESH_READY service=cache port=(\d+)", line)
        if match:
            address = f"127.0.0.1:{match.group(1)}"
            break
    if not address:
        raise RuntimeError(f"cache server exited early ({await proc.wait()})")
    try:
        yield address
    finally:
        proc.terminate()
        await proc.wait()


def _key(text: str) -> cache_pb2.ResponseKey:
    return cache_pb2.ResponseKey(
        model="smollm2-135m-instruct",
        model_revision="bench",
        messages=[
            common_pb2.ChatMessage(role=common_pb2.ROLE_SYSTEM, content="You are a helpful assistant."),
            common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=text),
        ],
        sampling=common_pb2.SamplingParams(temperature=0.0, max_tokens=128),
    )


def _entry(text: str) -> cache_pb2.CachedResponse:
    return cache_pb2.CachedResponse(
        choices=[common_pb2.Completion(index=0, text=text, finish_reason=common_pb2.FINISH_REASON_STOP)],
        usage=common_pb2.Usage(prompt_tokens=30, completion_tokens=60, total_tokens=90),
        model="smollm2-135m-instruct",
    )


MD = [("x-llmesh-tenant", "bench")]


async def _timed_lookups(
    stub: cache_pb2_grpc.ContextCacheServiceAsyncStub,
    request: cache_pb2.LookupResponseRequest,
    n: int,
    concurrency: int,
) -> tuple[list[float], float]:
    samples: list[float] = []
    per_worker = max(1, n // concurrency)

    async def worker() -> None:
        for _ in range(per_worker):
            t0 = time.perf_counter()
            reply = await stub.LookupResponse(request, metadata=MD, timeout=10)
            samples.append(time.perf_counter() - t0)
            if reply.status != common_pb2.CACHE_STATUS_HIT:
                raise RuntimeError(f"expected a HIT, got {reply.status}: {reply.detail}")

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples, time.perf_counter() - started


async def _redis_gets(client: Any, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        await client.get("llmesh:bench:floor")
        samples.append(time.perf_counter() - t0)
    return samples


async def _exact_and_floor(
    args: argparse.Namespace, redis_url: str, address: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    client = redis_client.connect(redis_url)
    await client.set("llmesh:bench:floor", b"x" * 512)
    channel = grpc.aio.insecure_channel(address)
    stub = cache_pb2_grpc.ContextCacheServiceStub(channel)
    key = _key("What is the capital of France?")
    stored = await stub.StoreResponse(
        cache_pb2.StoreResponseRequest(key=key, entry=_entry("Paris is the capital of France. " * 8)),
        metadata=MD,
    )
    if not stored.stored:
        raise RuntimeError(stored.detail)
    request = cache_pb2.LookupResponseRequest(key=key)
    await _timed_lookups(stub, request, 200, 4)  # warm-up: channels, pools, scripts
    await _redis_gets(client, 200)
    per_round = max(1, args.requests // args.rounds)
    gets: list[float] = []
    c1: list[float] = []
    c16: list[float] = []
    c1_time = c16_time = 0.0
    for _ in range(args.rounds):
        gets += await _redis_gets(client, per_round)
        samples, elapsed = await _timed_lookups(stub, request, per_round, 1)
        c1 += samples
        c1_time += elapsed
        samples, elapsed = await _timed_lookups(stub, request, per_round, 16)
        c16 += samples
        c16_time += elapsed
    floor = summarize_ms(gets)
    one = summarize_ms(c1)
    sixteen = summarize_ms(c16)
    rows.append({"case": "redis GET (same client)", "concurrency": 1, **floor})
    rows.append(
        {
            "case": "LookupResponse exact hit (gRPC)",
            "concurrency": 1,
            **one,
            "ops_s": round(len(c1) / c1_time, 1),
        }
    )
    rows.append(
        {
            "case": "LookupResponse exact hit (gRPC)",
            "concurrency": 16,
            **sixteen,
            "ops_s": round(len(c16) / c16_time, 1),
        }
    )
    stampede = await _stampede(stub)
    rows.append({"case": "stampede: 100 lookups, single-flight", "concurrency": 100, "producers": stampede})
    await channel.close()
    await client.aclose()
    headline = {
        "redis_get_p50_ms": floor["p50_ms"],
        "exact_hit_p50_ms_c1": one["p50_ms"],
        "exact_hit_p99_ms_c16": sixteen["p99_ms"],
        "exact_hit_ops_s_c16": round(len(c16) / c16_time, 1),
        "exact_over_redis_p50_ratio": round(one["p50_ms"] / floor["p50_ms"], 2),
        "stampede_producers": stampede,
    }
    return rows, headline


async def _stampede(stub: cache_pb2_grpc.ContextCacheServiceAsyncStub) -> int:
    key = _key(f"stampede {time.time_ns()}")
    request = cache_pb2.LookupResponseRequest(key=key, single_flight=True, wait_ms=20_000)
    producers = 0

    async def one() -> None:
        nonlocal producers
        reply = await stub.LookupResponse(request, metadata=MD, timeout=30)
        if reply.lease_token:
            producers += 1
            await asyncio.sleep(0.2)  # stands in for the generation the producer runs
            await stub.StoreResponse(
                cache_pb2.StoreResponseRequest(key=key, entry=_entry("once"), lease_token=reply.lease_token),
                metadata=MD,
            )
        elif reply.status != common_pb2.CACHE_STATUS_HIT:
            raise RuntimeError(f"a waiter got {reply.status}: {reply.detail}")

    await asyncio.gather(*(one() for _ in range(100)))
    return producers


def _rates_row(case: str, result: Rates) -> dict[str, Any]:
    return {
        "case": case,
        "true_hit": round(result.true_hit_rate, 3),
        "false_hit": round(result.false_hit_rate, 3),
        "pairs": result.paraphrases + result.near_misses,
    }


def _semantic(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any], list[str]]:
    from cache.embedder import LocalEmbedder

    embedder = LocalEmbedder()
    set_search_threads(CacheSettings.model_fields["semantic_search_threads"].default)
    pairs = load_pairs()
    va = embedder.embed_sync([p.a for p in pairs])
    vb = embedder.embed_sync([p.b for p in pairs])
    sims = similarities(pairs, va, vb)
    threshold = CacheSettings.model_fields["semantic_threshold"].default
    everything = rates(pairs, sims, threshold)
    unguarded = rates(pairs, sims, threshold, guarded=False)
    dev_pairs, dev_sims = split(pairs, sims, held_out=False)
    test_pairs, test_sims = split(pairs, sims, held_out=True)
    tuned = tune(dev_pairs, dev_sims)
    held_tuned = rates(test_pairs, test_sims, tuned)
    held_default = rates(test_pairs, test_sims, threshold)
    rows = [
        _rates_row(f"pair set ({len(pairs)} pairs), threshold {threshold}, guarded", everything),
        _rates_row(f"pair set, threshold {threshold}, no guard", unguarded),
        _rates_row(f"held-out half, threshold tuned on the other half ({tuned})", held_tuned),
        _rates_row(f"held-out half, threshold {threshold}", held_default),
    ]
    # Index entries: the pair-set sentences plus perturbed copies (real embedding geometry,
    # 100k distinct vectors); queries: the paraphrase halves.
    base = np.concatenate([va, vb])
    rng = np.random.default_rng(0)
    queries = vb[rng.integers(0, len(vb), args.queries)]
    headline: dict[str, Any] = {
        "semantic_true_hit_rate": round(everything.true_hit_rate, 4),
        "semantic_false_hit_rate": round(everything.false_hit_rate, 4),
        "semantic_threshold": threshold,
    }
    for size in (10_000, args.entries):
        noise = rng.normal(scale=0.35 / np.sqrt(base.shape[1]) * 6, size=(size, base.shape[1]))
        vectors = normalize(base[rng.integers(0, len(base), size)] + noise.astype(np.float32))
        for kind, hnsw_min in (("hnsw", 1), ("flat", size + 1)):
            part = Partition(vectors.shape[1], hnsw_min)
            set_search_threads(os.cpu_count() or 1)  # a bulk build may use every core
            t0 = time.perf_counter()
            part.add_many([(f"d{i}", "", vectors[i]) for i in range(size)])
            build_s = time.perf_counter() - t0
            set_search_threads(CacheSettings.model_fields["semantic_search_threads"].default)
            # The exact scan at 100k is slow enough that a fifth of the queries tells the story.
            sample = queries if kind == "hnsw" else queries[: max(50, len(queries) // 5)]
            wall, cpu = [], []
            for q in sample:
                t1, c1 = time.perf_counter(), time.thread_time()
                part.search(q, 4)
                wall.append(time.perf_counter() - t1)
                cpu.append(time.thread_time() - c1)
            wall_stats, cpu_stats = summarize_ms(wall), summarize_ms(cpu)
            rows.append(
                {
                    "case": f"semantic search, {kind}, wall",
                    "entries": size,
                    "build_s": round(build_s, 2),
                    **wall_stats,
                }
            )
            rows.append({"case": f"semantic search, {kind}, thread CPU", "entries": size, **cpu_stats})
            if kind == "hnsw":
                label = f"{size // 1000}k"
                headline[f"semantic_search_p99_ms_{label}"] = cpu_stats["p99_ms"]
                headline[f"semantic_search_wall_p99_ms_{label}"] = wall_stats["p99_ms"]
    notes = [
        "semantic index: vectors are the pair-set embeddings plus Gaussian-perturbed copies (distinct, same "
        "geometry); the search step is FAISS HNSW (M=32, efSearch=64, 1 thread) in one partition; flat is "
        "the exact scan it replaces above 4096 entries",
        "semantic_search_p99_ms_* is the p99 of the search step's thread CPU time (what the index costs); "
        "semantic_search_wall_p99_ms_* is the wall-clock p99 of the same calls, which on this oversubscribed "
        "host (load average ~20 on 2 cores) is dominated by scheduler preemption (compare the Redis GET p99)",
        f"false hits at the threshold: ids {list(everything.false_hits)}",
        "the guard's word lists were written while looking at this pair set; the held-out rows only "
        "guard the threshold choice against overfitting",
    ]
    return rows, headline, notes


async def _run_async(args: argparse.Namespace) -> BenchReport:
    with _throwaway_redis(args.redis_url) as redis_url:
        async with _cache_process(redis_url) as address:
            rows, headline = await _exact_and_floor(args, redis_url, address)
    sem_rows, sem_headline, notes = await asyncio.to_thread(_semantic, args)
    headline.update(sem_headline)
    ordered: dict[str, Any] = {
        key: headline.pop(key)
        for key in (
            "redis_get_p50_ms",
            "exact_hit_p50_ms_c1",
            "exact_hit_p99_ms_c16",
            "semantic_true_hit_rate",
            "semantic_false_hit_rate",
            "semantic_search_p99_ms_100k",
            "stampede_producers",
        )
        if key in headline
    }
    ordered.update(headline)
    notes.insert(
        0,
        "cache server in its own process (python -m cache), client in the bench process; 2-core host "
        "shared with other work, so figures are noisy: GETs and lookups alternate in rounds",
    )
    return BenchReport(name="cache", rows=rows + sem_rows, headline=ordered, notes=notes)


def run(argv: list[str]) -> BenchReport:
    """Runs the cache benchmark (see the module docstring)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return asyncio.run(_run_async(_parse(argv)))
