"""bench mesh: the affinity rows and the headline's ratios (steady state, baseline build)."""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from typing import Any

import pytest

from benchmarks import mesh as mesh_bench
from benchmarks.mesh import (
    _affinity_row,
    _headline,
    _paired_p50_ms,
    _per_token,
    _prefix,
    _ring_split,
    _round_ratios,
    _salts_split_alike,
)
from benchmarks.mesh_load import StreamResult


def result(ttft_s: float, prompt: int, cached: int) -> StreamResult:
    return StreamResult(ttft_s, ttft_s + 0.1, 4, 200, prompt, cached)


def test_an_affinity_row_counts_misses_and_the_cached_share() -> None:
    row = _affinity_row("kv", "steady", [result(1.0, 700, 640), result(9.0, 700, 0)], 2)
    assert (row["requests"], row["misses"], row["cached_token_share"]) == (2, 1, round(640 / 1400, 4))
    assert row["ttft_mean_ms"] == 5000.0 and row["phase"] == "steady"


def test_every_system_of_a_round_gets_prompts_the_ring_splits_alike() -> None:
    args = argparse.Namespace(prefixes=12, prefix_chars=600)
    replicas = ["127.0.0.1:1", "127.0.0.1:2"]
    splits = set()
    for seed in range(6):
        salts = _salts_split_alike(["kv", "ring", "round_robin"], args, replicas, random.Random(seed))
        assert len(set(salts.values())) == 3  # each system its own prompts
        split = {_ring_split([_prefix(i, 600, s) for i in range(12)], replicas) for s in salts.values()}
        assert len(split) == 1
        splits |= split
    assert len(splits) > 1  # the first system's split is drawn, not chosen


def test_the_headline_compares_steady_states_and_the_baseline_build() -> None:
    rows = [
        _affinity_row("kv", "steady", [result(1.0, 700, 640)], 2),
        _affinity_row("kv", "compulsory", [result(9.0, 700, 0)], 2),
        _affinity_row("ring", "steady", [result(2.0, 700, 640)], 2),
        _affinity_row("round_robin", "steady", [result(4.0, 700, 0)], 2),
        {"section": "overhead", "system": "vllm", "concurrency": 16, "tokens_per_s": 100.0},
        {"section": "overhead", "system": "mesh", "concurrency": 16, "tokens_per_s": 90.0,
         "cpu_us_per_token_llmesh": 400.0},
        {"section": "overhead", "system": "mesh-unmoderated", "concurrency": 16, "tokens_per_s": 95.0,
         "cpu_us_per_token_llmesh": 300.0},
        # Today's gateway with per-request input checks (--unbatched): no earlier build.
        {"section": "overhead", "system": "mesh-unbatched", "concurrency": 16, "tokens_per_s": 85.0},
        {"section": "overhead", "system": "mesh-403d559", "concurrency": 16, "tokens_per_s": 80.0,
         "cpu_us_per_token_llmesh": 1000.0},
    ]  # fmt: skip
    head = _headline(rows, None)
    assert head["affinity_ttft_ratio"] == 0.25
    assert head["affinity_ring_ttft_ratio"] == 0.5
    assert head["affinity_kv_vs_ring_ttft_ratio"] == 0.5
    assert head["affinity_cached_share"]["round_robin"] == 0.0
    assert head["baseline_system"] == "mesh-403d559"
    assert head["cpu_per_token_vs_baseline_c16"] == 0.4
    assert head["baseline_throughput_ratio_c16"] == 0.8
    assert head["unbatched_throughput_ratio_c16"] == 0.85


def test_the_headline_states_what_the_policy_adds_to_the_first_token_in_decode_steps() -> None:
    rows = [
        {"section": "overhead", "system": "vllm", "concurrency": 1, "ttft_p50_ms": 100.0,
         "decode_step_ms": 40.0},
        {"section": "overhead", "system": "mesh", "concurrency": 1, "ttft_p50_ms": 146.0},
        {"section": "overhead", "system": "mesh-unmoderated", "concurrency": 1, "ttft_p50_ms": 102.0},
    ]  # fmt: skip
    head = _headline(rows, None)
    assert head["ttft_added_p50_steps_c1"] == 1.15
    assert head["ttft_moderated_minus_unmoderated_p50_steps_c1"] == 1.1
    assert head["ttft_added_p50_ms_c1_unmoderated"] == 2.0


def test_cpu_per_token_net_of_idle_leaves_out_what_the_processes_spend_without_traffic() -> None:
    spent = {
        "tokens": 1000.0,
        "gateway": 0.5, "gateway@idle": 0.2,
        "policy": 0.3, "policy@idle": 0.4,  # idle above the phase's own: counted as 0, not below
        "cache": 0.1, "cache@idle": 0.0,
        "inference": 0.1, "inference@idle": 0.05,
        "inference_children": 9.0, "inference_children@idle": 1.0,
    }  # fmt: skip
    out = _per_token(spent)
    assert out["cpu_us_per_token_gateway"] == 500.0
    assert out["cpu_us_per_token_gateway_net"] == 300.0
    assert out["cpu_us_per_token_policy_net"] == 0.0
    assert out["cpu_us_per_token_llmesh"] == 1000.0
    assert out["cpu_us_per_token_llmesh_net"] == 300.0 + 0.0 + 100.0 + 50.0
    assert out["cpu_us_per_token_inference_children_net"] == 8000.0
    assert "tokens" in spent  # the caller's dict is left as it was


