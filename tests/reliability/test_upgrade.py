"""Rolling upgrade (short form): each service in turn gets SIGTERM, drains, and starts again on
its port, under streaming load.

``pytest -m soak tests/reliability/test_upgrade.py``; ``llmesh bench upgrade`` is the same with more
clients. Services with a replica or a degraded mode (cache, embeddings, inference replicas) must
cost no request. Policy and the gateway run as one instance each in ``llmesh up``: while the one
instance restarts there is nothing to serve from, so what the clients see is checked to be clean
(policy: 503 fail closed; gateway: connection refused), never a hang, and recovered after.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from services.reliability.scenarios import UpgradeConfig, upgrade

# Minutes of load plus a mesh of their own: a longer limit than the suite default.
pytestmark = [pytest.mark.soak, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    tmp: Path = tmp_path_factory.mktemp("upgrade")
    report = asyncio.run(upgrade(UpgradeConfig(replicas=2, clients=6, max_tokens=16, results_dir=tmp)))
    return {r["phase"]: r for r in report.rows}


@pytest.mark.parametrize("service", ["cache", "embeddings", "inference-1", "inference-2"])
def test_draining_a_redundant_or_optional_service_costs_no_request(
    rows: dict[str, dict[str, Any]], service: str
) -> None:
    row = rows[service]
    assert row["exit_code"] == 0  # drained and exited by itself within the grace period
    assert row["failed"] == 0, row["error_messages"]


@pytest.mark.parametrize("service", ["policy", "gateway"])
def test_restarting_a_single_instance_fails_cleanly_and_recovers(
    rows: dict[str, dict[str, Any]], service: str
) -> None:
    row = rows[service]
    assert row["exit_code"] == 0
    assert row["hangs"] == 0
    assert row["recovered_after_up_s"] is not None
    allowed = {"http 503", "stream error service_unavailable", "transport ConnectError"}
    assert set(row["errors"]) <= allowed, row["error_messages"]
