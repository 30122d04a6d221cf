"""`llmesh bench policy-cpu`: each build's worker measures the policy package of its own tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import policy_cpu
from benchmarks.baseline import REPO, Baseline


def test_the_worker_measures_every_measure_in_each_round() -> None:
    us = policy_cpu._worker(None, rounds=2, n=4)
    assert set(us) == set(policy_cpu.MEASURES)
    assert all(len(values) == 2 and all(v > 0 for v in values) for values in us.values())
    # A 48-delta answer costs more than a one-delta one; an opening never seen costs more than a
    # kept one (its first step and offers are taken, not copied).
    assert min(us["answer_48_deltas"]) > max(us["answer_1_delta"])
    assert min(us["answer_1_new_delta"]) > max(us["answer_1_delta"])


def test_a_worker_that_imports_another_trees_policy_is_refused(tmp_path: Path) -> None:
    # A baseline whose tree has no policy package: the worker falls back to this checkout's, and
    # the bench says so instead of reporting today's figures as the baseline's.
    (tmp_path / "protos").mkdir()
    with pytest.raises(RuntimeError, match="not"):
        policy_cpu._worker(Baseline("0000000", tmp_path), rounds=1, n=2)


def test_the_report_names_both_builds_and_their_ratio(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy_cpu, "unpack", lambda rev, root: Baseline("abc1234", REPO))
    report = policy_cpu.run(["--baseline", "HEAD", "--runs", "2", "--rounds", "1", "--n", "2"])
    assert {row["system"] for row in report.rows} == {"this tree", "abc1234"}
    assert len(report.rows) == 2 * len(policy_cpu.MEASURES)
    assert report.headline["baseline"] == "abc1234"
    assert all(report.headline[f"{m}_vs_baseline"] > 0 for m in policy_cpu.MEASURES)