def test_added_ttft_paired_is_the_median_of_each_request_less_its_partner() -> None:
    mesh = [result(t, 100, 0) for t in (0.110, 0.300, 0.105)]
    vllm = [result(t, 100, 0) for t in (0.100, 0.296, 0.104)]  # a slow spell hit both at turn 2
    assert _paired_p50_ms(mesh, vllm) == 4.0
    rows = [
        {"section": "overhead", "system": "vllm", "concurrency": 1, "ttft_p50_ms": 104.0},
        {"section": "overhead", "system": "mesh", "concurrency": 1, "ttft_p50_ms": 110.0,
         "ttft_added_paired_p50_ms": 4.0},
        {"section": "overhead", "system": "mesh-unmoderated", "concurrency": 1, "ttft_p50_ms": 105.0,
         "ttft_added_paired_p50_ms": 1.5},
    ]  # fmt: skip
    head = _headline(rows, None)
    assert head["ttft_added_p50_ms_c1"] == 6.0
    assert head["ttft_added_paired_p50_ms_c1"] == 4.0
    assert head["ttft_added_paired_p50_ms_c1_unmoderated"] == 1.5


def test_round_ratios_pair_each_round_with_vllm_and_bound_their_mean() -> None:
    mesh = [(10.0, 900), (10.0, 1000), (10.0, 950)]  # (wall s, tokens) per round
    vllm = [(10.0, 1000), (10.0, 1000), (10.0, 1000)]
    got = _round_ratios(mesh, vllm)
    assert got["throughput_ratio_rounds"] == [0.9, 1.0, 0.95]
    low, high = got["throughput_ratio_ci95"]
    assert low < 0.9 and high > 0.95  # three scattered rounds: a wide interval around their mean
    steady = _round_ratios([(10.0, 950)] * 4, [(10.0, 1000)] * 4)
    assert steady["throughput_ratio_ci95"] == [0.95, 0.95]
    assert "throughput_ratio_ci95" not in _round_ratios(mesh[:2], vllm[:2])  # too few rounds


def test_cpu_per_request_is_net_of_idle_over_the_answered_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = iter(
        [
            {"gateway": 1.0, "policy": 2.0, "inference": 3.0, "inference_children": 10.0},
            {"gateway": 1.3, "policy": 2.1, "inference": 3.2, "inference_children": 14.0},
        ]
    )
    bodies: list[dict[str, Any]] = []

    async def idle(procs: dict[str, int], window_s: float) -> dict[str, float]:
        return {"gateway": 0.01, "policy": 0.0, "inference": 0.0, "inference_children": 0.5}

    async def phase(base: str, path: str, sent: list[dict[str, Any]], c: int, headers: Any = None) -> Any:
        bodies.extend(sent)
        # One request of the four failed: the CPU is shared over the three answered.
        return [StreamResult(0.1, 0.2, 1, 200)] * 3 + [StreamResult(0.0, 0.1, 0, 503)], 2.0

    monkeypatch.setattr(mesh_bench, "_idle_cpu", idle)
    monkeypatch.setattr(mesh_bench, "_process_cpu", lambda procs: next(readings))
    monkeypatch.setattr(mesh_bench, "_phase", phase)
    args = argparse.Namespace(
        levels="1,16", idle_s=0.0, request_cpu_requests=4, request_cpu_rounds=1, language="en"
    )
    targets = {"mesh": "http://m", "vllm": "http://v"}
    out = asyncio.run(mesh_bench._request_cpu(args, targets, {"mesh": {"gateway": 1}}, {}))
    assert set(out) == {"mesh"}  # a system whose processes are not counted is not run
    assert [b["max_tokens"] for b in bodies] == [1] * 4
    assert len({b["messages"][1]["content"] for b in bodies}) == 4  # new questions: misses
    row = out["mesh"]
    assert row["cpu_ms_per_request_gateway"] == round((0.3 - 0.02) / 3 * 1e3, 3)
    assert row["cpu_ms_per_request_policy"] == round(0.1 / 3 * 1e3, 3)
    assert row["cpu_ms_per_request_inference_children"] == round((4.0 - 1.0) / 3 * 1e3, 3)
    # The mesh's own processes: not the engine below the inference service.
    assert row["cpu_ms_per_request_llmesh"] == round((0.28 + 0.1 + 0.2) / 3 * 1e3, 3)


