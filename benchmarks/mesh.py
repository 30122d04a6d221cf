"""``llmesh bench mesh``: the whole mesh against ``vllm serve`` and LiteLLM, cache hits, affinity.

Sections (``--sections``, all by default):

* ``overhead``: the shared-prefix chat workload, streamed, at concurrency 1 and 16,
  through the full mesh (gateway -> policy, cache, llmesh inference) and straight to
  ``vllm serve`` on the same model and engine settings, and through the LiteLLM
  proxy in front of that ``vllm serve`` when ``--litellm`` names its executable.
  Rounds alternate the systems so that machine noise hits all of them alike; before
  the first, every system serves ``--warmup-requests`` unmeasured requests at the
  highest level. A host whose speed drifts is measured best in many short rounds
  (``--requests-c16 16``: one wave of 16 answers per phase), each round's ratio a pair.
  Every request is unique (a nonce), so the response cache misses; every answer
  is exactly ``--max-tokens`` long (``min_tokens``), so token counts match.
* ``cache``: exact response-cache hits over HTTP through the whole pipeline:
  latency at concurrency 1 and hits/s at concurrency 16, through a gateway with local hits
  (``mesh``), one without (``mesh-remote``: every hit a policy and a cache call) and one whose
  caller's tenant has request and token rate limits (``mesh-limited``, an API key) on the same
  services, alternating; CPU µs per hit of each process (gateway, policy, cache, load generator).
  With ``--baseline REV`` also that revision's gateway on the same services (``mesh-<commit>``).
* ``affinity``: two inference replicas (one core each) behind two gateways, one
  routing by prefix affinity, one round robin, on many long shared prefixes —
  more than one replica's prefix cache holds, fewer than two hold; mean and p90
  time to first token. Fresh prefixes for every phase.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from benchmarks import baseline
from benchmarks.baseline import Baseline
from benchmarks.harness import BenchReport, percentile, process_cpu_s
from benchmarks.mesh_load import Child, HttpConnection, StreamResult, free_port
from gateway.auth import hash_key
from services.runtime.cli.up import redis_server_argv

MODEL = "smollm2-135m-instruct"
# The cache section's rate-limited caller (gateway "mesh-limited"): a fixed, made-up key of a
# gateway the bench starts on loopback.
LIMITED_KEY = "sk-bench-limited-" + "0" * 32
LIMITED_TENANT = {"requests_per_minute": 1_000_000, "tokens_per_minute": 100_000_000}
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
    parser.add_argument(
        "--language",
        choices=sorted(QUESTIONS),
        default="en",
        help="overhead section: the language of the questions (zh: answers in Chinese)",
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--warmup-requests",
        type=int,
        default=16,
        help="overhead: unmeasured requests to each system at the highest level before the first round "
        "(0: one short request each only)",
    )
    parser.add_argument(
        "--c1-quiet-s",
        type=float,
        default=0.0,
        help="overhead: seconds with nothing in flight before each c1 request (0: back to back). A vLLM "
        "engine's workers keep polling for a second after their last step, so a request right after "
        "another engine's shares the cores with that poll; 1.5 lets it end, and every request then "
        "starts on an idle machine (BENCHMARKS.md, 'a quiet machine for every c1 request')",
    )
    parser.add_argument(
        "--c1-lead-tokens",
        type=int,
        default=0,
        help="overhead: before each measured c1 request (after --c1-quiet-s), one unmeasured request of "
        "this many tokens to the same system, so the measured one follows its own engine's step as in a "
        "steady stream of requests to one server, not another engine's or an idle machine's (0: none)",
    )
    parser.add_argument(
        "--idle-s",
        type=float,
        default=5.0,
        help="overhead: the quiet window before each phase at the highest level (where CPU is counted, "
        "its CPU rate is subtracted: …_net)",
    )
    parser.add_argument(
        "--request-cpu-requests",
        type=int,
        default=64,
        help="overhead: one-token requests to each counted system after the rounds, for its CPU ms "
        "per request by process (0: none)",
    )
    parser.add_argument(
        "--request-cpu-rounds",
        type=int,
        default=4,
        help="overhead: rounds the one-token requests are split into, the systems taking turns",
    )
    parser.add_argument("--litellm", default="", help="path of the `litellm` executable (own venv)")
    parser.add_argument(
        "--mtls",
        action="store_true",
        help="overhead section: also a second mesh with mutual TLS on every hop ('mesh-mtls')",
    )
    parser.add_argument(
        "--baseline",
        default="",
        metavar="REV",
        help="overhead section: also the whole mesh of an earlier revision (git), e.g. 403d559; "
        "cache section: that revision's gateway on the same services",
    )
    parser.add_argument(
        "--no-unmoderated",
        dest="unmoderated",
        action="store_false",
        help="overhead section: leave out the gateway without a policy service",
    )
    parser.add_argument(
        "--sequential",
        action="store_true",
        help="overhead section: also the gateway without a policy service with speculative generation "
        "off ('mesh-unmoderated-sequential': the lookup before the generation)",
    )
    parser.add_argument(
        "--no-ahead",
        dest="no_ahead",
        action="store_true",
        help="overhead section: also the moderated gateway that waits for the policy service's answer "
        "before releasing the first word ('mesh-no-ahead': LLMESH_GATEWAY_MODERATION_AHEAD=false)",
    )
    parser.add_argument(
        "--no-direct",
        dest="no_direct",
        action="store_true",
        help="overhead section: also the gateway without a policy service with direct lookups off "
        "('mesh-unmoderated-no-direct': every miss a cache call)",
    )
    parser.add_argument(
        "--unbatched",
        action="store_true",
        help="overhead section: also the gateway with one CheckInput call per request on the same "
        "services ('mesh-unbatched': input checks not batched)",
    )
    parser.add_argument(
        "--before-check",
        action="store_true",
        help="overhead section: also the gateway whose generation starts beside the input check on "
        "the same services ('mesh-before-check': LLMESH_GATEWAY_GENERATE_BEFORE_INPUT_CHECK=true)",
    )
    parser.add_argument("--hits-c1", type=int, default=1000)
    parser.add_argument("--hits-seconds", type=float, default=10.0)
    parser.add_argument(
        "--hits-rounds", type=int, default=2, help="cache section: alternations of the systems"
    )
    # Affinity: ~700 tokens per prefix; 12 of them (~8,400 tokens) overflow one replica's KV cache
    # capped at 4,608 tokens but fit in both replicas' caches. A miss prefills ~700 tokens (~1 s
    # on one core of the bench hosts), a hit the prefix's last partial block and the question.
    parser.add_argument("--prefixes", type=int, default=12)
    parser.add_argument("--prefix-chars", type=int, default=4500)
    parser.add_argument(
        "--affinity-kv-tokens", type=int, default=4608, help="each replica's KV cache, in tokens"
    )
    parser.add_argument(
        "--affinity-block-size",
        type=int,
        default=0,
        help="tokens per KV block on the replicas (0 = the inference service's default, 32 on CPU)",
    )
    parser.add_argument("--affinity-visits", type=int, default=4, help="measured visits per prefix")
    parser.add_argument("--affinity-rounds", type=int, default=1)
    parser.add_argument("--affinity-concurrency", type=int, default=2)
    parser.add_argument(
        "--affinity-seed",
        type=int,
        default=None,
        help="draws the prompts and their order (default: new each run); a seed replays them, not the "
        "ring split (the replicas' ports, and so their places on the ring, change per run)",
    )
    parser.add_argument(
        "--affinity-systems", default="kv,ring,round_robin", help=f"of {','.join(AFFINITY_SYSTEMS)}"
    )
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

    def start(self, module: str, name: str, env: dict[str, str], build: Baseline | None = None) -> Child:
        print(f"  starting {name} ...", flush=True)
        if build is not None:
            env = {**env, **build.env}
        child = Child.llmesh(module, env, self.logs / f"{name}.log", build.tree if build else None)
        self.children.append(child)
        self.named[name] = child
        return child

    def stop_one(self, name: str) -> None:
        child = self.named.pop(name)
        child.stop()
        self.children.remove(child)

    def gateway(self, name: str, env: dict[str, str], build: Baseline | None = None) -> str:
        http_port = free_port()
        self.start(
            "gateway",
            name,
            {"LLMESH_GATEWAY_PORT": "0", "LLMESH_GATEWAY_HTTP_PORT": str(http_port), **env},
            build,
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


def _start_mesh(
    mesh: Mesh, suffix: str, tls: Callable[[str], dict[str, str]] = _no_tls, build: Baseline | None = None
) -> str:
    """cache, policy, one inference replica and a gateway; ``tls`` gives each identity's TLS env
    (mutual TLS on every gRPC hop); ``build``: an earlier build's tree to run them from. Returns
    the gateway's HTTP base URL once it is ready."""
    cache = mesh.start(
        "cache",
        f"cache{suffix}",
        {"LLMESH_CACHE_PORT": "0", "LLMESH_CACHE_SEMANTIC_ENABLED": "false", **tls("cache")},
        build,
    )
    policy = mesh.start("policy", f"policy{suffix}", {"LLMESH_POLICY_PORT": "0", **tls("policy")}, build)
    inference = mesh.start(
        "services.inference", f"inference{suffix}", {"LLMESH_INFERENCE_PORT": "0", **tls("inference")}, build
    )
    upstream_env = {
        "LLMESH_GATEWAY_INFERENCE_ADDRESSES": inference.address,
        "LLMESH_GATEWAY_CACHE_ADDRESS": cache.address,
        "LLMESH_GATEWAY_POLICY_ADDRESS": policy.address,
        **tls("gateway"),
    }
    if build is None:
        mesh.upstream_env = upstream_env
    base = mesh.gateway(f"gateway{suffix}", upstream_env, build)
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
        out[name] = process_cpu_s(pid)
        total = 0.0
        for child in _descendants(pid):
            try:
                total += process_cpu_s(child)
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
    waves: dict[tuple[str, int], list[tuple[float, float]]] = {}
    procs = procs or {}
    headers = {"litellm": {"authorization": "Bearer sk-bench"}}
    top = max(levels)
    for name, base in targets.items():  # warm-up, unmeasured: every system at its busiest once
        await _phase(base, "/v1/chat/completions", [_chat("Hello", 8)], 1, headers.get(name))
        if args.warmup_requests:
            nonce = uuid.uuid4().hex[:8]
            bodies = [
                _question(nonce, i, args.max_tokens, args.language) for i in range(args.warmup_requests)
            ]
            await _phase(base, "/v1/chat/completions", bodies, top, headers.get(name))
    for round_ in range(args.rounds):
        order = list(targets.items())
        if round_ % 2:
            order.reverse()
        for c in levels:
            if c == 1 and c != max(levels):  # (a phase whose CPU is counted runs as one block)
                # One request to each system in turn (the order flipping every request), so a
                # slow spell of the host lands on all of them alike: each request's TTFT has a
                # partner in every other system (``ttft_added_paired_p50_ms``).
                got = await _c1_interleaved(
                    order,
                    args.requests_c1,
                    args.max_tokens,
                    headers,
                    args.language,
                    quiet_s=args.c1_quiet_s,
                    lead_tokens=args.c1_lead_tokens,
                )
                for name, results in got.items():
                    samples.setdefault((name, 1), []).extend(results)
                    tokens = sum(r.completion_tokens for r in results)
                    busy = sum(r.total_s for r in results)
                    walls.setdefault((name, 1), []).append((busy, tokens))
                    print(f"  round {round_ + 1} {name:8s} c=1   {tokens / busy:7.1f} tok/s", flush=True)
                continue
            for name, base in order:
                n = args.requests_c1 if c == 1 else args.requests_c16
                nonce = uuid.uuid4().hex[:8]
                bodies = [_question(nonce, i, args.max_tokens, args.language) for i in range(n)]
                counted = c == max(levels) and name in procs
                if counted:
                    # What the processes spend with no traffic at all (health checks, watches,
                    # pollers), over a window just before the phase: on a slow engine it is a
                    # large part of the CPU per token, so the net figure leaves it out.
                    idle = await _idle_cpu(procs[name], args.idle_s)
                elif c == max(levels):
                    # The same quiet window before an uncounted phase: what the system before
                    # still does after its last answer must not land on this one alone (behind
                    # 403d559's mesh the unmoderated gateway made ~0.7x in every such round).
                    await asyncio.sleep(args.idle_s)
                before = _process_cpu(procs[name]) if counted else {}
                results, wall = await _phase(base, "/v1/chat/completions", bodies, c, headers.get(name))
                if counted:
                    spent = cpu.setdefault(name, {"tokens": 0.0})
                    spent["tokens"] += sum(r.completion_tokens for r in results)
                    for proc, value in _process_cpu(procs[name]).items():
                        spent[proc] = spent.get(proc, 0.0) + value - before[proc]
                        spent[f"{proc}@idle"] = spent.get(f"{proc}@idle", 0.0) + idle[proc] * wall
                samples.setdefault((name, c), []).extend(results)
                walls.setdefault((name, c), []).append((wall, sum(r.completion_tokens for r in results)))
                if c > 1 and n == c:  # one wave: every request sent at once
                    waves.setdefault((name, c), []).append(_wave_edges_ms(results))
                rate = sum(r.completion_tokens for r in results) / wall
                print(f"  round {round_ + 1} {name:8s} c={c:<3d} {rate:7.1f} tok/s", flush=True)
    per_request = await _request_cpu(args, targets, procs, headers) if args.request_cpu_requests else {}
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
                **_wave_row(waves.get((name, c), [])),
                **(per_request.get(name, {}) if c == max(levels) else {}),
            }
        )
        if c == 1 and name != "vllm" and ("vllm", 1) in samples:
            rows[-1]["ttft_added_paired_p50_ms"] = _paired_p50_ms(results, samples[("vllm", 1)])
        if c > 1 and name != "vllm" and ("vllm", c) in walls:
            rows[-1].update(_round_ratios(walls[(name, c)], walls[("vllm", c)]))
    return rows


