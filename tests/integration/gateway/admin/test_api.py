"""The admin API over HTTP: a served gateway (fake inference, real policy service, real Redis),
the official openai SDK as the tenant's client."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio
from pydantic import SecretStr

from gateway.auth import hash_key
from gateway.config import GatewaySettings
from policy.config import DEFAULT_RULESET
from services.runtime.server import RunningServer
from tests.fixtures.fake_inference import MODEL, FakeInference, start_fake
from tests.fixtures.gateway import RunningGateway, serve_gateway
from tests.integration.policy.conftest import ADMIN_TOKEN as POLICY_ADMIN_TOKEN
from tests.integration.policy.conftest import Served, serve_policy

ADMIN = "gw-admin-" + uuid.uuid4().hex
BOOT_KEY = "sk-boot-" + uuid.uuid4().hex[:8]
RULES_YAML = DEFAULT_RULESET.read_text(encoding="utf-8")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def inference() -> AsyncIterator[str]:
    server: RunningServer = await start_fake(FakeInference("r1"))
    yield server.address
    await server.stop(0)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def policy(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    rules = tmp_path_factory.mktemp("rules") / "rules.yaml"
    shutil.copy(DEFAULT_RULESET, rules)
    served = await serve_policy(redis_url, rules)
    yield served
    await served.close()


def _settings(inference: str, **overrides: Any) -> GatewaySettings:
    return GatewaySettings(
        inference_addresses=[inference], api_keys={hash_key(BOOT_KEY): "boot"}, **overrides
    )


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def gw(inference: str, policy: Served) -> AsyncIterator[RunningGateway]:
    settings = _settings(
        inference,
        policy_address=policy.server.address,
        admin_token=SecretStr(ADMIN),
        policy_admin_token=SecretStr(POLICY_ADMIN_TOKEN),
    )
    async with serve_gateway(settings) as running:
        yield running


@pytest_asyncio.fixture
async def admin(gw: RunningGateway) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"authorization": f"Bearer {ADMIN}"}
    async with httpx.AsyncClient(base_url=gw.url + "/v1/admin", headers=headers, timeout=30) as client:
        yield client


async def _chat(gw: RunningGateway, key: str, model: str = MODEL) -> str:
    async with openai.AsyncOpenAI(base_url=gw.base_url, api_key=key, max_retries=0) as sdk:
        reply = await sdk.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=5
        )
    return reply.choices[0].message.content or ""


async def _chat_error(gw: RunningGateway, key: str, model: str = MODEL) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as caught:
        await _chat(gw, key, model)
    return caught.value


def _error(response: httpx.Response) -> dict[str, Any]:
    error = response.json()["error"]
    assert isinstance(error, dict)
    return error


# -- who may call it ----------------------------------------------------------------------------------


async def test_without_an_admin_token_the_admin_api_is_off(inference: str) -> None:
    async with serve_gateway(_settings(inference)) as running, httpx.AsyncClient() as client:
        response = await client.get(
            running.url + "/v1/admin/keys", headers={"authorization": f"Bearer {BOOT_KEY}"}
        )
    assert response.status_code == 404
    assert "LLMESH_GATEWAY_ADMIN_TOKEN" in _error(response)["message"]


@pytest.mark.parametrize("header", [None, "Bearer wrong", f"Bearer {BOOT_KEY}", f"Basic {ADMIN}"])
async def test_only_the_admin_token_opens_the_admin_api(gw: RunningGateway, header: str | None) -> None:
    # An API key (BOOT_KEY is one) never authorizes it; the body is never read either.
    headers = {} if header is None else {"authorization": header}
    async with httpx.AsyncClient() as client:
        response = await client.post(
            gw.url + "/v1/admin/keys", headers=headers, json={"tenant": "boot", "name": "x" * 10}
        )
    assert response.status_code == 401
    assert _error(response)["type"] == "authentication_error"


async def test_the_admin_token_is_not_an_api_key(gw: RunningGateway) -> None:
    error = await _chat_error(gw, ADMIN)
    assert error.status_code == 401


# -- keys ---------------------------------------------------------------------------------------------


async def test_key_lifecycle_through_the_api_takes_effect_at_once(
    gw: RunningGateway, admin: httpx.AsyncClient, new_tenant: Callable[[], str]
) -> None:
    tenant = new_tenant()
    created = await admin.put(f"/tenants/{tenant}", json={"models": [MODEL], "requests_per_minute": 100})
    assert created.status_code == 201, created.text
    assert created.json()["settings"]["requests_per_minute"] == 100
    assert (await admin.put(f"/tenants/{tenant}", json={"models": [MODEL]})).status_code == 200

    response = await admin.post("/keys", json={"tenant": tenant, "name": "ci", "expires_in": 86400})
    assert response.status_code == 201, response.text
    key = response.json()
    secret = key["key"]
    assert secret.startswith("sk-llmesh-") and key["status"] == "active" and key["name"] == "ci"
    assert key["redacted_value"].endswith(secret[-4:]) and key["expires_at"] == key["created_at"] + 86400
    # Works at once, with the official SDK.
    assert await _chat(gw, secret) == "echo: hello"

    shown = (await admin.get(f"/keys/{key['id']}")).json()
    assert "key" not in shown and shown["id"] == key["id"]
    listed = (await admin.get("/keys", params={"tenant": tenant})).json()
    assert [k["id"] for k in listed["data"]] == [key["id"]] and "key" not in listed["data"][0]

    rotated = (await admin.post(f"/keys/{key['id']}/rotate")).json()
    assert rotated["id"] == key["id"] and rotated["key"] != secret and rotated["rotated_at"]
    assert await _chat(gw, rotated["key"]) == "echo: hello"
    old = await _chat_error(gw, secret)
    assert old.status_code == 401 and "invalid API key" in old.message

    revoked = await admin.delete(f"/keys/{key['id']}")
    assert revoked.status_code == 200 and revoked.json()["status"] == "revoked"
    refused = await _chat_error(gw, rotated["key"])
    assert refused.status_code == 401 and "API key revoked" in refused.message
    assert (await admin.get(f"/keys/{key['id']}")).json()["status"] == "revoked"
    again = await admin.post(f"/keys/{key['id']}/rotate")
    assert again.status_code == 400 and "revoked" in _error(again)["message"]


async def test_key_errors(admin: httpx.AsyncClient, new_tenant: Callable[[], str]) -> None:
    unknown = await admin.post("/keys", json={"tenant": new_tenant()})
    assert unknown.status_code == 404 and "PUT /v1/admin/tenants/" in _error(unknown)["message"]
    assert (await admin.get("/keys/key_0000000000000000")).status_code == 404
    assert (await admin.delete("/keys/key_0000000000000000")).status_code == 404
    assert (await admin.get("/keys/not-a-key-id")).status_code == 400
    typo = await admin.post("/keys", json={"tenant": "boot", "expires": 5})
    assert typo.status_code == 400 and "expires" in _error(typo)["message"]
    bad = await admin.post("/keys", json={"tenant": "boot", "expires_in": 0})
    assert bad.status_code == 400


# -- tenants ------------------------------------------------------------------------------------------


async def test_tenant_settings_apply_to_the_next_request(
    gw: RunningGateway, admin: httpx.AsyncClient, new_tenant: Callable[[], str]
) -> None:
    tenant = new_tenant()
    await admin.put(f"/tenants/{tenant}", json={})
    secret = (await admin.post("/keys", json={"tenant": tenant})).json()["key"]
    assert await _chat(gw, secret) == "echo: hello"
    patched = await admin.patch(f"/tenants/{tenant}", json={"models": ["another-model"]})
    assert patched.status_code == 200 and patched.json()["settings"]["models"] == ["another-model"]
    refused = await _chat_error(gw, secret)
    assert refused.status_code == 403
    listed = {t["name"]: t for t in (await admin.get("/tenants")).json()["data"]}
    assert listed[tenant]["source"] == "admin" and listed[tenant]["settings"]["models"] == ["another-model"]
    one = (await admin.get(f"/tenants/{tenant}")).json()
    assert one["name"] == tenant and one["object"] == "tenant"


async def test_tenant_errors(admin: httpx.AsyncClient, new_tenant: Callable[[], str]) -> None:
    missing = new_tenant()
    assert (await admin.patch(f"/tenants/{missing}", json={"models": []})).status_code == 404
    assert (await admin.get(f"/tenants/{missing}")).status_code == 404
    typo = await admin.put(f"/tenants/{missing}", json={"rpm": 5})
    assert typo.status_code == 400 and "unknown tenant setting 'rpm'" in _error(typo)["message"]
    negative = await admin.put(f"/tenants/{missing}", json={"token_budget_per_day": -1})
    assert negative.status_code == 400
    assert (await admin.put("/tenants/a:b", json={})).status_code == 400
    assert (await admin.get(f"/tenants/{missing}")).status_code == 404


# -- budgets ------------------------------------------------------------------------------------------


async def test_a_spent_budget_is_429_budget_exceeded(
    gw: RunningGateway, admin: httpx.AsyncClient, new_tenant: Callable[[], str]
) -> None:
    tenant = new_tenant()
    await admin.put(f"/tenants/{tenant}", json={"token_budget_per_day": 3})
    secret = (await admin.post("/keys", json={"tenant": tenant})).json()["key"]
    # Under the budget: served (and its tokens, more than 3, are counted when it ends).
    assert await _chat(gw, secret) == "echo: hello"
    error = await _chat_error(gw, secret)
    assert error.status_code == 429
    body = error.body
    assert isinstance(body, dict) and body["code"] == "budget_exceeded"
    assert "per day" in body["message"] and "resets at" in body["message"]
    assert 1 <= int(error.response.headers["retry-after"]) <= 86400
    # Raising the budget lets the tenant back in at once.
    await admin.patch(f"/tenants/{tenant}", json={"token_budget_per_day": 10**6})
    assert await _chat(gw, secret) == "echo: hello"


# -- open mode ----------------------------------------------------------------------------------------


async def test_the_first_key_closes_an_open_gateway_at_once(
    inference: str, new_tenant: Callable[[], str]
) -> None:
    settings = GatewaySettings(inference_addresses=[inference], admin_token=SecretStr(ADMIN))
    async with serve_gateway(settings) as running:
        directory = running.gateway.auth.directory
        assert directory is not None
        if directory.has_keys:
            pytest.fail("this Redis database holds API key records of another run: the open case needs none")
        assert await _chat(running, "anything") == "echo: hello"  # open: every caller is "default"
        tenant = new_tenant()
        async with httpx.AsyncClient(
            base_url=running.url + "/v1/admin", headers={"authorization": f"Bearer {ADMIN}"}
        ) as client:
            await client.put(f"/tenants/{tenant}", json={})
            secret = (await client.post("/keys", json={"tenant": tenant})).json()["key"]
        assert (await _chat_error(running, "anything")).status_code == 401
        assert await _chat(running, secret) == "echo: hello"


# -- rulesets -----------------------------------------------------------------------------------------


async def test_rulesets_reload_through_the_gateway(admin: httpx.AsyncClient) -> None:
    reloaded = await admin.post("/rulesets/reload")
    assert reloaded.status_code == 200, reloaded.text
    body = reloaded.json()
    assert body["object"] == "ruleset" and body["rule_count"] > 0 and body["version"]
    given = await admin.post("/rulesets/reload", json={"yaml": RULES_YAML})
    assert given.status_code == 200
    invalid = await admin.post("/rulesets/reload", json={"yaml": "rules: [ {id: x"})
    assert invalid.status_code == 400


async def test_rulesets_reload_without_the_policy_token_says_what_to_set(
    inference: str, policy: Served
) -> None:
    settings = _settings(inference, policy_address=policy.server.address, admin_token=SecretStr(ADMIN))
    async with serve_gateway(settings) as running, httpx.AsyncClient() as client:
        response = await client.post(
            running.url + "/v1/admin/rulesets/reload", headers={"authorization": f"Bearer {ADMIN}"}
        )
    assert response.status_code == 400
    assert "LLMESH_GATEWAY_POLICY_ADMIN_TOKEN" in _error(response)["message"]
