"""The one table from domain exceptions to gRPC status codes (ARCHITECTURE.md, "Where to look")."""

from __future__ import annotations

import grpc

from services.runtime import errors

STATUS_BY_ERROR: dict[type[errors.LlmeshError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.Aborted: grpc.StatusCode.ABORTED,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
}

# Downstream codes passed on unchanged to our caller; anything else becomes INTERNAL.
PASSTHROUGH_CODES = frozenset(STATUS_BY_ERROR.values()) | {grpc.StatusCode.CANCELLED}

RETRY_AFTER = "retry-after"


def status_for(exc: BaseException, request_id: str) -> tuple[grpc.StatusCode, str, float | None]:
    """Code, caller-facing message and retry-after seconds for an exception raised by a handler.

    Unexpected exceptions become INTERNAL with a message that names only the
    request id, never the exception text or a stack trace.
    """
    if isinstance(exc, errors.LlmeshError):
        for cls in type(exc).__mro__:
            code = STATUS_BY_ERROR.get(cls)  # type: ignore[arg-type]
            if code is not None:
                return code, exc.message, exc.retry_after_s
    if isinstance(exc, grpc.aio.AioRpcError) and exc.code() in PASSTHROUGH_CODES:
        return exc.code(), exc.details() or exc.code().name.lower(), None
    if isinstance(exc, TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded", None
    return grpc.StatusCode.INTERNAL, f"internal error (request id {request_id})", None
