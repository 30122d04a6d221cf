"""``llmesh bench policy``: check latency, throughput, streaming cost and detector accuracy.

The service runs as its own process (``python -m policy`` on a free port, real
Redis for the audit log), so the gRPC figures are what a caller sees. The same
work is also timed in-process (no gRPC) so the transport's share is visible; the
two are measured alternately. Streaming is measured per chunk: the moderator's
own work in-process (the headline ``stream_added_p50_ms``) and the lockstep round
trip over a CheckOutputStream call.

Accuracy headlines (``injection_recall``, ``injection_fpr``, ``pii_recall``, ``pii_fpr``) come from
third-party data nobody here wrote or tuned on: neuralchemy's prompt-injection test split (S-Labs'
beside it; :mod:`benchmarks.policy_injection_eval`) and Presidio's sentence templates filled by
Faker, test half (:mod:`benchmarks.policy_pii_eval`). The project's own corpus
(``benchmarks/data/policy_corpus.jsonl``, :mod:`benchmarks.policy_eval`) is reported beside them
under ``*_tuned_corpus`` keys: the detectors were written against it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import subprocess
import sys
import time
import uuid
from typing import Any

import grpc
from llmesh.v1 import common_pb2, policy_pb2, policy_pb2_grpc

from benchmarks import policy_injection_eval, policy_pii_eval
from benchmarks.harness import BenchReport, percentile, process_cpu_s, summarize_ms
from benchmarks.policy_eval import evaluate, load
from policy.config import DEFAULT_RULESET
from policy.engine import Segment, check_segments
from policy.memo import ScanMemo
from policy.rules import Scope, parse_ruleset
from policy.stream import StreamModerator

_PARAGRAPH = (
    "Thanks for reaching out about the delayed shipment. I checked the warehouse system and the parcel left "
    "Rotterdam on Tuesday; the carrier expects delivery within three working days. If you need to change the "
    "address, reply to this message or write to orders.team@example.com and mention the order reference. "
    "For urgent questions you can also call +44 20 7946 0958 between nine and five. We are sorry for the "
    "inconvenience and have added a discount code to your account for the next purchase. "
)


def make_text(size: int) -> str:
    """A realistic support message of ``size`` characters (with some PII to redact)."""
    text = (_PARAGRAPH * (size // len(_PARAGRAPH) + 1))[:size]
    return text[: text.rfind(" ")] if " " in text else text


def conversation_turn(i: int, size: int = 400) -> str:
    """Turn ``i`` of a support conversation: ``size`` characters, different for every turn."""
    shift = (i * 97) % len(_PARAGRAPH)
    text = f"Turn {i}: " + ((_PARAGRAPH[shift:] + _PARAGRAPH) * (size // len(_PARAGRAPH) + 2))
    return text[:size]


def conversation_cpu(turns: int, reps: int) -> dict[str, list[list[float]]]:
    """CPU seconds of the input check of each turn of a conversation that re-sends its history
    (system prompt, then user and assistant turns), with the scan memo and without, alternating
    check by check; each repetition is another conversation, with a memo of its own."""
    ruleset = parse_ruleset(DEFAULT_RULESET.read_bytes(), "bench").for_tenant("bench")
    out: dict[str, list[list[float]]] = {
        "memo": [[] for _ in range(turns)],
        "none": [[] for _ in range(turns)],
    }
    for r in range(reps):
        memo = ScanMemo(32 * 1024 * 1024)
        texts = [f"{conversation_turn(i)} (conversation {r})" for i in range(turns)]
        roles = ["system"] + ["user", "assistant"] * turns
        for n in range(1, turns + 1):
            segments = [Segment(texts[k], k, role=roles[k], field="content") for k in range(n)]
            for name in ("none", "memo") if (r + n) % 2 else ("memo", "none"):
                cpu_start = time.process_time()
                check_segments(
                    ruleset, Scope.INPUT, segments, memo=memo if name == "memo" else None, tenant="bench"
                )
                out[name][n - 1].append(time.process_time() - cpu_start)
    return out


def _time(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def stream_chunks(answer: str, chunk: int) -> tuple[list[float], list[float], int]:
    """Per-chunk moderation time in-process (wall, CPU); and the largest hold-back seen."""
    moderator = StreamModerator(parse_ruleset(DEFAULT_RULESET.read_bytes(), "bench").for_tenant("bench"))
    times, cpu = [], []
    for i in range(0, len(answer), chunk):
        piece = answer[i : i + chunk]
        start, cpu_start = time.perf_counter(), time.process_time()
        moderator.feed(piece)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - cpu_start)
    moderator.finish()
    return times, cpu, moderator.max_held_back


class Server:
    """``python -m policy`` on a free port, stopped with SIGTERM."""

    def __init__(self, redis_url: str, audit_key: str) -> None:
        env = dict(os.environ)
        env.update(
            LLMESH_POLICY_PORT="0",
            LLMESH_POLICY_REDIS_URL=redis_url,
            LLMESH_POLICY_AUDIT_KEY=audit_key,
            LLMESH_POLICY_LOG_LEVEL="WARNING",
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "policy"], env=env, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("LLMESH_READY"):
                self.port = int(line.rsplit("port=", 1)[1])
                break
        else:
            raise RuntimeError(f"the policy server exited with {self.proc.wait()} before it was ready")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _mean_ms(values: list[float]) -> float:
    return round(sum(values) / len(values) * 1000, 3)


def _md() -> list[tuple[str, str]]:
    return [("x-llmesh-tenant", "bench"), ("x-request-id", uuid.uuid4().hex)]


def _request(text: str) -> policy_pb2.CheckInputRequest:
    return policy_pb2.CheckInputRequest(
        messages=[common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=text)]
    )


async def _reply(
    call: grpc.aio.StreamStreamCall[
        policy_pb2.CheckOutputStreamRequest, policy_pb2.CheckOutputStreamResponse
    ],
) -> policy_pb2.CheckOutputStreamResponse:
    """The stream's next answer (the service answers every message, so the end is an error)."""
    message = await call.read()
    if not isinstance(message, policy_pb2.CheckOutputStreamResponse):
        raise RuntimeError("the policy stream ended before its final answer")
    return message


