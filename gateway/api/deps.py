"""What every route gets: the mesh, the authenticated caller and the request's context."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from gateway.api.context import activate_for
from gateway.auth import Principal
from gateway.mesh import Mesh
from services.runtime import context as rc
from services.runtime.errors import InvalidArgument


@dataclass(frozen=True)
class Call:
    mesh: Mesh
    principal: Principal
    ctx: rc.RequestContext


def mesh_of(request: Request) -> Mesh:
    mesh: Mesh = request.app.state.mesh
    return mesh


async def authenticated(request: Request) -> Call:
    """Authenticates and activates the request context (runs before the body is parsed)."""
    mesh = mesh_of(request)
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > mesh.settings.max_body_bytes:
        raise InvalidArgument(f"request body is larger than {mesh.settings.max_body_bytes} bytes")
    principal = mesh.auth.authenticate(request.headers.get("authorization"))
    ctx = activate_for(request, principal, mesh.settings.request_timeout_s)
    return Call(mesh, principal, ctx)
