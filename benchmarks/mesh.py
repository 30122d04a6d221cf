"""``llmesh bench mesh``: the whole mesh against ``vllm serve`` and LiteLLM, cache hits, affinity.

Sections (``--sections``, all by default):

* ``overhead``: the shared-prefix chat workload, streamed, at concurrency 1 and 16,
  through the full mesh (gateway -> policy, cache, llmesh inference) and straight to
  ``vllm serve`` on the same model and engine settings, and through the LiteLLM
  proxy in front of that ``vllm serve`` when ``--litellm`` names its executable.
  Rounds alternate the systems so that machine noise hits all of them alike.
  Every request is unique (a nonce), so the response cache misses; every answer
  is exactly ``--max-tokens`` long (``min_tokens``), so token counts match.
* ``cache``: exact response-cache hits over HTTP through the whole pipeline:
  latency at concurrency 1 and hits/s at concurrency 16, through a gateway with local hits
  (``mesh``) and one without (``mesh-remote``: every hit a policy and a cache call) on the same
  services, alternating; CPU µs per hit of each process (gateway, policy, cache, load generator).
* ``affinity``: two inference replicas (one core each) behind two gateways, one
  routing by prefix affinity, one round robin, on many long shared prefixes —
  more than one replica's prefix cache holds, fewer than two hold; mean and p90
  time to first token. Fresh prefixes for every phase.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from benchmarks.harness import BenchReport, percentile
from benchmarks.mesh_load import Child, HttpConnection, StreamResult, free_port
from services.runtime.cli.up import redis_server_argv

MODEL = "smollm2-135m-instruct"
SYSTEM = (
    "You are the support assistant of Northwind Outfitters, a retailer of hiking and camping gear. "
    "Answer briefly and politely. Policies: returns within 30 days with a receipt; store credit after "
    "that; free shipping over 50 dollars; repairs for tents and backpacks in the Portland workshop; "
    "price matching with local stores only; gift cards never expire; loyalty members earn 2 points per "
    "dollar and get early access to sales. Do not invent products. If unsure, offer a human agent. "
) * 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmesh bench mesh", description=__doc__.split("\n")[0])
    parser.add_argument("--sections", default="overhead,cache,affinity")
    parser.add_argument("--levels", default="1,16", help="concurrency levels of the overhead section")
    parser.add_argument("--requests-c1", type=int, default=12)
    parser.add_argument("--requests-c16", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--litellm", default="", help="path of the `litellm` executable (own venv)")
    parser.add_argument(
        "--mtls",
        action="store_true",
        help="overhead section: also a second mesh with mutual TLS on every hop ('mesh-mtls')",
    )
    parser.add_argument(
        "--no-unmoderated",
        dest="unmoderated",
        action="store_false",
        help="overhead section: leave out the gateway without a policy service",
    )
    parser.add_argument("--hits-c1", type=int, default=1000)
    parser.add_argument("--hits-seconds", type=float, default=10.0)
    parser.add_argument(
        "--hits-rounds", type=int, default=2, help="cache section: alternations of the systems"
    )
    # ~1,100 tokens each: 64 of them overflow one replica's default 1 GiB KV cache (~46k
    # tokens of this model) but half of them fit, which is what affinity routing buys.
    parser.add_argument("--prefixes", type=int, default=64)
    parser.add_argument("--prefix-chars", type=int, default=6000)
    parser.add_argument("--affinity-requests", type=int, default=256)
    parser.add_argument("--affinity-concurrency", type=int, default=2)
    return parser


def _chat(question: str, max_tokens: int, stream: bool = True, system: str = SYSTEM) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


async def _phase(
    base: str,
    path: str,
    bodies: list[dict[str, Any]],
    concurrency: int,
    headers: dict[str, str] | None = None,
) -> tuple[list[StreamResult], float]:
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    results: list[StreamResult] = []

    async def worker() -> None:
        conn = HttpConnection(base, headers)
        try:
            while not queue.empty():
                body = queue.get_nowait()
                results.append(await conn.stream_chat(path, body))
        finally:
            await conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results, time.perf_counter() - started


# -- processes ------------------------------------------------------------------------------


class Mesh:
    """cache, policy, inference replicas and gateways as child processes."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.children: list[Child] = []
        self.named: dict[str, Child] = {}
        # What a gateway of the mesh _start_mesh started needs to reach the same services.
        self.upstream_env: dict[str, str] = {}

    def start(self, module: str, name: str, env: dict[str, str]) -> Child:
        print(f"  starting {name} ...", flush=True)
        child = Child.llmesh(module, env, self.logs / f"{name}.log")
        self.children.append(child)
        self.named[name] = child
        return child

    def stop_one(self, name: str) -> None:
        child = self.named.pop(name)
        child.stop()
        self.children.remove(child)

    def gateway(self, name: str, env: dict[str, str]) -> str:
        http_port = free_port()
        self.start(
            "gateway",
            name,
            {"LLMESH_GATEWAY_PORT": "0", "LLMESH_GATEWAY_HTTP_PORT": str(http_port), **env},
        )
        return f"http://127.0.0.1:{http_port}"

    def stop(self) -> None:
        for child in reversed(self.children):
            child.stop()
        self.children.clear()


