"""Soak (short form): the real mesh under streaming load loses nothing, grows nothing, leaks nothing.

``pytest -m soak tests/reliability/test_soak.py``; the full run is ``llmesh bench soak``
(two replicas, 50 clients, 10 minutes).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.reliability.scenarios import SoakConfig, soak

# Minutes of load plus a mesh of their own: a longer limit than the suite default.
pytestmark = [pytest.mark.soak, pytest.mark.timeout(2400)]


async def test_short_soak_loses_nothing_and_leaks_nothing(tmp_path: Path) -> None:
    report = await soak(
        SoakConfig(
            replicas=1,
            clients=8,
            duration_s=45.0,
            warmup_s=20.0,
            interval_s=5.0,
            max_tokens=16,
            results_dir=tmp_path,
        )
    )
    headline = report.headline
    assert headline["requests"] > 0
    assert headline["failed"] == 0, report.notes
    assert headline["warmup_failed"] == 0
    assert headline["version_violations"] == 0
    for row in report.rows:
        # Idle after the load as before it: every connection closed, every task gone.
        assert row["task_leak"] is not None and row["task_leak"] <= 0, row
        assert row["tcp_leak"] is not None and row["tcp_leak"] <= 0, row
        assert row["fd_leak"] is not None and row["fd_leak"] <= 0, row
        assert row["rss_growth_pct"] < 5.0, row