def _wave_edges_ms(results: list[StreamResult]) -> tuple[float, float]:
    """The first and the last first token of a wave of requests sent at once, in ms: the engine
    starts a prefill with the requests that have reached it, and one that arrives during it waits
    for it to end, so a wave's last first token shows the requests that missed its first prefill."""
    ttfts = [r.ttft_s * 1000 for r in results if r.completion_tokens]
    return (min(ttfts), max(ttfts)) if ttfts else (math.nan, math.nan)


def _wave_row(edges: list[tuple[float, float]]) -> dict[str, float]:
    """Medians over a system's one-wave phases of their first and last first tokens (none without
    such phases: ``--requests-c16`` above the concurrency)."""
    edges = [(a, b) for a, b in edges if not math.isnan(a)]
    if not edges:
        return {}
    return {
        "wave_first_ttft_p50_ms": round(statistics.median(a for a, _ in edges), 2),
        "wave_last_ttft_p50_ms": round(statistics.median(b for _, b in edges), 2),
    }


def _round_ratios(rounds: list[tuple[float, int]], partners: list[tuple[float, int]]) -> dict[str, Any]:
    """Throughput against ``partners`` (vllm serve) round by round (the same round's phases ran
    back to back), and a 95 % interval of their geometric mean: a host whose speed drifts between
    phases moves one round's ratio, and the interval says how far the headline ratio can be
    trusted (none with fewer than three rounds)."""
    ratios = [
        (t / w) / (pt / pw) for (w, t), (pw, pt) in zip(rounds, partners, strict=False) if w and pw and pt
    ]
    out: dict[str, Any] = {"throughput_ratio_rounds": [round(r, 4) for r in ratios]}
    if len(ratios) >= 3:
        logs = [math.log(r) for r in ratios]
        half = _T95.get(len(logs) - 1, 1.96) * statistics.stdev(logs) / math.sqrt(len(logs))
        mean = statistics.fmean(logs)
        out["throughput_ratio_ci95"] = [round(math.exp(mean - half), 4), round(math.exp(mean + half), 4)]
    return out