def _certificates(directory: Path) -> Callable[[str], dict[str, str]]:
    """A CA and one certificate per service identity; returns each identity's TLS environment."""
    from services.runtime import certs

    certs.create_ca(directory)
    for name in ("cache", "policy", "inference", "gateway"):
        certs.issue(directory, name)

    def env(identity: str) -> dict[str, str]:
        return {
            "LLMESH_TLS_CERT_FILE": str(directory / f"{identity}.pem"),
            "LLMESH_TLS_KEY_FILE": str(directory / f"{identity}.key"),
            "LLMESH_TLS_CA_FILE": str(directory / "ca.pem"),
        }

    return env


def _no_tls(_identity: str) -> dict[str, str]:
    return {}


def _start_mesh(mesh: Mesh, suffix: str, tls: Callable[[str], dict[str, str]] = _no_tls) -> str:
    """cache, policy, one inference replica and a gateway; ``tls`` gives each identity's TLS env
    (mutual TLS on every gRPC hop). Returns the gateway's HTTP base URL once it is ready."""
    cache = mesh.start(
        "cache",
        f"cache{suffix}",
        {"LLMESH_CACHE_PORT": "0", "LLMESH_CACHE_SEMANTIC_ENABLED": "false", **tls("cache")},
    )
    policy = mesh.start("policy", f"policy{suffix}", {"LLMESH_POLICY_PORT": "0", **tls("policy")})
    inference = mesh.start(
        "services.inference", f"inference{suffix}", {"LLMESH_INFERENCE_PORT": "0", **tls("inference")}
    )
    mesh.upstream_env = {
        "LLMESH_GATEWAY_INFERENCE_ADDRESSES": inference.address,
        "LLMESH_GATEWAY_CACHE_ADDRESS": cache.address,
        "LLMESH_GATEWAY_POLICY_ADDRESS": policy.address,
        **tls("gateway"),
    }
    base = mesh.gateway(f"gateway{suffix}", mesh.upstream_env)
    asyncio.run(_wait_http(base + "/readyz", mesh.children[-1]))
    return base


