"""End to end: keys and tenants through the admin API of one gateway, used with the official
openai SDK on two gateways (the mesh's and a second one on the same Redis) in front of the real
services and the real model; a spent token budget is a 429."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio
from pydantic import SecretStr

from tests.e2e.mesh import Mesh
from tests.fixtures.admin import new_tenant
from tests.fixtures.gateway import RunningGateway, serve_gateway

pytestmark = pytest.mark.slow
__all__ = ["new_tenant"]

ADMIN = "e2e-admin-" + uuid.uuid4().hex


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def second(mesh: Mesh) -> AsyncIterator[RunningGateway]:
    """A second gateway in front of the same services and Redis, with the admin API on."""
    settings = mesh.gateway.gateway.settings.model_copy(update={"admin_token": SecretStr(ADMIN)})
    async with serve_gateway(settings) as running:
        yield running


@pytest_asyncio.fixture
async def admin(second: RunningGateway) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"authorization": f"Bearer {ADMIN}"}
    async with httpx.AsyncClient(base_url=second.url + "/v1/admin", headers=headers, timeout=30) as client:
        yield client


async def ask(gateway: RunningGateway, key: str) -> str:
    async with openai.AsyncOpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=120) as sdk:
        reply = await sdk.chat.completions.create(
            model="", messages=[{"role": "user", "content": "Say hello."}], max_tokens=8
        )
    assert reply.usage is not None and reply.usage.total_tokens > 0
    return reply.choices[0].message.content or ""


async def refused(gateway: RunningGateway, key: str) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as caught:
        await ask(gateway, key)
    return caught.value


async def _tenant_with_key(admin: httpx.AsyncClient, tenant: str, **settings: Any) -> dict[str, Any]:
    assert (await admin.put(f"/tenants/{tenant}", json=settings)).status_code == 201
    created = await admin.post("/keys", json={"tenant": tenant, "name": "e2e"})
    assert created.status_code == 201, created.text
    key: dict[str, Any] = created.json()
    return key


async def test_a_key_works_at_once_on_both_gateways_and_stops_at_once_when_revoked(
    mesh: Mesh, second: RunningGateway, admin: httpx.AsyncClient, new_tenant: Any
) -> None:
    key = await _tenant_with_key(admin, new_tenant())
    # No wait of any kind between the admin call and the first request, on either gateway.
    assert await ask(mesh.gateway, key["key"])
    assert await ask(second, key["key"])

    revoked = await admin.delete(f"/keys/{key['id']}")
    assert revoked.status_code == 200 and revoked.json()["status"] == "revoked"
    for gateway in (mesh.gateway, second):
        error = await refused(gateway, key["key"])
        assert error.status_code == 401 and "API key revoked" in error.message


async def test_a_spent_budget_is_429_on_every_gateway(
    mesh: Mesh, second: RunningGateway, admin: httpx.AsyncClient, new_tenant: Any
) -> None:
    # A budget the first answer spends (its prompt alone is longer).
    key = await _tenant_with_key(admin, new_tenant(), token_budget_per_day=5)
    assert await ask(mesh.gateway, key["key"])
    for gateway in (mesh.gateway, second):
        error = await refused(gateway, key["key"])
        assert error.status_code == 429
        assert isinstance(error.body, dict) and error.body["code"] == "budget_exceeded"
        assert "per day" in error.message and "resets at" in error.message
        assert int(error.response.headers["retry-after"]) >= 1