# A chat request's input as the mesh bench sends it: a system prompt and a short question.
BUNCH_SYSTEM = "You are a concise assistant for a shop's customers. Answer in two sentences at most."


def _bunch_request(serial: int) -> policy_pb2.CheckInputRequest:
    return policy_pb2.CheckInputRequest(
        messages=[
            common_pb2.ChatMessage(role=common_pb2.ROLE_SYSTEM, content=BUNCH_SYSTEM),
            common_pb2.ChatMessage(
                role=common_pb2.ROLE_USER, content=f"Question {serial}: can I return boots bought in a sale?"
            ),
        ]
    )


async def bunch_figures(
    stub: policy_pb2_grpc.PolicyServiceAsyncStub, pid: int, size: int, rounds: int
) -> dict[str, dict[str, list[float]]]:
    """Bunches of ``size`` checks that arrive together (as the mesh's c16 requests do when their
    answers end on one decode step), sent as ``size`` concurrent CheckInput calls or as one
    CheckInputs call whose answers stream back one by one; the ways alternate per bunch. Per way:
    each check's time from the bunch's start to its answer, each bunch's time to its last answer,
    and the policy process's CPU seconds per check."""
    serial = itertools.count()
    out: dict[str, dict[str, list[float]]] = {
        way: {"check": [], "bunch": [], "cpu": []} for way in ("calls", "batched")
    }

    async def per_call(request: policy_pb2.CheckInputRequest, start: float) -> float:
        await stub.CheckInput(request, metadata=_md())
        return time.perf_counter() - start

    for i in range(rounds + 2):  # the first two bunches warm up
        for way in ("calls", "batched") if i % 2 else ("batched", "calls"):
            requests = [_bunch_request(next(serial)) for _ in range(size)]
            cpu, start = process_cpu_s(pid), time.perf_counter()
            if way == "calls":
                times = list(await asyncio.gather(*(per_call(r, start) for r in requests)))
            else:
                checks = [policy_pb2.InputCheck(tenant="bench", input=r) for r in requests]
                times = []
                async for reply in stub.CheckInputs(policy_pb2.CheckInputsRequest(checks=checks)):
                    if reply.error_code:
                        raise RuntimeError(f"a batched check was refused: {reply.error}")
                    times.append(time.perf_counter() - start)
            spent = process_cpu_s(pid) - cpu
            if i >= 2:
                out[way]["check"].extend(times)
                out[way]["bunch"].append(max(times))
                out[way]["cpu"].append(spent / size)
    return out


