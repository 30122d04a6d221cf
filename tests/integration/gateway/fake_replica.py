"""A fake inference replica in a process of its own, for SIGSTOP / SIGKILL tests:
``python -m tests.integration.gateway.fake_replica`` (``FAKE_HOLD=1``: every stream
stops after its first word until the process ends)."""

from __future__ import annotations

import asyncio
import os

from llmesh.v1 import inference_pb2_grpc

from services.runtime.server import ServiceBinding, serve
from services.runtime.settings import ServiceSettings
from tests.unit.gateway.fakes import FakeInference


async def _run() -> None:
    servicer = FakeInference(
        os.environ.get("FAKE_NAME", "replica"),
        hold=asyncio.Event() if os.environ.get("FAKE_HOLD") == "1" else None,
    )
    binding = ServiceBinding(
        name="llmesh.v1.InferenceService",
        add=inference_pb2_grpc.add_InferenceServiceServicer_to_server,
        servicer=servicer,
    )
    await serve(ServiceSettings(port=0, grace_seconds=0.5, log_json=False), [binding])


if __name__ == "__main__":
    asyncio.run(_run())