# -- section 1: overhead --------------------------------------------------------------------


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (Linux /proc: each thread's children)."""
    found: list[int] = []
    stack = [pid]
    while stack:
        parent = stack.pop()
        try:
            tasks = list(Path(f"/proc/{parent}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                children = [int(c) for c in (task / "children").read_text(encoding="ascii").split()]
            except OSError:
                continue
            found += children
            stack += children
    return found


def _process_cpu(procs: dict[str, int]) -> dict[str, float]:
    """CPU seconds of each named process, and of its descendants as ``<name>_children``."""
    out: dict[str, float] = {}
    for name, pid in procs.items():
        out[name] = _cpu_s(pid)
        total = 0.0
        for child in _descendants(pid):
            try:
                total += _cpu_s(child)
            except OSError:
                continue  # exited in between
        out[f"{name}_children"] = total
    return out


async def _overhead(
    args: argparse.Namespace, targets: dict[str, str], procs: dict[str, dict[str, int]] | None = None
) -> list[dict[str, Any]]:
    """Streamed chat through each target at each concurrency, alternating; ``procs``: the
    processes of a target whose CPU is counted per streamed token at the highest level."""
    levels = [int(x) for x in args.levels.split(",")]
    samples: dict[tuple[str, int], list[StreamResult]] = {}
    walls: dict[tuple[str, int], list[tuple[float, int]]] = {}
    cpu: dict[str, dict[str, float]] = {}
    procs = procs or {}
    headers = {"litellm": {"authorization": "Bearer sk-bench"}}
    for name, base in targets.items():  # warm-up: one request each
        await _phase(base, "/v1/chat/completions", [_chat("Hello", 8)], 1, headers.get(name))
    for round_ in range(args.rounds):
        order = list(targets.items())
        if round_ % 2:
            order.reverse()
        for c in levels:
            for name, base in order:
                n = args.requests_c1 if c == 1 else args.requests_c16
                nonce = uuid.uuid4().hex[:8]
                bodies = [
                    _chat(f"[{nonce}-{i}] Can I return boots after {i + 5} days?", args.max_tokens)
                    for i in range(n)
                ]
                for body in bodies:
                    body["min_tokens"] = args.max_tokens
                counted = c == max(levels) and name in procs
                before = _process_cpu(procs[name]) if counted else {}
                results, wall = await _phase(base, "/v1/chat/completions", bodies, c, headers.get(name))
                if counted:
                    spent = cpu.setdefault(name, {"tokens": 0.0})
                    spent["tokens"] += sum(r.completion_tokens for r in results)
                    for proc, value in _process_cpu(procs[name]).items():
                        spent[proc] = spent.get(proc, 0.0) + value - before[proc]
                samples.setdefault((name, c), []).extend(results)
                walls.setdefault((name, c), []).append((wall, sum(r.completion_tokens for r in results)))
                rate = sum(r.completion_tokens for r in results) / wall
                print(f"  round {round_ + 1} {name:8s} c={c:<3d} {rate:7.1f} tok/s", flush=True)
    rows = []
    for (name, c), results in samples.items():
        ttft = [r.ttft_s * 1000 for r in results]
        tokens = sum(t for _, t in walls[(name, c)])
        wall = sum(w for w, _ in walls[(name, c)])
        rows.append(
            {
                "section": "overhead",
                "system": name,
                "concurrency": c,
                "requests": len(results),
                "tokens_per_s": round(tokens / wall, 2),
                "ttft_p50_ms": round(percentile(ttft, 50), 2),
                "ttft_p99_ms": round(percentile(ttft, 99), 2),
                # Mean time between a stream's tokens after the first: one decode step at c1.
                "decode_step_ms": round(
                    statistics.fmean(
                        (r.total_s - r.ttft_s) * 1000 / (r.completion_tokens - 1)
                        for r in results
                        if r.completion_tokens > 1
                    ),
                    2,
                ),
                **_per_token(cpu.get(name, {}) if c == max(levels) else {}),
            }
        )
    return rows


def _per_token(spent: dict[str, float]) -> dict[str, float]:
    """CPU µs per streamed token by process; ``llmesh``: the mesh's own processes (everything but
    the engine); ``frontend``: a vllm serve's API server process."""
    tokens = spent.pop("tokens", 0.0)
    if not tokens:
        return {}
    out = {
        f"cpu_us_per_token_{proc}": round(value / tokens * 1e6, 1) for proc, value in spent.items() if value
    }
    mesh_procs = ("gateway", "policy", "cache", "inference")
    if any(p in spent for p in mesh_procs):
        out["cpu_us_per_token_llmesh"] = round(sum(spent.get(p, 0.0) for p in mesh_procs) / tokens * 1e6, 1)
    return out


# -- section 2: cache hits ------------------------------------------------------------------


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _hits_c1(base: str, body: dict[str, Any], n: int) -> list[float]:
    conn = HttpConnection(base)
    latencies = []
    try:
        for _ in range(n):
            started = time.perf_counter()
            _, head, _ = await conn.post("/v1/chat/completions", body)
            latencies.append((time.perf_counter() - started) * 1000)
            if head.get("x-cache-status") != "HIT":
                raise RuntimeError(f"a hit turned into {head.get('x-cache-status')} during the measurement")
    finally:
        await conn.close()
    return latencies


async def _hits_c16(base: str, body: dict[str, Any], seconds: float) -> tuple[int, float]:
    stop_at = time.perf_counter() + seconds
    counts: list[int] = []

    async def worker() -> None:
        worker_conn = HttpConnection(base)
        done = 0
        try:
            while time.perf_counter() < stop_at:
                _, head, _ = await worker_conn.post("/v1/chat/completions", body)
                done += head.get("x-cache-status") == "HIT"
        finally:
            counts.append(done)
            await worker_conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(16)))
    return sum(counts), time.perf_counter() - started


async def _cache_hits(
    args: argparse.Namespace, targets: dict[str, str], pids: dict[str, dict[str, int]]
) -> list[dict[str, Any]]:
    """Exact hits through each gateway of ``targets`` (the same cache, policy and engine behind
    them), alternating: latency at c1, hits/s at c16, and the CPU each process spent per hit at
    c16 (``pids``: the processes a target's hit passes through, the load generator included)."""
    body = _chat("What are the store's return rules?", 16, stream=False)
    for base in targets.values():
        conn = HttpConnection(base)
        # The first answer of a cold engine can outlive the cache's single-flight lease (then
        # it is not stored): ask until the entry is there (and, local hits on, kept).
        try:
            hit = False
            for _ in range(6):
                status, head, _ = await conn.post("/v1/chat/completions", body)
                if status != 200:
                    raise RuntimeError(f"warm-up request failed with HTTP {status}")
                hit = head.get("x-cache-status") == "HIT"
            if not hit:
                raise RuntimeError(f"no cache HIT after 6 tries (last {head.get('x-cache-status')})")
        finally:
            await conn.close()
    latencies: dict[str, list[float]] = {name: [] for name in targets}
    totals: dict[str, list[float]] = {name: [0.0, 0.0] for name in targets}  # hits, seconds
    cpu: dict[str, dict[str, float]] = {name: {} for name in targets}
    for _ in range(args.hits_rounds):
        for name, base in targets.items():
            latencies[name] += await _hits_c1(base, body, args.hits_c1 // args.hits_rounds)
        for name, base in targets.items():
            before = {proc: _cpu_s(pid) for proc, pid in pids[name].items()}
            count, seconds = await _hits_c16(base, body, args.hits_seconds / args.hits_rounds)
            totals[name][0] += count
            totals[name][1] += seconds
            for proc, pid in pids[name].items():
                cpu[name][proc] = cpu[name].get(proc, 0.0) + _cpu_s(pid) - before[proc]
    rows: list[dict[str, Any]] = []
    for name in targets:
        hits, elapsed = totals[name]
        per_hit = {
            f"cpu_us_per_hit_{proc}": round(spent / hits * 1e6, 1) for proc, spent in cpu[name].items()
        }
        llmesh_us = sum(v for k, v in per_hit.items() if not k.endswith("_load_generator"))
        rows.append(
            {
                "section": "cache_hits",
                "system": name,
                "concurrency": 1,
                "requests": len(latencies[name]),
                "p50_ms": round(percentile(latencies[name], 50), 3),
                "p99_ms": round(percentile(latencies[name], 99), 3),
                "mean_ms": round(statistics.fmean(latencies[name]), 3),
            }
        )
        rows.append(
            {
                "section": "cache_hits",
                "system": name,
                "concurrency": 16,
                "requests": int(hits),
                "hits_per_s": round(hits / elapsed, 1),
                **per_hit,
                "cpu_us_per_hit_llmesh": round(llmesh_us, 1),
                "hits_per_gateway_cpu_s": round(hits / cpu[name]["gateway"], 1)
                if cpu[name]["gateway"]
                else None,
            }
        )
    return rows


# -- section 3: affinity --------------------------------------------------------------------


def _prefix(i: int, chars: int, salt: str) -> str:
    rng = random.Random(f"{salt}-{i}")
    words = [
        "alpha",
        "river",
        "granite",
        "lantern",
        "orchid",
        "meadow",
        "copper",
        "falcon",
        "harbor",
        "velvet",
    ]
    text = f"Knowledge base {salt}-{i}. "
    while len(text) < chars:
        text += " ".join(rng.choice(words) for _ in range(12)) + ". "
    return text[:chars]


async def _affinity(args: argparse.Namespace, gateways: dict[str, str]) -> list[dict[str, Any]]:
    results: dict[str, list[StreamResult]] = {name: [] for name in gateways}
    for round_ in range(args.rounds):
        order = list(gateways.items()) if round_ % 2 == 0 else list(reversed(gateways.items()))
        for name, base in order:
            salt = uuid.uuid4().hex[:6]
            prefixes = [_prefix(i, args.prefix_chars, salt) for i in range(args.prefixes)]
            rng = random.Random(salt)
            bodies = [
                _chat(f"Question {k}: summarise it.", 4, system=rng.choice(prefixes))
                for k in range(args.affinity_requests)
            ]
            got, _ = await _phase(base, "/v1/chat/completions", bodies, args.affinity_concurrency)
            results[name].extend(got)
            mean_ms = statistics.fmean(r.ttft_s for r in got) * 1000
            print(f"  round {round_ + 1} {name:12s} ttft mean {mean_ms:8.1f} ms", flush=True)
    rows = []
    for name, got in results.items():
        ttft = [r.ttft_s * 1000 for r in got]
        rows.append(
            {
                "section": "affinity",
                "system": name,
                "concurrency": args.affinity_concurrency,
                "requests": len(got),
                "ttft_mean_ms": round(statistics.fmean(ttft), 2),
                "ttft_p90_ms": round(percentile(ttft, 90), 2),
            }
        )
    return rows


# -- orchestration ----------------------------------------------------------------------------


def _find(
    rows: list[dict[str, Any]], section: str, system: str, concurrency: int | None = None
) -> dict[str, Any]:
    for row in rows:
        if (
            row["section"] == section
            and row["system"] == system
            and concurrency in (None, row.get("concurrency"))
        ):
            return row
    return {}


def _headline(rows: list[dict[str, Any]], litellm_reason: str | None) -> dict[str, Any]:
    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 4) if a and b else None

    def diff(a: float | None, b: float | None) -> float | None:
        return round(a - b, 2) if a is not None and b is not None else None

    mesh16, vllm16 = _find(rows, "overhead", "mesh", 16), _find(rows, "overhead", "vllm", 16)
    mesh1, vllm1 = _find(rows, "overhead", "mesh", 1), _find(rows, "overhead", "vllm", 1)
    lite1 = _find(rows, "overhead", "litellm", 1)
    hits1, hits16 = _find(rows, "cache_hits", "mesh", 1), _find(rows, "cache_hits", "mesh", 16)
    remote1, remote16 = (
        _find(rows, "cache_hits", "mesh-remote", 1),
        _find(rows, "cache_hits", "mesh-remote", 16),
    )
    aff, rr = _find(rows, "affinity", "affinity"), _find(rows, "affinity", "round_robin")
    headline: dict[str, Any] = {
        "throughput_ratio_c16": ratio(mesh16.get("tokens_per_s"), vllm16.get("tokens_per_s")),
        # Mutual TLS on every gRPC hop against the same mesh in plaintext, same run (--mtls).
        "mtls_throughput_ratio_c16": ratio(
            _find(rows, "overhead", "mesh-mtls", 16).get("tokens_per_s"), mesh16.get("tokens_per_s")
        ),
        "mtls_ttft_added_p50_ms_c1": diff(
            _find(rows, "overhead", "mesh-mtls", 1).get("ttft_p50_ms"), mesh1.get("ttft_p50_ms")
        ),
        "ttft_added_p50_ms_c1": diff(mesh1.get("ttft_p50_ms"), vllm1.get("ttft_p50_ms")),
        # The same in decode steps of vllm serve at c1 (the word hold-back costs about one).
        "ttft_added_p50_steps_c1": ratio(
            diff(mesh1.get("ttft_p50_ms"), vllm1.get("ttft_p50_ms")), vllm1.get("decode_step_ms")
        ),
        # Without the policy service: the pipeline's own cost (same run).
        "ttft_added_p50_ms_c1_unmoderated": diff(
            _find(rows, "overhead", "mesh-unmoderated", 1).get("ttft_p50_ms"), vllm1.get("ttft_p50_ms")
        ),
        "cpu_us_per_token_llmesh_c16": mesh16.get("cpu_us_per_token_llmesh"),
        "ttft_added_p99_ms_c1": diff(mesh1.get("ttft_p99_ms"), vllm1.get("ttft_p99_ms")),
        "ttft_added_p50_ms_c16": diff(mesh16.get("ttft_p50_ms"), vllm16.get("ttft_p50_ms")),
        "cache_hit_p50_ms_c1": hits1.get("p50_ms"),
        "cache_hit_p99_ms_c1": hits1.get("p99_ms"),
        "cache_hit_rps_c16": hits16.get("hits_per_s"),
        "cache_hit_cpu_us_c16": hits16.get("cpu_us_per_hit_llmesh"),
        "cache_hits_per_gateway_cpu_s": hits16.get("hits_per_gateway_cpu_s"),
        # The same hits with gateway-local hits off (every hit a policy and a cache call), same run.
        "remote_cache_hit_p50_ms_c1": remote1.get("p50_ms"),
        "remote_cache_hit_p99_ms_c1": remote1.get("p99_ms"),
        "remote_cache_hit_rps_c16": remote16.get("hits_per_s"),
        "remote_cache_hit_cpu_us_c16": remote16.get("cpu_us_per_hit_llmesh"),
        "affinity_ttft_ratio": ratio(aff.get("ttft_mean_ms"), rr.get("ttft_mean_ms")),
        "affinity_ttft_p90_ratio": ratio(aff.get("ttft_p90_ms"), rr.get("ttft_p90_ms")),
        "litellm_ttft_added_p50_ms_c1": diff(lite1.get("ttft_p50_ms"), vllm1.get("ttft_p50_ms")),
        "litellm_throughput_ratio_c16": ratio(
            _find(rows, "overhead", "litellm", 16).get("tokens_per_s"), vllm16.get("tokens_per_s")
        ),
    }
    if headline["litellm_ttft_added_p50_ms_c1"] is None:
        headline["litellm_reason"] = litellm_reason or "not measured"
    return headline


def _litellm_config(path: Path, vllm_base: str) -> None:
    path.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: hosted_vllm/{MODEL}\n"
        f"      api_base: {vllm_base}/v1\n"
        "general_settings:\n"
        "  master_key: sk-bench\n",
        encoding="utf-8",
    )


