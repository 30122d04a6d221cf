"""Rolling upgrade (short form): each service instance in turn gets SIGTERM, drains, and starts
again on its port, under streaming load.

``pytest -m soak tests/reliability/test_upgrade.py``; ``llmesh bench upgrade`` is the same with more
clients. The mesh runs two inference replicas, two policy instances (the gateway balances over
them with client-side health checking) and two gateways behind the load client's balancer (each
new request goes to a gateway whose /readyz answered 200 on its latest poll). Cache and embeddings
run one instance each and degrade to BYPASS while away. Every restart must cost no request.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from benchmarks.reliability.scenarios import UpgradeConfig, upgrade

# Minutes of load plus a mesh of their own: a longer limit than the suite default.
pytestmark = [pytest.mark.soak, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    tmp: Path = tmp_path_factory.mktemp("upgrade")
    report = asyncio.run(upgrade(UpgradeConfig(replicas=2, clients=6, max_tokens=16, results_dir=tmp)))
    return {r["phase"]: r for r in report.rows}


@pytest.mark.parametrize(
    "instance",
    [
        "cache",
        "policy-1",
        "policy-2",
        "embeddings",
        "inference-1",
        "inference-2",
        "gateway-1",
        "gateway-2",
    ],
)
def test_draining_any_instance_costs_no_request(rows: dict[str, dict[str, Any]], instance: str) -> None:
    row = rows[instance]
    assert row["exit_code"] == 0  # drained and exited by itself within the grace period
    assert row["hangs"] == 0
    assert row["failed"] == 0, row["error_messages"]