async def grpc_figures(address: str, args: argparse.Namespace, answer: str, pid: int) -> dict[str, Any]:
    n_small, n_large, chunk = args.n, args.n_large, args.chunk
    concurrency, per_worker = args.concurrency, args.per_worker
    async with grpc.aio.insecure_channel(address) as channel:
        stub = policy_pb2_grpc.PolicyServiceStub(channel)
        texts = {"1kb": make_text(1024), "16kb": make_text(16 * 1024)}
        requests = {size: _request(text) for size, text in texts.items()}
        ruleset = parse_ruleset(DEFAULT_RULESET.read_bytes(), "bench").for_tenant("bench")
        for _ in range(20):  # warm up the channel, the server and the in-process patterns
            await stub.CheckInput(requests["16kb"], metadata=_md())
            check_segments(ruleset, Scope.INPUT, [Segment(texts["16kb"], 0)])
        # In-process and gRPC samples alternate, so both see the same (shared, noisy) machine.
        samples: dict[str, list[float]] = {"1kb": [], "16kb": []}
        local: dict[str, list[float]] = {"1kb": [], "16kb": []}
        # CPU time of the in-process checks: what the work costs, whatever else the machine runs.
        cpu: dict[str, list[float]] = {"1kb": [], "16kb": []}
        # Every text is new to the service (one serial number at its end, never sent twice): these
        # figures are full scans, not answers from its scan memo (policy/memo.py), which the
        # conversation rows show.
        serial = itertools.count()

        def unseen(text: str) -> str:
            return f"{text[:-8]} #{next(serial):06d}"

        for i in range(max(n_small, n_large)):
            for size, n in (("1kb", n_small), ("16kb", n_large)):
                if i >= n:
                    continue
                text = unseen(texts[size])
                start, cpu_start = time.perf_counter(), time.process_time()
                check_segments(ruleset, Scope.INPUT, [Segment(text, 0)])
                local[size].append(time.perf_counter() - start)
                cpu[size].append(time.process_time() - cpu_start)
                start = time.perf_counter()
                await stub.CheckInput(_request(text), metadata=_md())
                samples[size].append(time.perf_counter() - start)

        async def worker() -> None:
            for _ in range(per_worker):
                await stub.CheckInput(_request(unseen(texts["1kb"])), metadata=_md())

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        throughput = concurrency * per_worker / (time.perf_counter() - start)

        bunches = await bunch_figures(stub, pid, args.bunch, args.bunch_rounds)
        # A check alone (what a request at c1 sees): a CheckInput call, or a CheckInputs call of one.
        alone = await bunch_figures(stub, pid, 1, args.n)

        # Lockstep streaming: send a delta, wait for its answer, repeat.
        call = stub.CheckOutputStream(metadata=_md())
        chunk_times: list[float] = []
        released: list[str] = []
        for i in range(0, len(answer), chunk):
            start = time.perf_counter()
            await call.write(policy_pb2.CheckOutputStreamRequest(delta=answer[i : i + chunk]))
            resp = await _reply(call)
            chunk_times.append(time.perf_counter() - start)
            released.append(resp.text)
        await call.write(policy_pb2.CheckOutputStreamRequest(end=True))
        final = await _reply(call)
        await call.done_writing()
        active = await stub.GetRuleset(policy_pb2.GetRulesetRequest(), metadata=_md())
    return {
        "samples": samples,
        "local": local,
        "cpu": cpu,
        "throughput": throughput,
        "bunches": bunches,
        "alone": alone,
        "chunk_times": chunk_times,
        "stream_ok": bool(final.final) and bool(final.response_sha256),
        "hold_back_chars": active.hold_back_chars,
    }


async def _cleanup(redis_url: str, audit_key: str) -> None:
    from policy.audit import heads_key, stream_key
    from services.runtime import redis_client

    client: Any = redis_client.connect(redis_url)
    with contextlib.suppress(Exception):
        await client.delete(stream_key(audit_key), heads_key(audit_key))
    await client.aclose()


