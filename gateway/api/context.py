"""HTTP requests in, request contexts out; request contexts in, HTTP headers out.

``Cache-Control: max-age=S | no-cache | no-store``, ``X-Cache-Version`` and
``X-Semantic-Cache`` become the consistency fields of the
:class:`~services.runtime.context.RequestContext` that the runtime's client
interceptors then carry to every service. On the way out the context's observed
versions, cache status and age become ``X-Cache-Version``, ``X-Cache-Status`` and
``Age``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from fastapi import Request

from gateway.auth import Principal
from gateway.stages.policy import MODERATION_KEY, MODERATION_SKIPPED, moderation_skipped
from services.runtime import context as rc
from services.runtime.errors import InvalidArgument

MAX_AGE_LIMIT_S = 10 * 365 * 24 * 3600


def parse_cache_control(value: str, ctx: rc.RequestContext) -> None:
    """Applies the request directives of ``Cache-Control`` to ``ctx`` (InvalidArgument if malformed)."""
    for raw in value.split(","):
        directive = raw.strip().lower()
        if not directive:
            continue
        name, sep, arg = directive.partition("=")
        name = name.strip()
        arg = arg.strip().strip('"')
        if name == "no-cache" and not sep:
            ctx.max_age_ms = 0
        elif name == "no-store" and not sep:
            ctx.no_store = True
        elif name == "max-age":
            if not arg.isdigit() or not arg.isascii():
                raise InvalidArgument(
                    f"Cache-Control max-age must be a non-negative integer, got {arg[:20]!r}"
                )
            seconds = min(int(arg), MAX_AGE_LIMIT_S)
            ms = seconds * 1000
            ctx.max_age_ms = ms if ctx.max_age_ms is None else min(ctx.max_age_ms, ms)
        elif name in ("max-stale", "min-fresh", "no-transform", "only-if-cached", "stale-if-error"):
            continue  # valid HTTP directives llmesh does not act on
        else:
            raise InvalidArgument(f"unsupported Cache-Control directive {directive[:40]!r}")


def parse_semantic(value: str) -> bool:
    text = value.strip().lower()
    if text in ("on", "1", "true", "yes"):
        return True
    if text in ("off", "0", "false", "no", ""):
        return False
    raise InvalidArgument(f"X-Semantic-Cache must be 'on' or 'off', got {value[:20]!r}")


def context_from_headers(
    headers: Mapping[str, str], principal: Principal, timeout_s: float
) -> rc.RequestContext:
    request_id = headers.get("x-request-id") or ""
    try:
        request_id = rc._identifier("x-request-id", request_id) if request_id else rc.new_request_id()
    except InvalidArgument:
        request_id = rc.new_request_id()
    ctx = rc.new_context(
        request_id=request_id, tenant=principal.tenant, deadline=time.monotonic() + timeout_s
    )
    cache_control = headers.get("cache-control")
    if cache_control:
        parse_cache_control(cache_control, ctx)
    pragma = headers.get("pragma")
    if pragma and pragma.strip().lower() == "no-cache" and ctx.max_age_ms is None:
        ctx.max_age_ms = 0
    version = headers.get("x-cache-version")
    if version:
        ctx.floors = rc.parse_versions(version)
    semantic = headers.get("x-semantic-cache")
    if semantic:
        ctx.semantic = parse_semantic(semantic)
    traceparent = headers.get("traceparent")
    if traceparent and len(traceparent) <= 512:
        ctx.traceparent = traceparent
    return ctx


def response_headers(ctx: rc.RequestContext) -> dict[str, str]:
    headers = {"x-request-id": ctx.request_id}
    versions = rc.merged_versions(ctx.floors, ctx.observed)
    if versions:
        headers["x-cache-version"] = rc.format_versions(versions)
    if ctx.cache_status:
        headers["x-cache-status"] = ctx.cache_status
    if ctx.cache_status == "HIT" and ctx.age_ms is not None:
        headers["age"] = str(ctx.age_ms // 1000)
    if ctx.cache_status == "HIT" and ctx.cache_match:
        headers["x-cache-match"] = ctx.cache_match
    if moderation_skipped(ctx):
        headers[MODERATION_KEY] = MODERATION_SKIPPED
    return headers


def activate_for(request: Request, principal: Principal, timeout_s: float) -> rc.RequestContext:
    """Builds and activates the request's context (the request runs in its own task)."""
    ctx = context_from_headers(request.headers, principal, timeout_s)
    rc.activate(ctx)
    request.state.llmesh_ctx = ctx
    return ctx
