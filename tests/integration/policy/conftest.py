"""A real policy server (real Redis from REDIS_URL, gRPC on port 0) for integration tests."""

from __future__ import annotations

import contextlib
import shutil
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis.asyncio as aioredis
from llmesh.v1 import policy_pb2_grpc

from policy.app import PolicyApp, create
from policy.audit import checkpoints_key, heads_key, stream_key
from policy.config import DEFAULT_RULESET, PolicySettings
from services.runtime.server import RunningServer, build_server


@dataclass
class Served:
    app: PolicyApp
    server: RunningServer
    channel: grpc.aio.Channel
    ruleset_path: Path

    @property
    def stub(self) -> policy_pb2_grpc.PolicyServiceAsyncStub:
        return policy_pb2_grpc.PolicyServiceStub(self.channel)

    async def close(self) -> None:
        await self.channel.close()
        await self.server.stop(0)
        settings = self.app.settings
        keys = [
            stream_key(settings.audit_key),
            heads_key(settings.audit_key),
            checkpoints_key(settings.audit_key),
            settings.shared_ruleset_key,
        ]
        with contextlib.suppress(Exception):  # a test may point the app at a dead Redis
            await self.app.audit.flush(2)  # written first, or the writer would recreate the keys
            await self.app.redis.delete(*keys)
        await self.app.close()


# ReloadRules needs an admin credential (services.runtime.authz); the test servers take this one.
ADMIN_TOKEN = "test-admin-" + uuid.uuid4().hex


async def serve_policy(redis_url: str, ruleset_path: Path, **overrides: Any) -> Served:
    overrides.setdefault("shared_ruleset_key", f"llmesh:test-ruleset:{uuid.uuid4().hex[:8]}")
    overrides.setdefault("admin_token", ADMIN_TOKEN)
    settings = PolicySettings(
        port=0,
        redis_url=redis_url,
        ruleset_path=ruleset_path,
        audit_key=f"llmesh:test-audit:{{{uuid.uuid4().hex[:8]}}}",
        watch_interval_s=0,  # tests drive the watch tick themselves
        grace_seconds=2.0,
        **overrides,
    )
    app = await create(settings)
    server = await build_server(settings, [app.binding()])
    await app.start(server)
    channel = grpc.aio.insecure_channel(server.address)
    return Served(app=app, server=server, channel=channel, ruleset_path=ruleset_path)


def tenant_md(tenant: str) -> list[tuple[str, str]]:
    return [("x-llmesh-tenant", tenant), ("x-request-id", uuid.uuid4().hex)]


def admin_md(tenant: str = "default") -> list[tuple[str, str]]:
    """``tenant_md`` plus the admin token ReloadRules needs."""
    return [*tenant_md(tenant), ("authorization", f"Bearer {ADMIN_TOKEN}")]


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[Any]:
    client = aioredis.from_url(redis_url, decode_responses=True)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def ruleset_file(tmp_path: Path) -> Path:
    path = tmp_path / "ruleset.yaml"
    shutil.copy(DEFAULT_RULESET, path)
    return path


@pytest.fixture
async def policy(redis_url: str, ruleset_file: Path) -> AsyncIterator[Served]:
    served = await serve_policy(redis_url, ruleset_file)
    try:
        yield served
    finally:
        await served.close()