# Student's t, two-sided 95 %, by degrees of freedom (larger: 1.96).
_T95 = {2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
        20: 2.086, 25: 2.060, 30: 2.042}  # fmt: skip


# The overhead section's question in each language (``--language``); "zh" asks in Chinese and
# the bench model answers in Chinese, its first words without spaces.
QUESTIONS = {
    "en": "[{nonce}-{i}] Can I return boots after {days} days?",
    "zh": "请用中文回答\uff1a我可以在{days}天后退靴子吗\uff1f\uff08编号 {nonce}-{i}\uff09",
}


def _question(nonce: str, i: int, max_tokens: int, language: str = "en") -> dict[str, Any]:
    """The overhead section's ``i``-th streamed question, new to every cache by its ``nonce``,
    answered with exactly ``max_tokens`` tokens."""
    body = _chat(QUESTIONS[language].format(nonce=nonce, i=i, days=i + 5), max_tokens)
    body["min_tokens"] = max_tokens
    return body


async def _c1_interleaved(
    order: list[tuple[str, str]],
    n: int,
    max_tokens: int,
    headers: dict[str, dict[str, str]],
    language: str = "en",
    *,
    quiet_s: float = 0.0,
    lead_tokens: int = 0,
) -> dict[str, list[StreamResult]]:
    """``n`` streamed requests to each system one at a time, the systems taking turns, each
    after ``quiet_s`` with nothing in flight (``--c1-quiet-s``) and, with ``lead_tokens``, right
    after an unmeasured request of that many tokens to the same system (``--c1-lead-tokens``)."""
    # A nonce per system, all of one length: every prompt is new to its engine (and to the mesh's
    # cache) and as long as its partners in the other systems.
    nonces = {name: uuid.uuid4().hex[:8] for name, _ in order}
    conns = {name: HttpConnection(base, headers.get(name)) for name, base in order}
    got: dict[str, list[StreamResult]] = {name: [] for name, _ in order}
    try:
        for i in range(n):
            names = [name for name, _ in order]
            if i % 2:
                names.reverse()
            for name in names:
                body = _question(nonces[name], i, max_tokens, language)
                await asyncio.sleep(quiet_s)  # (--c1-quiet-s: the engine before may still be polling)
                # The others' turns outlast a server's keep-alive: connect before the clock starts.
                await conns[name].reconnect()
                if lead_tokens:  # its own prompt (a nonce of the same length), never measured
                    lead = _question(nonces[name][::-1], n + i, lead_tokens, language)
                    await conns[name].stream_chat("/v1/chat/completions", lead)
                got[name].append(await conns[name].stream_chat("/v1/chat/completions", body))
    finally:
        for conn in conns.values():
            await conn.close()
    return got


def _paired_p50_ms(results: list[StreamResult], partners: list[StreamResult]) -> float:
    """Median over requests of a request's TTFT less its partner's (same turn, same prompt
    length), in ms: what a system adds, without the host's drift between turns."""
    pairs = zip(results, partners, strict=True)
    return round(statistics.median((r.ttft_s - p.ttft_s) * 1000 for r, p in pairs), 2)


