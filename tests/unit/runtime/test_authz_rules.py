"""The access table covers the RPCs tenants use to manage their own data: the gateway may call the
cache's ListSessions and Invalidate for a named tenant (nobody else, never without a tenant), and
the ChatService calls that front them are public (the gateway authenticates API keys itself)."""

from __future__ import annotations

import pytest

from services.runtime.authz import GATEWAY, RULES


@pytest.mark.parametrize("method", ["ListSessions", "Invalidate", "GetSession", "DeleteSession"])
def test_only_the_gateway_reaches_the_tenant_cache_rpcs_and_names_a_tenant(method: str) -> None:
    rule = RULES[f"/llmesh.v1.ContextCacheService/{method}"]
    assert rule.callers == frozenset({GATEWAY})
    assert rule.tenant and not rule.public and not rule.admin


@pytest.mark.parametrize("method", ["PurgeCache", "ListSessions", "GetSession", "DeleteSession"])
def test_the_chat_service_calls_are_public(method: str) -> None:
    assert RULES[f"/llmesh.v1.ChatService/{method}"].public


@pytest.mark.parametrize("method", ["ModerateStreams", "CheckInputs"])
def test_only_the_gateway_sends_checks_that_name_their_own_tenants(method: str) -> None:
    rule = RULES[f"/llmesh.v1.PolicyService/{method}"]
    assert rule.callers == frozenset({GATEWAY})
    assert not rule.tenant and not rule.public and not rule.admin