def run(argv: list[str]) -> BenchReport:
    parser = argparse.ArgumentParser(prog="llmesh bench policy")
    parser.add_argument("--n", type=int, default=400, help="1 KB checks per latency series")
    parser.add_argument("--n-large", type=int, default=150, help="16 KB checks per latency series")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--per-worker", type=int, default=60)
    parser.add_argument("--chunk", type=int, default=4, help="characters per streamed delta (about a token)")
    parser.add_argument("--turns", type=int, default=24, help="conversation rows: turns per conversation")
    parser.add_argument("--conversations", type=int, default=5, help="conversation rows: repetitions")
    parser.add_argument("--bunch", type=int, default=16, help="checks per bunch (calls vs CheckInputs)")
    parser.add_argument("--bunch-rounds", type=int, default=150, help="bunches per way")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0")
    args = parser.parse_args(argv)

    answer = make_text(4096)
    audit_key = f"llmesh:bench-audit:{{{uuid.uuid4().hex[:8]}}}"
    server = Server(args.redis_url, audit_key)
    try:
        remote = asyncio.run(grpc_figures(f"127.0.0.1:{server.port}", args, answer, server.proc.pid))
    finally:
        server.stop()
        asyncio.run(_cleanup(args.redis_url, audit_key))
    core = remote["local"]
    stream_times, stream_cpu, max_held = stream_chunks(answer, args.chunk)
    conversation = conversation_cpu(args.turns, args.conversations)
    last = {name: conversation[name][-1] for name in ("memo", "none")}
    totals = {
        name: [sum(per_turn[r] for per_turn in conversation[name]) for r in range(args.conversations)]
        for name in ("memo", "none")
    }

    rows: list[dict[str, Any]] = []
    for size in ("1kb", "16kb"):
        rows.append({"measure": f"check {size}", "path": "in-process", **summarize_ms(core[size])})
        rows.append(
            {"measure": f"check {size}", "path": "in-process CPU time", **summarize_ms(remote["cpu"][size])}
        )
        rows.append({"measure": f"check {size}", "path": "gRPC", **summarize_ms(remote["samples"][size])})
    rows.append({"measure": "stream per chunk", "path": "in-process", **summarize_ms(stream_times)})
    rows.append({"measure": "stream per chunk", "path": "in-process CPU time", **summarize_ms(stream_cpu)})
    rows.append(
        {"measure": "stream per chunk", "path": "gRPC lockstep", **summarize_ms(remote["chunk_times"])}
    )
    for n in sorted({1, 2, args.turns // 2, args.turns}):
        for name, label in (("none", "no memo"), ("memo", "scan memo")):
            rows.append(
                {
                    "measure": f"conversation turn {n} ({n} texts of 400 chars) CPU time",
                    "path": f"in-process, {label}",
                    **summarize_ms(conversation[name][n - 1]),
                }
            )
    for name, label in (("none", "no memo"), ("memo", "scan memo")):
        rows.append(
            {
                "measure": f"conversation of {args.turns} turns, all checks, CPU time",
                "path": f"in-process, {label}",
                **summarize_ms(totals[name]),
            }
        )
    for way, label in (("calls", "a CheckInput call each"), ("batched", "one CheckInputs call")):
        figures = remote["bunches"][way]
        rows.append(
            {
                "measure": f"bunch of {args.bunch} checks: bunch start to each answer",
                "path": label,
                **summarize_ms(figures["check"]),
            }
        )
        rows.append(
            {
                "measure": f"bunch of {args.bunch} checks: bunch start to its last answer",
                "path": label,
                **summarize_ms(figures["bunch"]),
            }
        )
        rows.append(
            {
                "measure": f"bunch of {args.bunch} checks: policy process CPU per check",
                "path": label,
                **summarize_ms(figures["cpu"]),
            }
        )
    for way, label in (("calls", "a CheckInput call"), ("batched", "a CheckInputs call of one")):
        rows.append(
            {
                "measure": "one check alone: call to answer",
                "path": label,
                **summarize_ms(remote["alone"][way]["check"]),
            }
        )
    rows.append(
        {
            "measure": f"checks/s at concurrency {args.concurrency}",
            "path": "gRPC",
            "value": round(remote["throughput"], 1),
        }
    )

    items = load()
    whole = evaluate(items)
    splits = {
        s: evaluate([i for i in items if i.get("split") == s])
        for s in ("dev", "tuning", "tuning2", "tuning3", "holdout")
    }
    for split, ev in [("all", whole), *splits.items()]:
        for row in ev.rows():
            if row["group"] == "all":
                rows.append(
                    {
                        "measure": f"accuracy ({split})",
                        "path": row["detector"],
                        **{k: v for k, v in row.items() if k not in ("detector", "group")},
                    }
                )
    for row in whole.rows():
        if row["group"] != "all":
            rows.append(
                {
                    "measure": "accuracy by group (all)",
                    "path": f"{row['detector']}:{row['group']}",
                    **{k: v for k, v in row.items() if k not in ("detector", "group")},
                }
            )

    injection = {
        name: policy_injection_eval.evaluate(dataset)
        for name, dataset in policy_injection_eval.headline_sets().items()
    }
    for name, result in injection.items():
        rows.extend(policy_injection_eval.rows(name, result))
    pii_test = policy_pii_eval.evaluate(split="test")
    pii_tune = policy_pii_eval.evaluate(split="tune")
    for split, figures in (("test", pii_test), ("tune", pii_tune)):
        rows.append(
            {
                "measure": f"PII (Presidio templates, {split} half)",
                "path": "all",
                "spans": figures["n_spans"],
                "recall": round(figures["pii_recall"], 4),
                "pii_free_texts": figures["n_pii_free"],
                "false_positive_rate": round(figures["pii_fpr"], 4),
            }
        )
        for family, counts in sorted(figures["per_family"].items()):
            rows.append(
                {
                    "measure": f"PII by family (Presidio templates, {split} half)",
                    "path": family,
                    "spans": counts["expected"],
                    "recall": round(counts["recall"], 4),
                }
            )
    headline_injection = injection["neuralchemy"].stages["both"]
    s_labs = injection["s_labs"].stages["both"]
    pii, inj = whole.detectors["pii"], whole.detectors["injection"]
    hold_pii, hold_inj = splits["holdout"].detectors["pii"], splits["holdout"].detectors["injection"]
    core_p50 = percentile(core["1kb"], 50)
    grpc_p50 = percentile(remote["samples"]["1kb"], 50)
    headline = {
        "check_p50_ms_1kb": round(grpc_p50 * 1000, 3),
        "check_p99_ms_16kb": round(percentile(remote["samples"]["16kb"], 99) * 1000, 3),
        "stream_added_p50_ms": round(percentile(stream_times, 50) * 1000, 4),
        "stream_added_cpu_p50_ms": round(percentile(stream_cpu, 50) * 1000, 4),
        "check_cpu_p50_ms_1kb": round(percentile(remote["cpu"]["1kb"], 50) * 1000, 3),
        "check_cpu_p50_ms_16kb": round(percentile(remote["cpu"]["16kb"], 50) * 1000, 3),
        "injection_recall": round(headline_injection.recall, 4),
        "injection_fpr": round(headline_injection.false_positive_rate, 4),
        "injection_recall_patterns_only": round(injection["neuralchemy"].stages["patterns"].recall, 4),
        "injection_recall_blocked": round(injection["neuralchemy"].stages["blocked"].recall, 4),
        "injection_fpr_blocked": round(injection["neuralchemy"].stages["blocked"].false_positive_rate, 4),
        "injection_recall_s_labs": round(s_labs.recall, 4),
        "injection_fpr_s_labs": round(s_labs.false_positive_rate, 4),
        "pii_recall": round(pii_test["pii_recall"], 4),
        "pii_fpr": round(pii_test["pii_fpr"], 4),
        "pii_recall_tuned_corpus": round(pii.recall, 4),
        "pii_fpr_tuned_corpus": round(pii.false_positive_rate, 4),
        "injection_recall_tuned_corpus": round(inj.recall, 4),
        "injection_fpr_tuned_corpus": round(inj.false_positive_rate, 4),
        "pii_recall_tuned_corpus_holdout": round(hold_pii.recall, 4),
        "injection_recall_tuned_corpus_holdout": round(hold_inj.recall, 4),
        "checks_per_s_c16": round(remote["throughput"], 1),
        # Bunches of checks that arrive together: per call vs one CheckInputs call (same run).
        "bunch_check_mean_ms_calls": _mean_ms(remote["bunches"]["calls"]["check"]),
        "bunch_check_mean_ms_batched": _mean_ms(remote["bunches"]["batched"]["check"]),
        "bunch_last_p50_ms_calls": round(percentile(remote["bunches"]["calls"]["bunch"], 50) * 1000, 3),
        "bunch_last_p50_ms_batched": round(percentile(remote["bunches"]["batched"]["bunch"], 50) * 1000, 3),
        "bunch_cpu_per_check_ms_calls": _mean_ms(remote["bunches"]["calls"]["cpu"]),
        "bunch_cpu_per_check_ms_batched": _mean_ms(remote["bunches"]["batched"]["cpu"]),
        "alone_check_p50_ms_calls": round(percentile(remote["alone"]["calls"]["check"], 50) * 1000, 3),
        "alone_check_p50_ms_batched": round(percentile(remote["alone"]["batched"]["check"], 50) * 1000, 3),
        "conversation_last_turn_cpu_p50_ms_memo": round(percentile(last["memo"], 50) * 1000, 3),
        "conversation_last_turn_cpu_p50_ms_no_memo": round(percentile(last["none"], 50) * 1000, 3),
        "conversation_total_cpu_p50_ms_memo": round(percentile(totals["memo"], 50) * 1000, 2),
        "conversation_total_cpu_p50_ms_no_memo": round(percentile(totals["none"], 50) * 1000, 2),
        "stream_grpc_roundtrip_p50_ms": round(percentile(remote["chunk_times"], 50) * 1000, 3),
        "hold_back_chars": remote["hold_back_chars"],
        "max_held_back_chars": max_held,
    }
    notes = [
        "headline accuracy is on third-party data nobody here wrote or tuned on: injection_recall / "
        f"injection_fpr on {injection['neuralchemy'].dataset} (the shipped ruleset: patterns and "
        f"classifier), S-Labs' test split beside it; pii_recall / pii_fpr on "
        f"{policy_pii_eval.DATASET['name']} ({policy_pii_eval.PACKAGE}=={policy_pii_eval.PACKAGE_VERSION}, "
        f"{policy_pii_eval.LICENCE}), the test half of the templates. The classifier trained on the train "
        "splits and took its thresholds from neuralchemy's validation split; PII fixes looked only at the "
        "tune half",
        f"tuned corpus (*_tuned_corpus keys, the rule-based detectors alone): {whole.items} items in "
        "five splits: 'dev' was written with the detectors; 'tuning', 'tuning2' and 'tuning3' were "
        "each measured blind once and then used for fixes (injection recall "
        "0.70, 0.48 and 0.60; PII recall 0.97, 0.96 and 0.90); 'holdout' was measured blind and never "
        "tuned on (0.96 / 1.00) but written after the tuning2 fixes were planned. The blind figures, not "
        "the current ones, estimate accuracy on text nobody anticipated",
        "CPU-time rows (time.process_time) are what the work costs; wall-clock rows include waiting for a "
        "core on this shared machine",
        f"check 1 KB p50: gRPC {grpc_p50 * 1000:.3f} ms vs in-process {core_p50 * 1000:.3f} ms "
        f"(ratio {grpc_p50 / core_p50:.2f}x); in-process and gRPC samples alternate one by one, 1 KB "
        f"and 16 KB too; load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores",
        "stream_added_p50_ms is the moderator's own work per delta; the gRPC lockstep figure adds one "
        "round trip per delta on loopback (a pipelined caller does not wait for it)",
        f"stream ended cleanly with a response hash: {remote['stream_ok']}",
        f"conversation rows: {args.conversations} conversations of {args.turns} turns (a system prompt, then "
        "user and assistant turns of 400 characters each), every check re-sending the history as a chat "
        "client does; the check with the scan memo (policy/memo.py) and without alternate check by check, "
        "each conversation with a fresh memo, so its first sight of every text is a full scan. The 1 KB "
        "and 16 KB rows and checks/s send a text the service has not seen, every time",
    ]
    return BenchReport(name="policy", rows=rows, headline=headline, notes=notes)