async def _idle_cpu(procs: dict[str, int], window_s: float) -> dict[str, float]:
    """CPU seconds per second each process (and its descendants) spends over ``window_s`` with
    no request in flight anywhere."""
    before, t0 = _process_cpu(procs), time.monotonic()
    await asyncio.sleep(window_s)
    after, elapsed = _process_cpu(procs), time.monotonic() - t0
    return {proc: max(0.0, after[proc] - before[proc]) / elapsed for proc in after}


async def _request_cpu(
    args: argparse.Namespace,
    targets: dict[str, str],
    procs: dict[str, dict[str, int]],
    headers: dict[str, dict[str, str]],
) -> dict[str, dict[str, float]]:
    """CPU ms per request by process: ``--request-cpu-requests`` one-token answers (new
    questions: cache misses) to each system whose processes are counted, at the highest level,
    in ``--request-cpu-rounds`` rounds, the systems taking turns (the order flipping each round)
    so that a drift of the host's speed lands on all of them alike; each phase after the quiet
    window, whose CPU rate is subtracted. What a system spends on a request whatever its length
    (HTTP, input check, lookup, hand-off, store, audit, usage): at c16 the 16 requests of a wave
    arrive and end together, and all of it lands on the cores at once."""
    top = max(int(x) for x in args.levels.split(","))
    counted = [n for n in targets if n in procs]
    rounds = max(1, args.request_cpu_rounds)
    spent: dict[str, dict[str, float]] = {name: {} for name in counted}
    answered = dict.fromkeys(counted, 0)
    path = "/v1/chat/completions"
    for round_ in range(rounds):
        per_round = args.request_cpu_requests // rounds + (round_ < args.request_cpu_requests % rounds)
        for name in reversed(counted) if round_ % 2 else counted:
            idle = await _idle_cpu(procs[name], args.idle_s)
            nonce = uuid.uuid4().hex[:8]
            bodies = [_question(nonce, i, 1, args.language) for i in range(per_round)]
            before = _process_cpu(procs[name])
            results, wall = await _phase(targets[name], path, bodies, top, headers.get(name))
            after = _process_cpu(procs[name])
            answered[name] += sum(1 for r in results if r.status == 200)
            for proc in after:
                used = max(0.0, after[proc] - before[proc] - idle[proc] * wall)
                spent[name][proc] = spent[name].get(proc, 0.0) + used
    out: dict[str, dict[str, float]] = {}
    for name in counted:
        n, net = answered[name], spent[name]
        if not n:
            continue
        row = {f"cpu_ms_per_request_{proc}": round(v / n * 1e3, 3) for proc, v in net.items() if v}
        mesh_procs = [p for p in ("gateway", "policy", "cache", "inference") if p in net]
        if mesh_procs:
            row["cpu_ms_per_request_llmesh"] = round(sum(net[p] for p in mesh_procs) / n * 1e3, 3)
        out[name] = row
        costs = " ".join(f"{k.removeprefix('cpu_ms_per_request_')}={v}" for k, v in row.items())
        print(f"  {name:8s} one-token requests, CPU ms each: {costs}", flush=True)
    return out


def _per_token(spent: dict[str, float]) -> dict[str, float]:
    """CPU µs per streamed token by process; ``llmesh``: the mesh's own processes (everything but
    the engine); ``frontend``: a vllm serve's API server process. ``…_net``: less what the same
    processes spend idle over as long (``<proc>@idle``)."""
    spent = dict(spent)
    tokens = spent.pop("tokens", 0.0)
    if not tokens:
        return {}
    idle = {proc.removesuffix("@idle"): spent.pop(proc) for proc in list(spent) if proc.endswith("@idle")}
    out = {
        f"cpu_us_per_token_{proc}": round(value / tokens * 1e6, 1) for proc, value in spent.items() if value
    }
    out.update(
        {
            f"cpu_us_per_token_{proc}_net": round(max(0.0, value - idle[proc]) / tokens * 1e6, 1)
            for proc, value in spent.items()
            if value and proc in idle
        }
    )
    mesh_procs = ("gateway", "policy", "cache", "inference")
    if any(p in spent for p in mesh_procs):
        out["cpu_us_per_token_llmesh"] = round(sum(spent.get(p, 0.0) for p in mesh_procs) / tokens * 1e6, 1)
        if idle:
            net = sum(max(0.0, spent.get(p, 0.0) - idle.get(p, 0.0)) for p in mesh_procs)
            out["cpu_us_per_token_llmesh_net"] = round(net / tokens * 1e6, 1)
    return out


# -- section 2: cache hits ------------------------------------------------------------------


async def _hits_c1(
    base: str, body: dict[str, Any], n: int, headers: dict[str, str] | None = None
) -> list[float]:
    conn = HttpConnection(base, headers)
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


