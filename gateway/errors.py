"""Errors of the gateway and the one map from gRPC status codes to HTTP.

Every failure, whether raised here (a domain exception) or returned by an
upstream service (an ``AioRpcError``), becomes one status code through
``services.runtime.status.status_for``; this module maps that code to the HTTP
status and OpenAI's error body ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

import grpc

from services.runtime.errors import InvalidArgument, ResourceExhausted
from services.runtime.status import RETRY_AFTER, status_for


class PolicyBlocked(InvalidArgument):
    """The policy service blocked the input (or output): data, reported as a 400 with the rule ids."""

    def __init__(self, rule_ids: Sequence[str], message: str = "") -> None:
        ids = ", ".join(rule_ids) or "unknown"
        super().__init__(message or f"the request was blocked by the content policy (rules: {ids})")
        self.rule_ids = list(rule_ids)


class BudgetExceeded(ResourceExhausted):
    """The tenant spent its token budget of the period: 429 ``budget_exceeded`` until it ends."""

    def __init__(
        self, period: str, budget: int, spent: int, resets_at: datetime, retry_after_s: float
    ) -> None:
        when = resets_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        super().__init__(
            f"the tenant's token budget per {period} ({budget} tokens) is spent ({spent} used); "
            f"it resets at {when}",
            retry_after_s=max(1.0, retry_after_s),
        )
        self.period = period
        self.resets_at = resets_at


# code -> (HTTP status, OpenAI error type, OpenAI error code)
HTTP_BY_CODE: dict[grpc.StatusCode, tuple[int, str, str | None]] = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error", None),
    grpc.StatusCode.FAILED_PRECONDITION: (400, "invalid_request_error", None),
    grpc.StatusCode.OUT_OF_RANGE: (400, "invalid_request_error", None),
    grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error", "invalid_api_key"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error", "model_not_allowed"),
    grpc.StatusCode.NOT_FOUND: (404, "not_found_error", None),
    grpc.StatusCode.ALREADY_EXISTS: (409, "conflict_error", None),
    grpc.StatusCode.ABORTED: (409, "conflict_error", None),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error", "rate_limit_exceeded"),
    grpc.StatusCode.CANCELLED: (499, "cancelled", None),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable", "service_unavailable"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout", "deadline_exceeded"),
    grpc.StatusCode.UNIMPLEMENTED: (501, "not_implemented", None),
}
_INTERNAL = (500, "server_error", None)


@dataclass(frozen=True)
class HttpError:
    """An error ready for the HTTP layer."""

    status: int
    body: dict[str, object]
    headers: dict[str, str] = field(default_factory=dict)
    code: grpc.StatusCode = grpc.StatusCode.INTERNAL


def openai_body(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> dict[str, object]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _retry_after(exc: BaseException, hint: float | None) -> float | None:
    if hint is not None:
        return hint
    if isinstance(exc, grpc.aio.AioRpcError):
        for key, value in exc.trailing_metadata() or ():
            if key == RETRY_AFTER and isinstance(value, str):
                try:
                    return float(value)
                except ValueError:
                    return None
    return None


def grpc_status(exc: BaseException, request_id: str) -> tuple[grpc.StatusCode, str, float | None]:
    """The gRPC status of any exception (domain, upstream or unexpected), with retry-after."""
    code, message, hint = status_for(exc, request_id)
    return code, message, _retry_after(exc, hint)


def to_http(exc: BaseException, request_id: str) -> HttpError:
    code, message, retry_after = grpc_status(exc, request_id)
    status, type_, err_code = HTTP_BY_CODE.get(code, _INTERNAL)
    param = None
    if isinstance(exc, PolicyBlocked):
        err_code, param = "content_policy_violation", ",".join(exc.rule_ids)
    elif isinstance(exc, BudgetExceeded):
        type_, err_code = "insufficient_quota", "budget_exceeded"
    elif code is grpc.StatusCode.NOT_FOUND and "model" in message:
        err_code = "model_not_found"
    elif code is grpc.StatusCode.PERMISSION_DENIED and "model" not in message:
        err_code = None
    headers = {"x-request-id": request_id}
    if retry_after is not None or code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED):
        # Retry-After is whole seconds on the wire; never 0 for a shed request.
        headers["retry-after"] = str(max(1, round(retry_after or 1)))
    return HttpError(status, openai_body(message, type_, param, err_code), headers, code)
