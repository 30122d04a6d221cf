"""``llmesh admin`` as a subprocess against a served gateway (fake inference, real policy
service, real Redis): tenants, keys (used with the official openai SDK), rulesets, errors."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import pytest_asyncio
from pydantic import SecretStr

from gateway.config import GatewaySettings
from policy.config import DEFAULT_RULESET
from tests.fixtures.admin import new_tenant
from tests.fixtures.fake_inference import MODEL, FakeInference, start_fake
from tests.fixtures.gateway import RunningGateway, serve_gateway
from tests.fixtures.ports import free_port
from tests.integration.policy.conftest import ADMIN_TOKEN as POLICY_ADMIN_TOKEN
from tests.integration.policy.conftest import serve_policy

__all__ = ["new_tenant"]

ADMIN = "cli-admin-" + uuid.uuid4().hex


@dataclass
class Served:
    gateway: RunningGateway
    data_dir: Path


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def served(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    rules = tmp_path_factory.mktemp("rules") / "rules.yaml"
    shutil.copy(DEFAULT_RULESET, rules)
    policy = await serve_policy(redis_url, rules)
    inference = await start_fake(FakeInference("r1"))
    # Where `llmesh up` would have written the admin token.
    data_dir = tmp_path_factory.mktemp("data")
    (data_dir / "run").mkdir()
    (data_dir / "run" / "admin-token").write_text(ADMIN + "\n")
    settings = GatewaySettings(
        inference_addresses=[inference.address],
        policy_address=policy.server.address,
        admin_token=SecretStr(ADMIN),
        policy_admin_token=SecretStr(POLICY_ADMIN_TOKEN),
        api_keys={},
        allow_open=False,
    )
    try:
        async with serve_gateway(settings) as gateway:
            yield Served(gateway, data_dir)
    finally:
        await inference.stop(0)
        await policy.close()


async def llmesh_admin(served: Served, *args: str, url: str | None = None) -> tuple[int, str, str]:
    env = {
        **os.environ,
        "LLMESH_DATA_DIR": str(served.data_dir),
        "LLMESH_GATEWAY_URL": url or served.gateway.url,
    }
    env.pop("LLMESH_GATEWAY_ADMIN_TOKEN", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.runtime.cli.main",
        "admin",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def _ok(served: Served, *args: str) -> str:
    code, out, err = await llmesh_admin(served, *args)
    assert code == 0, f"llmesh admin {' '.join(args)}: exit {code}\n{out}\n{err}"
    return out


async def _chat(served: Served, key: str) -> str:
    async with openai.AsyncOpenAI(base_url=served.gateway.base_url, api_key=key, max_retries=0) as sdk:
        reply = await sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    return reply.choices[0].message.content or ""


def _new_key(output: str) -> tuple[str, str]:
    match = re.search(r"^(key_[0-9a-f]+)\s.*\nkey: (sk-llmesh-\S+)$", output, re.MULTILINE)
    assert match is not None, output
    return match.group(1), match.group(2)


async def test_tenants_and_keys_from_the_command_line(served: Served, new_tenant: Callable[[], str]) -> None:
    tenant = new_tenant()
    out = await _ok(
        served, "tenants", "set", tenant, "--models", MODEL, "--rpm", "100", "--budget-day", "5000"
    )
    assert tenant in out and '"token_budget_per_day"' not in out and "token_budget_per_day=5000" in out
    # `set` changes only what it is given.
    out = await _ok(served, "tenants", "set", tenant, "--tpm", "9000")
    assert "requests_per_minute=100" in out and "tokens_per_minute=9000" in out

    out = await _ok(served, "keys", "create", "--tenant", tenant, "--name", "ci", "--expires-in", "30d")
    key_id, key = _new_key(out)
    assert "shown once" in out
    assert await _chat(served, key) == "echo: hi"

    listed = json.loads(await _ok(served, "--json", "keys", "list", "--tenant", tenant))
    [entry] = listed["data"]
    assert entry["id"] == key_id and entry["name"] == "ci" and "key" not in entry
    assert entry["expires_at"] - entry["created_at"] == 30 * 86400

    rotated_id, rotated = _new_key(await _ok(served, "keys", "rotate", key_id))
    assert rotated_id == key_id and rotated != key
    assert await _chat(served, rotated) == "echo: hi"
    with pytest.raises(openai.AuthenticationError):
        await _chat(served, key)

    out = await _ok(served, "keys", "revoke", key_id)
    assert "revoked" in out
    with pytest.raises(openai.AuthenticationError, match="revoked"):
        await _chat(served, rotated)

    assert tenant in await _ok(served, "tenants", "list")


async def test_rules_reload(served: Served) -> None:
    out = await _ok(served, "rules", "reload")
    assert out.startswith("ruleset ") and " rules; policy version " in out


async def test_errors_are_one_line_and_exit_1(served: Served, new_tenant: Callable[[], str]) -> None:
    code, _, err = await llmesh_admin(served, "--token", "wrong", "tenants", "list")
    assert code == 1 and "HTTP 401" in err and "invalid admin token" in err
    code, _, err = await llmesh_admin(served, "keys", "create", "--tenant", new_tenant())
    assert code == 1 and "HTTP 404" in err and "create it first" in err
    code, _, err = await llmesh_admin(served, "tenants", "list", url=f"http://127.0.0.1:{free_port()}")
    assert code == 1 and "cannot reach the gateway" in err
    code, _, err = await llmesh_admin(served, "keys", "create", "--tenant", "t", "--expires-in", "soon")
    assert code == 2 and "not a duration" in err