async def _hits_c16(
    base: str, body: dict[str, Any], seconds: float, headers: dict[str, str] | None = None
) -> tuple[int, float]:
    stop_at = time.perf_counter() + seconds
    counts: list[int] = []

    async def worker() -> None:
        worker_conn = HttpConnection(base, headers)
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
    args: argparse.Namespace,
    targets: dict[str, str],
    pids: dict[str, dict[str, int]],
    headers: dict[str, dict[str, str]] | None = None,
) -> list[dict[str, Any]]:
    """Exact hits through each gateway of ``targets`` (the same cache, policy and engine behind
    them), alternating: latency at c1, hits/s at c16, and the CPU each process spent per hit at
    c16 (``pids``: the processes a target's hit passes through, the load generator included);
    ``headers``: a target's request headers (its API key)."""
    body = _chat("What are the store's return rules?", 16, stream=False)
    headers = headers or {}
    for name, base in targets.items():
        conn = HttpConnection(base, headers.get(name))
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
            latencies[name] += await _hits_c1(base, body, args.hits_c1 // args.hits_rounds, headers.get(name))
        for name, base in targets.items():
            before = {proc: process_cpu_s(pid) for proc, pid in pids[name].items()}
            count, seconds = await _hits_c16(
                base, body, args.hits_seconds / args.hits_rounds, headers.get(name)
            )
            totals[name][0] += count
            totals[name][1] += seconds
            for proc, pid in pids[name].items():
                cpu[name][proc] = cpu[name].get(proc, 0.0) + process_cpu_s(pid) - before[proc]
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


AFFINITY_SYSTEMS = {
    # name: (LLMESH_GATEWAY_ROUTE_POLICY, LLMESH_GATEWAY_ROUTE_KV_EVENTS)
    "kv": ("affinity", "true"),
    "ring": ("ring", "false"),
    "memory": ("affinity", "false"),
    "round_robin": ("round_robin", "false"),
}


def _affinity_row(name: str, phase: str, got: list[StreamResult], concurrency: int) -> dict[str, Any]:
    ttft = [r.ttft_s * 1000 for r in got]
    prompt = sum(r.prompt_tokens for r in got)
    return {
        "section": "affinity",
        "system": name,
        "phase": phase,
        "concurrency": concurrency,
        "requests": len(got),
        "ttft_mean_ms": round(statistics.fmean(ttft), 2),
        "ttft_p50_ms": round(percentile(ttft, 50), 2),
        "ttft_p90_ms": round(percentile(ttft, 90), 2),
        # Share of prompt tokens the engines found in their prefix caches.
        "cached_token_share": round(sum(r.cached_tokens for r in got) / prompt, 4) if prompt else None,
        # Requests that found less than half their prompt cached (prefilled most of it).
        "misses": sum(1 for r in got if r.cached_tokens * 2 < r.prompt_tokens),
    }


def _ring_split(prefixes: list[str], replicas: list[str]) -> str:
    """How the gateways' hash ring splits these system prompts over the replicas ("7/5"): an
    uneven split overflows one replica's KV cache under ring routing, whatever the policy."""
    from llmesh.v1 import common_pb2

    from gateway.config import GatewaySettings
    from gateway.pipeline import _prompt_text
    from gateway.routing.prefix import prefix_blocks
    from gateway.routing.ring import HashRing

    settings = GatewaySettings()
    ring = HashRing(settings.route_virtual_nodes, settings.route_load_factor)
    for replica in replicas:
        ring.add(replica)
    owners: dict[str, int] = dict.fromkeys(replicas, 0)
    for prefix in prefixes:
        message = common_pb2.ChatMessage(role=common_pb2.ROLE_SYSTEM, content=prefix)
        first = prefix_blocks(_prompt_text([message], []), settings.route_block_chars, 1)[0]
        owner = ring.lookup(first, lambda _: 0, replicas)
        if owner is not None:
            owners[owner] += 1
    return "/".join(str(n) for n in owners.values())


def _salts_split_alike(
    names: list[str], args: argparse.Namespace, replicas: list[str], rng: random.Random
) -> dict[str, str]:
    """One salt per system whose prompts the hash ring splits over the replicas alike: the first
    system's salt is drawn at random (so the split is as likely as any), the others are drawn
    until their split matches it. The split decides how many prompts the ring puts on a replica
    that cannot hold them, so systems compared on different splits compare luck."""
    salts: dict[str, str] = {}
    target: str | None = None
    for name in names:
        for _ in range(500):
            salt = f"{rng.getrandbits(32):08x}"
            split = _ring_split([_prefix(i, args.prefix_chars, salt) for i in range(args.prefixes)], replicas)
            if target is None or split == target:
                break
        target = target or split
        salts[name] = salt
    return salts


def _route_counts(base: str) -> dict[str, float]:
    """The gateway's ``llmesh_gateway_route_choices_total`` by reason."""
    import urllib.request

    with urllib.request.urlopen(base + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    counts: dict[str, float] = {}
    prefix = 'llmesh_gateway_route_choices_total{reason="'
    for line in text.splitlines():
        if line.startswith(prefix):
            reason, _, value = line[len(prefix) :].partition('"} ')
            counts[reason] = float(value)
    return counts


async def _affinity(
    args: argparse.Namespace, gateways: dict[str, str], replicas: list[str]
) -> list[dict[str, Any]]:
    """Steady state: each system gets its own prefixes (a working set larger than one replica's
    KV cache, smaller than both; split over the replicas by the hash ring alike for every system
    of a round), visited once each in a warm-up pass (the compulsory misses, reported apart),
    then ``affinity_visits`` times each in a shuffled order (measured)."""
    warm: dict[str, list[StreamResult]] = {name: [] for name in gateways}
    steady: dict[str, list[StreamResult]] = {name: [] for name in gateways}
    splits: dict[str, list[str]] = {name: [] for name in gateways}
    reasons: dict[str, dict[str, int]] = {name: {} for name in gateways}
    seed = uuid.uuid4().int % (1 << 32) if args.affinity_seed is None else args.affinity_seed
    print(f"  affinity seed {seed}", flush=True)
    draw = random.Random(seed)
    for round_ in range(args.affinity_rounds):
        order = list(gateways.items()) if round_ % 2 == 0 else list(reversed(gateways.items()))
        salts = _salts_split_alike(list(gateways), args, replicas, draw)
        for name, base in order:
            salt = salts[name]
            prefixes = [_prefix(i, args.prefix_chars, salt) for i in range(args.prefixes)]
            splits[name].append(_ring_split(prefixes, replicas))
            rng = random.Random(salt)
            first = rng.sample(range(args.prefixes), args.prefixes)
            visits = [i for i in range(args.prefixes) for _ in range(args.affinity_visits)]
            rng.shuffle(visits)
            bodies = [
                _chat(f"Question {k}: summarise it.", 4, system=prefixes[i]) for k, i in enumerate(first)
            ]
            got, _ = await _phase(base, "/v1/chat/completions", bodies, args.affinity_concurrency)
            warm[name].extend(got)
            bodies = [
                _chat(f"Question {k}: summarise it.", 4, system=prefixes[i])
                for k, i in enumerate(visits, 1000)
            ]
            before = await asyncio.to_thread(_route_counts, base)
            got, _ = await _phase(base, "/v1/chat/completions", bodies, args.affinity_concurrency)
            after = await asyncio.to_thread(_route_counts, base)
            chosen = {k: int(v - before.get(k, 0)) for k, v in after.items() if v > before.get(k, 0)}
            for reason, n in chosen.items():
                reasons[name][reason] = reasons[name].get(reason, 0) + n
            steady[name].extend(got)
            mean_ms = statistics.fmean(r.ttft_s for r in got) * 1000
            misses = sum(1 for r in got if r.cached_tokens * 2 < r.prompt_tokens)
            print(
                f"  round {round_ + 1} {name:12s} steady ttft mean {mean_ms:8.1f} ms, "
                f"{misses}/{len(got)} misses, ring split {splits[name][-1]}, routes "
                + ", ".join(f"{k} {v}" for k, v in sorted(chosen.items())),
                flush=True,
            )
    rows = []
    for name in gateways:
        rows.append(
            {
                **_affinity_row(name, "steady", steady[name], args.affinity_concurrency),
                "ring_split": ",".join(splits[name]),
                # Steady-state requests by the routing rule that placed them.
                "route_reasons": dict(sorted(reasons[name].items())),
            }
        )
        rows.append(_affinity_row(name, "compulsory", warm[name], args.affinity_concurrency))
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
    base16 = next(
        (
            r
            for r in rows
            if r["section"] == "overhead"
            and r.get("concurrency") == 16
            and r["system"].startswith("mesh-")
            and r["system"]
            not in (
                "mesh-unmoderated",
                "mesh-unmoderated-sequential",
                "mesh-unmoderated-no-direct",
                "mesh-mtls",
                "mesh-unbatched",
                "mesh-before-check",
                "mesh-no-ahead",
            )
        ),
        {},
    )
    lite1 = _find(rows, "overhead", "litellm", 1)
    hits1, hits16 = _find(rows, "cache_hits", "mesh", 1), _find(rows, "cache_hits", "mesh", 16)
    remote1, remote16 = (
        _find(rows, "cache_hits", "mesh-remote", 1),
        _find(rows, "cache_hits", "mesh-remote", 16),
    )
    limited1, limited16 = (
        _find(rows, "cache_hits", "mesh-limited", 1),
        _find(rows, "cache_hits", "mesh-limited", 16),
    )

    hits_base = next(
        (
            r
            for r in rows
            if r["section"] == "cache_hits"
            and r.get("concurrency") == 16
            and r["system"] not in ("mesh", "mesh-remote", "mesh-asyncio", "mesh-limited")
        ),
        {},
    )
    hits_base1 = _find(rows, "cache_hits", str(hits_base.get("system")), 1)

    def steady(system: str) -> dict[str, Any]:
        return next((r for r in rows if r["section"] == "affinity" and r["system"] == system
                     and r.get("phase") == "steady"), {})  # fmt: skip

    aff, rr, ring, memory = steady("kv"), steady("round_robin"), steady("ring"), steady("memory")
    headline: dict[str, Any] = {
        "throughput_ratio_c16": ratio(mesh16.get("tokens_per_s"), vllm16.get("tokens_per_s")),
        # The same ratio round by round: a 95 % interval of their geometric mean (3+ rounds).
        "throughput_ratio_c16_ci95": mesh16.get("throughput_ratio_ci95"),
        "throughput_ratio_c16_unmoderated": ratio(
            _find(rows, "overhead", "mesh-unmoderated", 16).get("tokens_per_s"), vllm16.get("tokens_per_s")
        ),
        # The gateway with a CheckInput call per request on the same services (--unbatched): its
        # c16 throughput against vllm serve, and how much later its first tokens came at c16.
        "unbatched_throughput_ratio_c16": ratio(
            _find(rows, "overhead", "mesh-unbatched", 16).get("tokens_per_s"), vllm16.get("tokens_per_s")
        ),
        "ttft_p50_ms_c16_unbatched_minus_batched": diff(
            _find(rows, "overhead", "mesh-unbatched", 16).get("ttft_p50_ms"), mesh16.get("ttft_p50_ms")
        ),
        # The gateway that generates beside the input check (--before-check): its c16 throughput
        # against vllm serve, its first tokens at c16 against today's, its added TTFT at c1.
        "before_check_throughput_ratio_c16": ratio(
            _find(rows, "overhead", "mesh-before-check", 16).get("tokens_per_s"), vllm16.get("tokens_per_s")
        ),
        "ttft_p50_ms_c16_before_check_minus_mesh": diff(
            _find(rows, "overhead", "mesh-before-check", 16).get("ttft_p50_ms"), mesh16.get("ttft_p50_ms")
        ),
        # The moderated gateway that waits for the policy's answer for the first word (--no-ahead):
        # its added TTFT at c1, paired, same run.
        "no_ahead_ttft_added_paired_p50_ms_c1": _find(rows, "overhead", "mesh-no-ahead", 1).get(
            "ttft_added_paired_p50_ms"
        ),
        "before_check_ttft_added_paired_p50_ms_c1": _find(rows, "overhead", "mesh-before-check", 1).get(
            "ttft_added_paired_p50_ms"
        ),
        # Mutual TLS on every gRPC hop against the same mesh in plaintext, same run (--mtls).
        "mtls_throughput_ratio_c16": ratio(
            _find(rows, "overhead", "mesh-mtls", 16).get("tokens_per_s"), mesh16.get("tokens_per_s")
        ),
        "mtls_ttft_added_p50_ms_c1": diff(
            _find(rows, "overhead", "mesh-mtls", 1).get("ttft_p50_ms"), mesh1.get("ttft_p50_ms")
        ),
        "ttft_added_p50_ms_c1": diff(mesh1.get("ttft_p50_ms"), vllm1.get("ttft_p50_ms")),
        # Median of each c1 request's TTFT less its vllm serve partner's (the turns interleaved).
        "ttft_added_paired_p50_ms_c1": mesh1.get("ttft_added_paired_p50_ms"),
        "ttft_added_paired_p50_ms_c1_unmoderated": _find(rows, "overhead", "mesh-unmoderated", 1).get(
            "ttft_added_paired_p50_ms"
        ),
        # The same with the lookup before the generation (--sequential), same run.
        "ttft_added_paired_p50_ms_c1_unmoderated_sequential": _find(
            rows, "overhead", "mesh-unmoderated-sequential", 1
        ).get("ttft_added_paired_p50_ms"),
        # The same with every miss a cache call (--no-direct), same run.
        "ttft_added_paired_p50_ms_c1_unmoderated_no_direct": _find(
            rows, "overhead", "mesh-unmoderated-no-direct", 1
        ).get("ttft_added_paired_p50_ms"),
        # The same in decode steps of vllm serve at c1 (the word hold-back costs about one).
        "ttft_added_p50_steps_c1": ratio(
            diff(mesh1.get("ttft_p50_ms"), vllm1.get("ttft_p50_ms")), vllm1.get("decode_step_ms")
        ),
        # What the policy service adds to the first token over the same mesh without it (same
        # run), in decode steps: the word hold-back (one step by design: the word that ends the
        # first token is released with the token after it) plus the input check and moderation.
        "ttft_moderated_minus_unmoderated_p50_steps_c1": ratio(
            diff(mesh1.get("ttft_p50_ms"), _find(rows, "overhead", "mesh-unmoderated", 1).get("ttft_p50_ms")),
            vllm1.get("decode_step_ms"),
        ),
        # Without the policy service: the pipeline's own cost (same run).
        "ttft_added_p50_ms_c1_unmoderated": diff(
            _find(rows, "overhead", "mesh-unmoderated", 1).get("ttft_p50_ms"), vllm1.get("ttft_p50_ms")
        ),
        "cpu_us_per_token_llmesh_c16": mesh16.get("cpu_us_per_token_llmesh"),
        # What a request costs whatever its length (one-token answers, net of idle), the mesh's
        # own processes, an earlier build's (--baseline) and vllm serve's API server, same run.
        "cpu_ms_per_request_llmesh": mesh16.get("cpu_ms_per_request_llmesh"),
        "baseline_cpu_ms_per_request_llmesh": base16.get("cpu_ms_per_request_llmesh"),
        "vllm_cpu_ms_per_request_frontend": vllm16.get("cpu_ms_per_request_frontend"),
        # An earlier build in the same run (--baseline): its CPU per token, and ours over it.
        "baseline_system": base16.get("system"),
        "baseline_cpu_us_per_token_llmesh_c16": base16.get("cpu_us_per_token_llmesh"),
        "cpu_per_token_vs_baseline_c16": ratio(
            mesh16.get("cpu_us_per_token_llmesh"), base16.get("cpu_us_per_token_llmesh")
        ),
        # The same less what each process spends idle (measured just before its phase).
        "cpu_us_per_token_llmesh_net_c16": mesh16.get("cpu_us_per_token_llmesh_net"),
        "baseline_cpu_us_per_token_llmesh_net_c16": base16.get("cpu_us_per_token_llmesh_net"),
        "cpu_per_token_net_vs_baseline_c16": ratio(
            mesh16.get("cpu_us_per_token_llmesh_net"), base16.get("cpu_us_per_token_llmesh_net")
        ),
        "baseline_throughput_ratio_c16": ratio(base16.get("tokens_per_s"), vllm16.get("tokens_per_s")),
        "baseline_ttft_added_p50_ms_c1": diff(
            _find(rows, "overhead", str(base16.get("system")), 1).get("ttft_p50_ms"), vllm1.get("ttft_p50_ms")
        ),
        "ttft_added_p99_ms_c1": diff(mesh1.get("ttft_p99_ms"), vllm1.get("ttft_p99_ms")),
        "ttft_added_p50_ms_c16": diff(mesh16.get("ttft_p50_ms"), vllm16.get("ttft_p50_ms")),
        "cache_hit_p50_ms_c1": hits1.get("p50_ms"),
        "cache_hit_p99_ms_c1": hits1.get("p99_ms"),
        "cache_hit_rps_c16": hits16.get("hits_per_s"),
        "cache_hit_cpu_us_c16": hits16.get("cpu_us_per_hit_llmesh"),
        "cache_hits_per_gateway_cpu_s": hits16.get("hits_per_gateway_cpu_s"),
        # An earlier build's gateway on the same services (--baseline), same run.
        "baseline_cache_hit_system": hits_base.get("system"),
        "baseline_cache_hit_p50_ms_c1": hits_base1.get("p50_ms"),
        "baseline_cache_hit_p99_ms_c1": hits_base1.get("p99_ms"),
        "baseline_cache_hit_rps_c16": hits_base.get("hits_per_s"),
        "baseline_cache_hits_per_gateway_cpu_s": hits_base.get("hits_per_gateway_cpu_s"),
        "cache_hit_gateway_cpu_vs_baseline": ratio(
            hits16.get("cpu_us_per_hit_gateway"), hits_base.get("cpu_us_per_hit_gateway")
        ),
        # The same hits with gateway-local hits off (every hit a policy and a cache call), same run.
        "remote_cache_hit_p50_ms_c1": remote1.get("p50_ms"),
        "remote_cache_hit_p99_ms_c1": remote1.get("p99_ms"),
        "remote_cache_hit_rps_c16": remote16.get("hits_per_s"),
        "remote_cache_hit_cpu_us_c16": remote16.get("cpu_us_per_hit_llmesh"),
        # The same hits by a caller with an API key whose tenant has request and token rate limits.
        "limited_cache_hit_p50_ms_c1": limited1.get("p50_ms"),
        "limited_cache_hit_p99_ms_c1": limited1.get("p99_ms"),
        "limited_cache_hit_rps_c16": limited16.get("hits_per_s"),
        "limited_cache_hits_per_gateway_cpu_s": limited16.get("hits_per_gateway_cpu_s"),
        # Steady state (compulsory misses apart): KV-event routing against round robin, the ring
        # and the gateway's own memory of what it sent where, same run.
        "affinity_ttft_ratio": ratio(aff.get("ttft_mean_ms"), rr.get("ttft_mean_ms")),
        "affinity_ttft_p90_ratio": ratio(aff.get("ttft_p90_ms"), rr.get("ttft_p90_ms")),
        "affinity_ring_ttft_ratio": ratio(ring.get("ttft_mean_ms"), rr.get("ttft_mean_ms")),
        "affinity_memory_ttft_ratio": ratio(memory.get("ttft_mean_ms"), rr.get("ttft_mean_ms")),
        "affinity_kv_vs_ring_ttft_ratio": ratio(aff.get("ttft_mean_ms"), ring.get("ttft_mean_ms")),
        "affinity_cached_share": {
            name: row.get("cached_token_share")
            for name, row in (("kv", aff), ("ring", ring), ("memory", memory), ("round_robin", rr))
        },
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
    from services.inference.engine import engine_block_size, engine_dtype

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
    # Every engine of the run (each build's replicas, vllm serve) in the dtype today's build picks
    # here: an earlier build's "auto" would be bf16 even on a CPU that only emulates it.
    os.environ.setdefault("LLMESH_INFERENCE_DTYPE", engine_dtype(InferenceSettings()))
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
                # And one whose callers hold an API key of a tenant with request and token rate
                # limits (never reached: what is measured is what enforcing them costs).
                limited = mesh.gateway(
                    "gateway-limited",
                    {
                        **mesh.upstream_env,
                        "LLMESH_GATEWAY_API_KEYS": json.dumps({hash_key(LIMITED_KEY): "bench-limited"}),
                        "LLMESH_GATEWAY_TENANTS": json.dumps({"bench-limited": LIMITED_TENANT}),
                    },
                )
                asyncio.run(_wait_http(limited + "/readyz", mesh.children[-1]))
                systems = {
                    "mesh-remote": ("gateway-remote", remote),
                    "mesh-asyncio": ("gateway-asyncio", plain_loop),
                    "mesh-limited": ("gateway-limited", limited),
                    "mesh": ("gateway", base),
                }
                if args.baseline:
                    # An earlier build's gateway on the same cache, policy and engine: its hit
                    # path beside today's in the same rounds.
                    build = baseline.unpack(args.baseline, logs / "baseline")
                    earlier = mesh.gateway(f"gateway-{build.commit}", mesh.upstream_env, build)
                    asyncio.run(_wait_http(earlier + "/readyz", mesh.children[-1]))
                    systems[f"mesh-{build.commit}"] = (f"gateway-{build.commit}", earlier)
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
                keyed = {"mesh-limited": {"authorization": f"Bearer {LIMITED_KEY}"}}
                rows += _run_sync(lambda: _cache_hits(args, targets, pids, keyed))
                for gateway, _ in systems.values():
                    if gateway != "gateway":
                        mesh.stop_one(gateway)
                _checkpoint(logs, rows)
            if "overhead" in sections:
                settings = InferenceSettings()
                vllm_proc, vllm_base = start_vllm(settings, logs / "vllm.log", logs / "stub")
                lite: Child | None = None
                try:
                    print("  starting vllm serve ...", flush=True)
                    asyncio.run(wait_vllm(vllm_proc, vllm_base))
                    targets = {"vllm": vllm_base, "mesh": base}

                    def variant(system: str, env: dict[str, str]) -> None:
                        """A gateway of the same services with ``env``, ready, as ``system``."""
                        targets[system] = mesh.gateway(system.replace("mesh-", "gateway-"), env)
                        asyncio.run(_wait_http(targets[system] + "/readyz", mesh.children[-1]))

                    if args.unmoderated:
                        # The pipeline's own cost: the same mesh without a policy service (no
                        # input check, no output moderation and so no word hold-back).
                        unmoderated_env = {
                            k: v for k, v in mesh.upstream_env.items() if k != "LLMESH_GATEWAY_POLICY_ADDRESS"
                        }
                        variant("mesh-unmoderated", unmoderated_env)
                        if args.sequential:
                            # What starting generation beside the lookup saves, same run.
                            variant(
                                "mesh-unmoderated-sequential",
                                {**unmoderated_env, "LLMESH_GATEWAY_SPECULATIVE_GENERATION": "false"},
                            )
                        if args.no_direct:
                            # What deciding misses in Redis saves, same run.
                            variant(
                                "mesh-unmoderated-no-direct",
                                {**unmoderated_env, "LLMESH_GATEWAY_DIRECT_LOOKUPS": "false"},
                            )
                    if args.unbatched:
                        # What batching the input checks saves, same run, same services.
                        unbatched = {**mesh.upstream_env, "LLMESH_GATEWAY_POLICY_BATCH_INPUTS": "false"}
                        variant("mesh-unbatched", unbatched)
                    if args.no_ahead:
                        # What releasing the first word on the offered step saves, same services.
                        variant(
                            "mesh-no-ahead", {**mesh.upstream_env, "LLMESH_GATEWAY_MODERATION_AHEAD": "false"}
                        )
                    if args.before_check:
                        # What the input check's wait before generation costs, same services.
                        variant(
                            "mesh-before-check",
                            {**mesh.upstream_env, "LLMESH_GATEWAY_GENERATE_BEFORE_INPUT_CHECK": "true"},
                        )
                    if tls_base:
                        targets["mesh-mtls"] = tls_base
                    baseline_name = ""
                    if args.baseline:
                        # An earlier build's whole mesh beside this one (its own cache, policy,
                        # inference replica and gateway), measured in the same rounds.
                        build = baseline.unpack(args.baseline, logs / "baseline")
                        baseline_name = f"mesh-{build.commit}"
                        targets[baseline_name] = _start_mesh(mesh, f"-{build.commit}", build=build)
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
                    if baseline_name:
                        suffix = baseline_name.removeprefix("mesh")
                        procs[baseline_name] = {
                            name: mesh.named[f"{name}{suffix}"].proc.pid
                            for name in ("gateway", "policy", "cache", "inference")
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
            block_size = engine_block_size(InferenceSettings(block_size=args.affinity_block_size or None))
            block_size = block_size or 16  # vLLM's default on GPU
            replicas = [
                mesh.start(
                    "services.inference",
                    f"inference-{i}",
                    {
                        "LLMESH_INFERENCE_PORT": "0",
                        "LLMESH_INFERENCE_OMP_THREADS_BIND": str(i),
                        "LLMESH_INFERENCE_BLOCK_SIZE": str(block_size),
                        "LLMESH_INFERENCE_KV_CACHE_BLOCKS": str(args.affinity_kv_tokens // block_size),
                        # A capped cache must still hold one whole context window.
                        "LLMESH_INFERENCE_MAX_MODEL_LEN": "4096",
                    },
                )
                for i in range(2)
            ]
            addresses = ",".join(r.address for r in replicas)
            gateways = {}
            for name in args.affinity_systems.split(","):
                policy, kv_events = AFFINITY_SYSTEMS[name]
                gateways[name] = mesh.gateway(
                    f"gateway-{name}",
                    {
                        "LLMESH_GATEWAY_INFERENCE_ADDRESSES": addresses,
                        "LLMESH_GATEWAY_ROUTE_POLICY": policy,
                        "LLMESH_GATEWAY_ROUTE_KV_EVENTS": kv_events,
                    },
                )
                asyncio.run(_wait_http(gateways[name] + "/readyz", mesh.children[-1]))
            rows += _run_sync(lambda: _affinity(args, gateways, [r.address for r in replicas]))
            _checkpoint(logs, rows)
    finally:
        mesh.stop()
        redis.stop()
    notes.append(
        f"overhead: streamed shared-prefix chat, unique questions (cache misses) in {args.language!r}, "
        f"{args.max_tokens} tokens per answer; mesh = gateway + policy + cache + llmesh inference"
    )
    notes.append(
        "machine shared with other engineers' test runs: figures are noisy; systems alternate per round"
    )
    notes.append("options: " + (" ".join(argv) or "(defaults)"))
    return BenchReport(name="mesh", rows=rows, headline=_headline(rows, litellm_reason), notes=notes)
