"""``llmesh bench policy-cpu``: the policy engine's CPU per request, today's build beside an earlier one.

Each build runs ``benchmarks/policy_cpu_worker.py`` in processes of its own (the earlier build
unpacked by ``benchmarks/baseline.py`` and first on ``PYTHONPATH``), the builds taking turns
``--runs`` times, each run ``--rounds`` rounds of every measure: an input check of a new
question, a moderated answer of one delta (one every answer opens with, and one never seen
before), a moderated answer of 48 deltas (the worker's docstring). Figures are thread CPU µs per
item, the median over all rounds of a build with its 10th and 90th percentiles; what a request
costs the policy service besides (gRPC, Redis, audit records) is not in them (`llmesh bench
mesh`'s ``cpu_ms_per_request_policy`` has it, with that bench's noise).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.baseline import REPO, Baseline, unpack
from benchmarks.harness import BenchReport, percentile

WORKER = Path(__file__).with_name("policy_cpu_worker.py")
MEASURES = {
    "input_check": "input check of a new question (one message with an ID)",
    "answer_1_delta": "moderated answer of one delta and its end",
    "answer_1_new_delta": "moderated answer of one delta never seen before and its end",
    "answer_48_deltas": "moderated answer of 48 deltas and its end",
}


def _worker(build: Baseline | None, rounds: int, n: int) -> dict[str, list[float]]:
    env = {**os.environ, **(build.env if build else {"PYTHONPATH": str(REPO)})}
    done = subprocess.run(
        # -P: the worker's own directory is not put on sys.path (benchmarks/policy.py would hide
        # the policy package).
        [sys.executable, "-P", str(WORKER), "--rounds", str(rounds), "--n", str(n)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    expected = (build.tree if build else REPO) / "policy"
    if Path(result["policy"]).resolve() != expected.resolve():
        raise RuntimeError(f"the worker imported policy from {result['policy']}, not {expected}")
    us: dict[str, list[float]] = result["us"]
    return us


def _row(measure: str, system: str, values: list[float]) -> dict[str, Any]:
    return {
        "measure": MEASURES[measure],
        "system": system,
        "cpu_us_p50": round(percentile(values, 50), 1),
        "cpu_us_p10": round(percentile(values, 10), 1),
        "cpu_us_p90": round(percentile(values, 90), 1),
        "rounds": len(values),
    }


def run(argv: list[str]) -> BenchReport:
    parser = argparse.ArgumentParser(prog="llmesh bench policy-cpu")
    parser.add_argument(
        "--baseline", metavar="REV", help="an earlier revision (git), measured beside this tree"
    )
    parser.add_argument("--runs", type=int, default=6, help="worker processes per build, taking turns")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every measure per worker")
    parser.add_argument("--n", type=int, default=200, help="items per round (48-delta answers: a quarter)")
    args = parser.parse_args(argv)
    builds: list[tuple[str, Baseline | None]] = [("this tree", None)]
    if args.baseline:
        root = Path(tempfile.gettempdir()) / "llmesh-bench-baselines"
        base = unpack(args.baseline, root)
        builds.append((base.commit, base))
    samples: dict[str, dict[str, list[float]]] = {name: {m: [] for m in MEASURES} for name, _ in builds}
    for i in range(args.runs):
        # Alternate which build goes first, so neither always runs on a machine the other warmed.
        for name, build in builds if i % 2 == 0 else builds[::-1]:
            print(f"  run {i + 1} {name}", flush=True)
            for measure, values in _worker(build, args.rounds, args.n).items():
                samples[name][measure].extend(values)
    rows = [_row(m, name, samples[name][m]) for m in MEASURES for name, _ in builds]
    headline: dict[str, Any] = {
        f"cpu_us_{m}": round(percentile(samples["this tree"][m], 50), 1) for m in MEASURES
    }
    if len(builds) == 2:
        base_name = builds[1][0]
        headline["baseline"] = base_name
        for m in MEASURES:
            ours, theirs = percentile(samples["this tree"][m], 50), percentile(samples[base_name][m], 50)
            headline[f"baseline_cpu_us_{m}"] = round(theirs, 1)
            headline[f"{m}_vs_baseline"] = round(ours / theirs, 3)
    notes = [
        "thread CPU per item in the worker process (no gRPC, Redis or audit): the median over rounds",
        f"options: {' '.join(argv) or '(defaults)'}",
    ]
    return BenchReport("policy-cpu", rows, headline, notes)
