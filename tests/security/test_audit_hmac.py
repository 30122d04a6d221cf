"""The audit chain is keyed with a secret kept out of Redis (issue 14, row "the audit hash chain is
plain SHA-256 with heads and checkpoints in the same Redis").

Before the fix each record's link was ``sha256(record)``: whoever could write Redis could change
a decision, recompute every hash after it and the chain's head, and ``llmesh audit verify``
passed. Now the links are HMAC-SHA256 under ``LLMESH_POLICY_AUDIT_HMAC_KEY`` (or ``_FILE``),
which the policy service and the verifier hold and Redis does not, and a policy service that
listens beyond loopback without one does not start.

Real components: the policy service over gRPC on the test Redis, ``llmesh audit verify`` (its
CLI entry point) reading that Redis.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from llmesh.v1 import policy_pb2

from policy.app import create
from policy.audit import canonical, cli, heads_key, record_hash, stream_key
from policy.config import PolicySettings
from services.runtime.errors import Unavailable
from tests.integration.policy.conftest import Served, serve_policy, tenant_md

RULESET = Path(__file__).resolve().parents[2] / "policy" / "rulesets" / "default.yaml"


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "audit.key"
    path.write_text(secrets.token_hex(32) + "\n")
    return path


@pytest.fixture
async def policy(redis_url: str, key_file: Path) -> AsyncIterator[Served]:
    served = await serve_policy(redis_url, RULESET, audit_hmac_key_file=str(key_file))
    yield served
    await served.close()


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Any]:
    client = aioredis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


async def rewrite_with_plain_sha256(redis: Any, key: str, index: int) -> None:
    """What an attacker with Redis write access does: flip one decision to ALLOW, recompute the
    chain after it with SHA-256 (the old link) and move the head to the new last hash."""
    entries = await redis.xrange(stream_key(key))
    await redis.delete(stream_key(key))
    prev = json.loads(entries[index][1]["record"])["prev"]
    for i, (_, fields) in enumerate(entries):
        written = fields
        if i >= index:
            body = json.loads(fields["record"])
            if i == index:
                body["action"] = "allow"
            body["prev"] = prev
            record = canonical(body)
            prev = record_hash(record)
            written = {**fields, "record": record, "hash": prev}
        await redis.xadd(stream_key(key), written)
    chain = entries[-1][1]["chain"]
    await redis.hset(heads_key(key), chain, f"{entries[-1][1]['seq']}:{prev}")


async def test_a_record_rewritten_with_a_recomputed_sha256_chain_is_detected(
    policy: Served, redis: Any, redis_url: str, key_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(5):
        await policy.stub.CheckOutput(
            policy_pb2.CheckOutputRequest(text=f"mail x{i}@example.com"), metadata=tenant_md("acme")
        )
    assert await policy.app.audit.flush(5)
    key = policy.app.settings.audit_key
    monkeypatch.setenv("LLMESH_POLICY_AUDIT_HMAC_KEY_FILE", str(key_file))
    args = ["verify", "--redis-url", redis_url, "--key", key]
    assert await asyncio.to_thread(cli, args) == 0

    await rewrite_with_plain_sha256(redis, key, 2)
    assert await asyncio.to_thread(cli, args) == 1


async def test_no_key_beyond_loopback_refuses_to_start_and_verify_needs_one(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLMESH_POLICY_AUDIT_HMAC_KEY", raising=False)
    monkeypatch.delenv("LLMESH_POLICY_AUDIT_HMAC_KEY_FILE", raising=False)
    monkeypatch.setenv("LLMESH_DATA_DIR", str(tmp_path))
    with pytest.raises(Unavailable) as refused:
        await create(PolicySettings(host="0.0.0.0", port=0, redis_url=redis_url, ruleset_path=RULESET))
    assert "LLMESH_POLICY_AUDIT_HMAC_KEY" in refused.value.message
    assert await asyncio.to_thread(cli, ["verify", "--redis-url", redis_url]) == 2
    # On loopback (`llmesh up`) a key is generated into the data directory, owner-only.
    app = await create(PolicySettings(port=0, redis_url=redis_url, ruleset_path=RULESET))
    try:
        generated = tmp_path / "policy-audit.key"
        assert generated.stat().st_mode & 0o777 == 0o600
    finally:
        await app.close()