async def _wait_http(url: str, child: Child, timeout_s: float = 300) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            if child.proc.poll() is not None:
                raise RuntimeError(f"process exited ({child.proc.returncode}); log: {child.log}")
            try:
                if (await client.get(url, timeout=2)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.5)  # startup poll of a third-party server's health route
    raise RuntimeError(f"{url} did not answer in time")


async def _wait_redis(url: str) -> None:
    import redis.asyncio as aioredis

    from services.runtime import redis_client

    for _ in range(200):
        client = redis_client.connect(url, socket_connect_timeout=0.5)
        try:
            await client.ping()
            return
        except (OSError, aioredis.RedisError):
            await asyncio.sleep(0.05)  # redis-server has no readiness signal; it answers within ~0.1 s
        finally:
            await client.aclose()
    raise RuntimeError("redis-server did not start")


def _checkpoint(logs: Path, rows: list[dict[str, Any]]) -> None:
    """Rows so far, next to the logs: a run cut short keeps its finished sections."""
    (logs / "rows.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")


def _run_sync(coro: Callable[[], Coroutine[Any, Any, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    return asyncio.run(coro())


def run(argv: list[str]) -> BenchReport:
    from benchmarks.inference import start_vllm, stop, wait_vllm
    from services.inference.config import InferenceSettings

    args = _parser().parse_args(argv)
    sections = set(args.sections.split(","))
    logs = Path(tempfile.mkdtemp(prefix="llmesh-bench-mesh-"))
    print(f"logs in {logs}", flush=True)
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    litellm_reason: str | None = None
    mesh = Mesh(logs)
    # A Redis of its own: other users of a shared Redis (a ruleset reload bumps every
    # tenant's policy version) would turn hits into misses in the middle of a run.
    redis_port = free_port()
    redis = Child(redis_server_argv(redis_port), {}, logs / "redis.log")
    os.environ["REDIS_URL"] = f"redis://127.0.0.1:{redis_port}/0"
    asyncio.run(_wait_redis(os.environ["REDIS_URL"]))
    try:
        if sections & {"overhead", "cache"}:
            base = _start_mesh(mesh, "")
            tls_base = _start_mesh(mesh, "-mtls", _certificates(logs / "certs")) if args.mtls else ""
            if "cache" in sections:
                print("section cache hits", flush=True)
                # A second gateway on the same services with local hits off: every hit is a
                # policy call and a cache call, as before gateway-local hits.
                remote = mesh.gateway(
                    "gateway-remote", {**mesh.upstream_env, "LLMESH_GATEWAY_LOCAL_HITS": "false"}
                )
                asyncio.run(_wait_http(remote + "/readyz", mesh.children[-1]))
                # And one with local hits on Python's own event loop instead of uvloop.
                plain_loop = mesh.gateway(
                    "gateway-asyncio", {**mesh.upstream_env, "LLMESH_GATEWAY_EVENT_LOOP": "asyncio"}
                )
                asyncio.run(_wait_http(plain_loop + "/readyz", mesh.children[-1]))
                systems = {
                    "mesh-remote": ("gateway-remote", remote),
                    "mesh-asyncio": ("gateway-asyncio", plain_loop),
                    "mesh": ("gateway", base),
                }
                pids = {
                    system: {
                        "gateway": mesh.named[gateway].proc.pid,
                        "policy": mesh.named["policy"].proc.pid,
                        "cache": mesh.named["cache"].proc.pid,
                        "load_generator": os.getpid(),
                    }
                    for system, (gateway, _) in systems.items()
                }
                targets = {system: url for system, (_, url) in systems.items()}
                rows += _run_sync(lambda: _cache_hits(args, targets, pids))
                mesh.stop_one("gateway-remote")
                mesh.stop_one("gateway-asyncio")
                _checkpoint(logs, rows)
            if "overhead" in sections:
                settings = InferenceSettings()
                vllm_proc, vllm_base = start_vllm(settings, logs / "vllm.log", logs / "stub")
                lite: Child | None = None
                try:
                    print("  starting vllm serve ...", flush=True)
                    asyncio.run(wait_vllm(vllm_proc, vllm_base))
                    targets = {"vllm": vllm_base, "mesh": base}
                    if args.unmoderated:
                        # The pipeline's own cost: the same mesh without a policy service (no
                        # input check, no output moderation and so no word hold-back).
                        unmoderated_env = {
                            k: v for k, v in mesh.upstream_env.items() if k != "LLMESH_GATEWAY_POLICY_ADDRESS"
                        }
                        targets["mesh-unmoderated"] = mesh.gateway("gateway-unmoderated", unmoderated_env)
                        asyncio.run(_wait_http(targets["mesh-unmoderated"] + "/readyz", mesh.children[-1]))
                    if tls_base:
                        targets["mesh-mtls"] = tls_base
                    if args.litellm:
                        cfg = logs / "litellm.yaml"
                        _litellm_config(cfg, vllm_base)
                        port = free_port()
                        lite = Child(
                            [args.litellm, "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port)],
                            {"LITELLM_LOCAL_MODEL_COST_MAP": "True"},
                            logs / "litellm.log",
                        )
                        try:
                            print("  starting litellm ...", flush=True)
                            asyncio.run(_wait_http(f"http://127.0.0.1:{port}/health/liveliness", lite))
                            targets["litellm"] = f"http://127.0.0.1:{port}"
                        except RuntimeError as exc:
                            litellm_reason = f"LiteLLM did not start: {exc}"
                    else:
                        litellm_reason = (
                            "no --litellm executable given (pip install 'litellm[proxy]' in its own venv)"
                        )
                    print("section overhead", flush=True)
                    procs = {
                        "vllm": {"frontend": vllm_proc.pid},
                        "mesh": {
                            name: mesh.named[name].proc.pid
                            for name in ("gateway", "policy", "cache", "inference")
                        },
                    }
                    rows += _run_sync(lambda: _overhead(args, targets, procs))
                    _checkpoint(logs, rows)
                finally:
                    if lite is not None:
                        lite.stop()
                    stop(vllm_proc)
            mesh.stop()
        if "affinity" in sections:
            print("section affinity", flush=True)
            replicas = [
                mesh.start(
                    "services.inference",
                    f"inference-{i}",
                    {"LLMESH_INFERENCE_PORT": "0", "LLMESH_INFERENCE_OMP_THREADS_BIND": str(i)},
                )
                for i in range(2)
            ]
            addresses = ",".join(r.address for r in replicas)
            gateways = {
                policy: mesh.gateway(
                    f"gateway-{policy}",
                    {"LLMESH_GATEWAY_INFERENCE_ADDRESSES": addresses, "LLMESH_GATEWAY_ROUTE_POLICY": policy},
                )
                for policy in ("affinity", "round_robin")
            }
            for url in gateways.values():
                asyncio.run(_wait_http(url + "/readyz", mesh.children[-1]))
            rows += _run_sync(lambda: _affinity(args, gateways))
            _checkpoint(logs, rows)
    finally:
        mesh.stop()
        redis.stop()
    notes.append(
        "overhead: streamed shared-prefix chat, unique questions (cache misses), "
        f"{args.max_tokens} tokens per answer; mesh = gateway + policy + cache + llmesh inference"
    )
    notes.append(
        "machine shared with other engineers' test runs: figures are noisy; systems alternate per round"
    )
    return BenchReport(name="mesh", rows=rows, headline=_headline(rows, litellm_reason), notes=notes)
