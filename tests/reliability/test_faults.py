"""Faults under load (short form): kill -9 and restart each service and Redis, SIGSTOP past the deadline.

``pytest -m soak tests/reliability/test_faults.py``; ``llmesh bench faults`` is the same with more
clients. Expected behaviour (issue 10, ARCHITECTURE.md "Failure behaviour"): cache/embeddings down → served
without them (BYPASS); policy down → 503, fail closed, back without restarting the gateway; one
inference replica down or frozen → nothing fails: its streams in flight continue on the other replica
(issue 18), new requests go elsewhere; Redis restart → no version issued twice.
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


def test_a_killed_replica_loses_no_request(rows: dict[str, dict[str, Any]]) -> None:
    """Its streams in flight continue on the other replica (the load is n = 1, plain text);
    requests not yet started go there from the start."""
    row = rows["inference-2 kill"]
    assert row["hangs"] == 0
    assert row["failed"] == 0, row["error_messages"]


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
    if target == "inference-2":  # its streams are cut within ~2 s and continue elsewhere
        assert row["failed"] == 0, row["error_messages"]


# -- a replicated Redis: kill -9 of its primary ----------------------------------------------------


@pytest.fixture(scope="module")
def sentinel_rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """``llmesh bench faults --redis sentinel --kill redis --pause ""`` in short form: a primary, two
    replicas and three sentinels (benchmarks/reliability/redis_ha.py) that every service reaches
    through its ``redis+sentinel://`` URL; the primary is killed under load and comes back as a
    replica. The gateway has a configured API key, as deployed (an open gateway asks Redis whether
    it may stay open while its key-store snapshot is stale, and refuses requests meanwhile)."""
    config = FaultsConfig(
        replicas=1,
        clients=4,
        kills=("redis",),
        pauses=(),
        down_s=3.0,
        request_timeout_s=60.0,
        max_tokens=16,
        redis="sentinel",
        api_key=True,
        results_dir=tmp_path_factory.mktemp("faults-redis"),
    )
    report = asyncio.run(faults(config))
    out = {f"{r['phase']} {r['action'].split()[0]}": r for r in report.rows}
    out["_headline"] = report.headline
    return out


def test_killing_the_redis_primary_loses_no_request(sentinel_rows: dict[str, dict[str, Any]]) -> None:
    """A sentinel promotes a replica; services find it through the sentinels; no request fails and
    no session version is issued twice or read below an acknowledged one."""
    row = sentinel_rows["redis-primary kill"]
    assert row["failover_s"] is not None, row
    assert row["new_primary"] != row["old_primary"]
    assert row["failed"] == 0, row["error_messages"]
    assert row["hangs"] == 0
    assert row["version_violations"] == 0
    assert sentinel_rows["_headline"]["version_checks"] > 0  # the session clients did check
    assert row["recovered_after_failover_s"] is not None  # served with the cache again
    assert row["rejoined_s"] is not None  # the killed node is back, a replica in sync
