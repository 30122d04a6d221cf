"""`llmesh smoke` against real servers, with reflection on and off."""

from __future__ import annotations

import asyncio

from services.runtime.cli.smoke import check_address
from services.runtime.server import build_server
from services.runtime.settings import ServiceSettings
from tests.fixtures.fake_inference import FakeInference, inference_binding


async def test_smoke_lists_describes_and_checks_health() -> None:
    server = await build_server(ServiceSettings(port=0), [inference_binding(FakeInference())])
    try:
        rows = await asyncio.to_thread(check_address, f"127.0.0.1:{server.port}")
    finally:
        await server.stop(0)
    checks = {check: (ok, detail) for check, ok, detail in rows}
    assert all(ok for ok, _ in checks.values()), rows
    assert "llmesh.v1.InferenceService" in checks["list"][1]
    assert checks["health"] == (True, "SERVING")


async def test_smoke_without_reflection_still_checks_health() -> None:
    # The gateway's public port and the production overlay run without reflection.
    server = await build_server(
        ServiceSettings(port=0, reflection=False), [inference_binding(FakeInference())]
    )
    try:
        rows = await asyncio.to_thread(check_address, f"127.0.0.1:{server.port}")
    finally:
        await server.stop(0)
    assert [check for check, _, _ in rows] == ["list", "health"]
    assert all(ok for _, ok, _ in rows), rows
    assert "reflection off" in rows[0][2]
