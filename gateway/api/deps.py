"""What every route gets: the gateway, the authenticated caller and the request's context."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from gateway.api.context import activate_for
from gateway.api.guard import ADMIN_STATE, PRINCIPAL_STATE
from gateway.auth import Principal, authorize_admin
from gateway.mesh import Gateway
from services.runtime import context as rc


@dataclass(frozen=True)
class Call:
    gateway: Gateway
    principal: Principal
    ctx: rc.RequestContext


def gateway_of(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


async def authenticated(request: Request) -> Call:
    """The caller :class:`~gateway.api.guard.RequestGuard` authenticated (before the body was
    read), with the request context activated."""
    gateway = gateway_of(request)
    principal = request.scope.get("state", {}).get(PRINCIPAL_STATE)
    if not isinstance(principal, Principal):
        # Only an app built without the guard gets here; it must not serve unauthenticated.
        principal = await gateway.auth.authenticate(request.headers.get("authorization"))
    ctx = activate_for(request, principal, gateway.settings.request_timeout_s)
    return Call(gateway, principal, ctx)


async def admin(request: Request) -> Gateway:
    """The gateway, for a route of the admin API (``/v1/admin/...``): the guard checked the admin
    token before the body was read; a route elsewhere, or an app without the guard, checks it here."""
    gateway = gateway_of(request)
    if request.scope.get("state", {}).get(ADMIN_STATE) is not True:
        authorize_admin(gateway.settings, request.headers.get("authorization"))
    return gateway
