"""What every route gets: the gateway, the authenticated caller and the request's context."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from gateway.api.context import activate_for
from gateway.auth import Principal
from gateway.mesh import Gateway
from services.runtime import context as rc
from services.runtime.errors import InvalidArgument


@dataclass(frozen=True)
class Call:
    gateway: Gateway
    principal: Principal
    ctx: rc.RequestContext


def gateway_of(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


async def authenticated(request: Request) -> Call:
    """Authenticates and activates the request context (runs before the body is parsed)."""
    gateway = gateway_of(request)
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > gateway.settings.max_body_bytes:
        raise InvalidArgument(f"request body is larger than {gateway.settings.max_body_bytes} bytes")
    principal = gateway.auth.authenticate(request.headers.get("authorization"))
    ctx = activate_for(request, principal, gateway.settings.request_timeout_s)
    return Call(gateway, principal, ctx)