def test_cpu_per_request_takes_turns_over_rounds_and_sums_them(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, int]] = []
    clock = {"mesh": 0.0, "old": 0.0}

    async def idle(procs: dict[str, int], window_s: float) -> dict[str, float]:
        return {"gateway": 0.0}

    async def phase(base: str, path: str, sent: list[dict[str, Any]], c: int, headers: Any = None) -> Any:
        name = base.removeprefix("http://")
        calls.append((name, len(sent)))
        clock[name] += len(sent) * (0.002 if name == "mesh" else 0.003)  # 2 / 3 ms a request
        return [StreamResult(0.1, 0.2, 1, 200)] * len(sent), 1.0

    monkeypatch.setattr(mesh_bench, "_idle_cpu", idle)
    monkeypatch.setattr(mesh_bench, "_process_cpu", lambda procs: {"gateway": clock[procs["name"]]})
    monkeypatch.setattr(mesh_bench, "_phase", phase)
    args = argparse.Namespace(
        levels="16", idle_s=0.0, request_cpu_requests=7, request_cpu_rounds=3, language="en"
    )
    targets = {"mesh": "http://mesh", "old": "http://old"}
    procs = {"mesh": {"name": "mesh"}, "old": {"name": "old"}}  # (the fake reads its clock by name)
    out = asyncio.run(mesh_bench._request_cpu(args, targets, procs, {}))  # type: ignore[arg-type]
    # 7 requests in 3 rounds (3, 2, 2), the order flipping each round.
    assert calls == [("mesh", 3), ("old", 3), ("old", 2), ("mesh", 2), ("mesh", 2), ("old", 2)]
    assert out["mesh"]["cpu_ms_per_request_gateway"] == 2.0
    assert out["old"]["cpu_ms_per_request_llmesh"] == 3.0


class TurnLog:
    """``HttpConnection``'s stand-in for the c1 turns: every request sent, with its system, its
    ``max_tokens`` and when it started and ended (each takes 10 ms)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sent: list[tuple[str, int, float, float]] = []
        log = self.sent

        class Connection:
            def __init__(self, base: str, headers: dict[str, str] | None = None) -> None:
                self.name = base.removeprefix("http://")

            async def reconnect(self) -> None:
                pass

            async def close(self) -> None:
                pass

            async def stream_chat(self, path: str, body: dict[str, Any]) -> StreamResult:
                start = time.monotonic()
                await asyncio.sleep(0.01)
                log.append((self.name, body["max_tokens"], start, time.monotonic()))
                return StreamResult(0.1, 0.2, body["max_tokens"], 200)

        monkeypatch.setattr(mesh_bench, "HttpConnection", Connection)


def test_c1_requests_take_turns_each_after_a_quiet_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every c1 request starts ``quiet_s`` after the one before it ended (the engine that served
    that one polls for a second before it goes idle), the systems' order flipping each turn."""
    turns = TurnLog(monkeypatch)
    order = [("vllm", "http://vllm"), ("mesh", "http://mesh")]
    got = asyncio.run(mesh_bench._c1_interleaved(order, 3, 8, {}, quiet_s=0.05))
    assert [n for n, *_ in turns.sent] == ["vllm", "mesh", "mesh", "vllm", "vllm", "mesh"]
    assert all(now[2] - before[3] >= 0.05 for before, now in zip(turns.sent, turns.sent[1:], strict=False))
    assert {name: len(results) for name, results in got.items()} == {"vllm": 3, "mesh": 3}


def test_c1_lead_request_goes_to_the_same_system_right_before_each_measured_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``lead_tokens`` every measured request follows an unmeasured one of that many tokens to
    its own system (its engine's step, not another's), and only the measured ones are returned."""
    turns = TurnLog(monkeypatch)
    order = [("vllm", "http://vllm"), ("mesh", "http://mesh")]
    got = asyncio.run(mesh_bench._c1_interleaved(order, 2, 48, {}, lead_tokens=4))
    first, second = [("vllm", 4), ("vllm", 48), ("mesh", 4), ("mesh", 48)], [("mesh", 4), ("mesh", 48)]
    assert [(n, t) for n, t, *_ in turns.sent] == [*first, *second, ("vllm", 4), ("vllm", 48)]
    assert all(r.completion_tokens == 48 for results in got.values() for r in results)
    assert {name: len(results) for name, results in got.items()} == {"vllm": 2, "mesh": 2}


def test_a_wave_row_gives_the_median_first_and_last_first_token_of_its_phases() -> None:
    """Each one-wave phase gives its earliest and latest TTFT; failed requests (no tokens) do not
    count, a phase of none is left out, and a system without such phases has no wave fields."""
    phases = [
        [StreamResult(0.3, 1.0, 4, 200), StreamResult(0.5, 1.0, 4, 200), StreamResult(9.0, 9.0, 0, 500)],
        [StreamResult(0.2, 1.0, 4, 200), StreamResult(0.9, 1.0, 4, 200)],
        [StreamResult(0.4, 1.0, 4, 200), StreamResult(0.6, 1.0, 4, 200)],
        [StreamResult(0.1, 0.1, 0, 500)],
    ]
    row = mesh_bench._wave_row([mesh_bench._wave_edges_ms(p) for p in phases])
    assert row == {"wave_first_ttft_p50_ms": 300.0, "wave_last_ttft_p50_ms": 600.0}
    assert mesh_bench._wave_row([]) == {}
