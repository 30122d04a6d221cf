"""The audit log on a real Redis: chained records, `llmesh audit verify`, Redis down."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest
from llmesh.v1 import policy_pb2

from policy.audit import cli, stream_key
from policy.audit_check import trim, verify
from policy.audit_key import verifier_keys
from tests.integration.policy.conftest import Served, serve_policy, tenant_md

# The policy servers here listen on loopback with no key configured: they chain with the key
# generated in the data directory, which verifier_keys([]) (like `llmesh audit verify`) reads.

pytestmark = pytest.mark.asyncio


async def decide(policy: Served, n: int) -> None:
    for i in range(n):
        await policy.stub.CheckOutput(
            policy_pb2.CheckOutputRequest(text=f"answer {i} to x{i}@example.com"), metadata=tenant_md("acme")
        )


async def test_verify_passes_then_detects_removal_and_alteration(
    policy: Served, redis_url: str, redis_client: Any
) -> None:
    await decide(policy, 5)
    assert await policy.app.audit.flush(5)
    key = policy.app.settings.audit_key
    redis = redis_client
    report = await verify(redis, key, verifier_keys([]))
    assert report.ok and report.records == 5

    args = ["verify", "--redis-url", redis_url, "--key", key]
    assert await asyncio.to_thread(cli, args) == 0

    entries = await redis.xrange(stream_key(key))
    await redis.xdel(stream_key(key), entries[2][0])
    removed = await verify(redis, key, verifier_keys([]))
    assert not removed.ok and any("removed" in p.reason for p in removed.problems)
    assert await asyncio.to_thread(cli, args) == 1

    # Rewrite the stream with one record altered (a stream entry cannot be edited in place).
    await redis.delete(stream_key(key))
    for i, (_, fields) in enumerate(entries):
        copy = dict(fields)
        if i == 1:
            copy["record"] = copy["record"].replace('"redact"', '"allow"')
        await redis.xadd(stream_key(key), copy)
    altered = await verify(redis, key, verifier_keys([]))
    assert any("altered" in p.reason for p in altered.problems)


async def test_redis_down_buffers_then_refuses_and_health_reflects_it(ruleset_file: Path) -> None:
    served = await serve_policy("redis://127.0.0.1:1/0", ruleset_file, audit_buffer_limit=3)
    try:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        health = health_pb2_grpc.HealthStub(served.channel)
        await decide(served, 3)  # checks still run, records wait in memory
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await decide(served, 1)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        status = await health.Check(health_pb2.HealthCheckRequest(service="llmesh.v1.PolicyService"))
        assert status.status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert served.app.audit.buffered == 3
    finally:
        await served.channel.close()
        await served.server.stop(0)
        await served.app.audit.close(wait_s=0.1)
        await served.app.redis.aclose()


async def test_trim_keeps_a_checkpoint_and_verify_still_catches_removals(
    policy: Served, redis_client: Any
) -> None:
    await decide(policy, 6)
    assert await policy.app.audit.flush(5)
    key = policy.app.settings.audit_key
    redis = redis_client
    entries = await redis.xrange(stream_key(key))
    # Trim what was written in milliseconds before the 4th record's (up to its first 3 records).
    cutoff_ms = int(entries[3][0].split("-")[0])
    removed = await trim(redis, key, cutoff_ms)
    remaining = await redis.xrange(stream_key(key))
    assert removed == 6 - len(remaining) and len(remaining) >= 3
    assert (await verify(redis, key, verifier_keys([]))).ok
    await redis.xdel(stream_key(key), remaining[0][0])
    assert any("removed" in p.reason for p in (await verify(redis, key, verifier_keys([]))).problems)
