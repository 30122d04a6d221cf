"""ReloadRules needs an admin credential on every transport, plaintext loopback included: a tenant
(or no tenant, once the ``default`` one) is no credential. Real policy service, real Redis."""

from __future__ import annotations

import asyncio
import os
import stat
import uuid
from pathlib import Path

import grpc
import pytest
from llmesh.v1 import policy_pb2

from policy.config import DEFAULT_RULESET, PolicySettings
from services.runtime.cli import catalog, up
from tests.integration.policy.conftest import serve_policy, tenant_md

RULESET = "version: adm\nrules:\n  - id: words\n    detector: keyword\n    scope: both\n    action: block\n"
RULESET += "    options: {keywords: [zebra]}\n"
TOKEN = "s3cret-" + uuid.uuid4().hex


@pytest.fixture
def ruleset_file(tmp_path: Path) -> Path:
    path = tmp_path / "ruleset.yaml"
    path.write_bytes(DEFAULT_RULESET.read_bytes())
    return path


def test_no_tenant_is_admin_by_default() -> None:
    assert PolicySettings().admin_tenants == []


@pytest.mark.parametrize("metadata", [tenant_md("default"), []], ids=["default-tenant", "no-tenant"])
async def test_without_an_admin_token_configured_reload_is_refused_and_says_how(
    redis_url: str, ruleset_file: Path, metadata: list[tuple[str, str]]
) -> None:
    served = await serve_policy(redis_url, ruleset_file, admin_token="")
    try:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await served.stub.ReloadRules(policy_pb2.ReloadRulesRequest(yaml=RULESET), metadata=metadata)
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "LLMESH_POLICY_ADMIN_TOKEN" in (caught.value.details() or "")
        assert served.app.service.get_ruleset().version.startswith("default")
    finally:
        await served.close()


async def test_reload_needs_the_right_token_on_plaintext_loopback(redis_url: str, ruleset_file: Path) -> None:
    served = await serve_policy(redis_url, ruleset_file, admin_token=TOKEN)
    request = policy_pb2.ReloadRulesRequest(yaml=RULESET)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await served.stub.ReloadRules(request, metadata=tenant_md("default"))
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await served.stub.ReloadRules(request, metadata=[("authorization", "Bearer wrong")])
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert TOKEN not in (caught.value.details() or "")
        assert served.app.service.get_ruleset().version.startswith("default")

        reply = await served.stub.ReloadRules(request, metadata=[("authorization", f"Bearer {TOKEN}")])
        assert reply.version.startswith("adm+") and reply.rule_count == 1
        reply = await served.stub.ReloadRules(
            policy_pb2.ReloadRulesRequest(), metadata=[("x-llmesh-admin-token", TOKEN)]
        )
        assert reply.version.startswith("default")  # back to the file
    finally:
        await served.close()


async def test_the_file_watch_still_reloads_without_rpc(redis_url: str, ruleset_file: Path) -> None:
    served = await serve_policy(redis_url, ruleset_file, admin_token="")
    try:
        text = await asyncio.to_thread(ruleset_file.read_text)
        edited = text.replace("version: default-1", "version: watched-2")
        await asyncio.to_thread(ruleset_file.write_text, edited)
        assert await served.app.service.reload_file_if_changed()
        got = await served.stub.GetRuleset(policy_pb2.GetRulesetRequest(), metadata=tenant_md("acme"))
        assert got.version.startswith("watched-2+")
    finally:
        await served.close()


def test_llmesh_up_writes_a_private_random_admin_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMESH_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("LLMESH_POLICY_ADMIN_TOKEN", raising=False)
    token, path = up.ensure_admin_token()
    again, _ = up.ensure_admin_token()
    assert path == tmp_path / "run" / "admin-token" and path.read_text().strip() == again != token
    assert len(token) >= 32 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    policy = next(s for s in catalog.SERVICES if s.name == "policy")
    assert up.child_env(policy, 1, "127.0.0.1", {}, again)["LLMESH_POLICY_ADMIN_TOKEN"] == again
    monkeypatch.setenv("LLMESH_POLICY_ADMIN_TOKEN", "given")
    assert up.ensure_admin_token() == ("given", None)
