"""Faults under load (short form): kill -9 and restart each service and Redis, SIGSTOP past the deadline.

``pytest -m soak tests/reliability/test_faults.py``; ``llmesh bench faults`` is the same with more
clients. Expected behaviour (issue 10, ARCHITECTURE.md "Failure behaviour"): cache/embeddings down → served
without them (BYPASS); policy down → 503, fail closed, back without restarting the gateway; one
inference replica down → only its in-flight streams fail, with an error, none hangs, new requests go
elsewhere; Redis restart → no version issued twice.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from benchmarks.reliability.scenarios import FaultsConfig, faults

# Minutes of load plus a mesh of their own: a longer limit than the suite default.
pytestmark = [pytest.mark.soak, pytest.mark.timeout(2400)]

POLICY_DOWN = "the policy service is unavailable"


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    tmp: Path = tmp_path_factory.mktemp("faults")
    config = FaultsConfig(
        replicas=2,
        clients=6,
        down_s=3.0,
        request_timeout_s=60.0,
        max_tokens=16,
        results_dir=tmp,
    )
    report = asyncio.run(faults(config))
    out = {f"{r['phase']} {r['action'].split()[0]}": r for r in report.rows}
    out["_headline"] = report.headline
    return out


def test_cache_down_is_served_without_it(rows: dict[str, dict[str, Any]]) -> None:
    row = rows["cache kill"]
    assert row["failed"] == 0, row["error_messages"]
    assert row["bypass"] > 0
    assert row["recovered_after_up_s"] is not None  # HIT/MISS again once it is back


def test_embeddings_down_loses_nothing(rows: dict[str, dict[str, Any]]) -> None:
    row = rows["embeddings kill"]
    assert row["failed"] == 0, row["error_messages"]


def test_policy_down_fails_closed_with_503_and_recovers(rows: dict[str, dict[str, Any]]) -> None:
    row = rows["policy kill"]
    assert row["failed"] > 0  # fail closed: nothing unmoderated goes out
    assert set(row["errors"]) <= {"http 503", "stream error service_unavailable"}, row["errors"]
    assert all(POLICY_DOWN in message for message in row["error_messages"]), row["error_messages"]
    assert row["hangs"] == 0
    assert row["recovered_after_up_s"] is not None  # the same gateway serves again


def test_a_killed_replica_fails_only_its_inflight_streams(rows: dict[str, dict[str, Any]]) -> None:
    row = rows["inference-2 kill"]
    assert row["hangs"] == 0
    assert row["new_failed_after_1s"] == 0, row["error_messages"]
    assert row["failed"] == row["inflight_failed"] + row["new_failed"]
    assert all(message.split(": ", 1)[1] for message in row["error_messages"])  # a clear error, not empty


def test_redis_restart_issues_no_version_twice(rows: dict[str, dict[str, Any]]) -> None:
    row = rows["redis kill"]
    assert row["version_violations"] == 0
    assert row["failed"] == 0, row["error_messages"]
    assert row["hangs"] == 0


@pytest.mark.parametrize("target", ["cache", "inference-2"])
def test_a_paused_service_hangs_nothing_and_recovers(rows: dict[str, dict[str, Any]], target: str) -> None:
    row = rows[f"{target} SIGSTOP"]
    assert row["hangs"] == 0, row["error_messages"]
    assert row["recovered_after_up_s"] is not None
