"""API keys (hashed in config) to tenants; HTTP headers to the request context."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from gateway.api.context import context_from_headers, response_headers
from gateway.auth import Authenticator, Principal, authorize_admin, hash_key
from gateway.config import GatewaySettings, TenantSettings
from services.runtime.errors import InvalidArgument, NotFound, PermissionDenied, Unauthenticated


def _auth() -> Authenticator:
    return Authenticator(
        GatewaySettings(
            api_keys={hash_key("sk-a"): "team-a"},
            tenants={"team-a": TenantSettings(models=["m1"], requests_per_minute=5)},
        )
    )


async def test_key_maps_to_tenant_with_settings() -> None:
    principal = await _auth().authenticate("Bearer sk-a")
    assert principal.tenant == "team-a"
    assert principal.settings.requests_per_minute == 5
    assert "sk-a" not in principal.key_id
    principal.check_model("m1")
    with pytest.raises(PermissionDenied):
        principal.check_model("m2")


@pytest.mark.parametrize("header", [None, "", "Bearer", "Basic sk-a", "Bearer sk-b"])
async def test_bad_credentials(header: str | None) -> None:
    with pytest.raises(Unauthenticated):
        await _auth().authenticate(header)


async def test_open_gateway_without_keys() -> None:
    auth = Authenticator(GatewaySettings())
    assert auth.open
    assert (await auth.authenticate(None)).tenant == "default"


async def test_an_exposed_gateway_without_keys_is_closed_unless_allowed_open() -> None:
    # Started with an admin token (gateway.app.check_exposure lets it): closed until a key exists.
    exposed = Authenticator(GatewaySettings(http_host="0.0.0.0"))
    assert not exposed.open
    with pytest.raises(Unauthenticated):
        await exposed.authenticate(None)
    allowed = Authenticator(GatewaySettings(http_host="0.0.0.0", allow_open=True))
    assert allowed.open and (await allowed.authenticate(None)).tenant == "default"


ADMIN = "admin-token-for-tests"


def test_admin_api_is_disabled_without_an_admin_token() -> None:
    with pytest.raises(NotFound, match="LLMESH_GATEWAY_ADMIN_TOKEN"):
        authorize_admin(GatewaySettings(), f"Bearer {ADMIN}")


@pytest.mark.parametrize(
    "header", [None, "", f"Basic {ADMIN}", f"Bearer {ADMIN}x", f"Bearer {ADMIN[:-1]}", "Bearer sk-a"]
)
def test_admin_api_refuses_anything_but_the_admin_token(header: str | None) -> None:
    # An API key (sk-a is one) never authorizes the admin API.
    settings = GatewaySettings(admin_token=SecretStr(ADMIN), api_keys={hash_key("sk-a"): "team-a"})
    with pytest.raises(Unauthenticated):
        authorize_admin(settings, header)
    authorize_admin(settings, f"Bearer {ADMIN}")
    authorize_admin(settings, f"bearer  {ADMIN} ")


async def test_the_admin_token_is_not_an_api_key() -> None:
    settings = GatewaySettings(admin_token=SecretStr(ADMIN), api_keys={hash_key("sk-a"): "team-a"})
    with pytest.raises(Unauthenticated):
        await Authenticator(settings).authenticate(f"Bearer {ADMIN}")


def test_keys_must_be_hashed() -> None:
    with pytest.raises(ValueError):
        Authenticator(GatewaySettings(api_keys={"sk-plain": "t"}))


def _principal() -> Principal:
    return Principal("team-a", TenantSettings(), "k")


def test_headers_to_context_and_back() -> None:
    ctx = context_from_headers(
        {
            "cache-control": "max-age=30, no-store",
            "x-cache-version": "session:s1=4,7",
            "x-semantic-cache": "on",
            "x-request-id": "abc-1",
        },
        _principal(),
        60,
    )
    assert ctx.tenant == "team-a"
    assert ctx.request_id == "abc-1"
    assert ctx.max_age_ms == 30_000 and ctx.no_store and ctx.semantic
    assert ctx.floor_for("session:s1") == 7 and ctx.floor_for("other") == 7
    ctx.observe("session:s1", 9)
    ctx.set_cache_status("HIT", 4500)
    out = response_headers(ctx)
    assert out["x-cache-version"] == "7,session:s1=9"
    assert out["x-cache-status"] == "HIT"
    assert out["age"] == "4"


def test_no_cache_means_max_age_zero() -> None:
    ctx = context_from_headers({"cache-control": "no-cache"}, _principal(), 60)
    assert ctx.max_age_ms == 0


@pytest.mark.parametrize(
    "headers",
    [
        {"cache-control": "max-age=ten"},
        {"cache-control": "private"},
        {"x-cache-version": "=5"},
        {"x-cache-version": "abc"},
        {"x-semantic-cache": "maybe"},
    ],
)
def test_malformed_headers(headers: dict[str, str]) -> None:
    with pytest.raises(InvalidArgument):
        context_from_headers(headers, _principal(), 60)


def test_invalid_request_id_is_replaced() -> None:
    ctx = context_from_headers({"x-request-id": "bad id with spaces"}, _principal(), 60)
    assert " " not in ctx.request_id
