"""Domain exceptions shared by every llmesh service.

Service cores raise these (they import no gRPC); the server interceptor maps each
class to one status code through ``services.runtime.status.STATUS_BY_ERROR``, and
the gateway maps status codes to HTTP. A message must name the problem (the
field, the limit, the value) because it reaches the end user unchanged.
"""

from __future__ import annotations


class LlmeshError(Exception):
    """Base of every error a service reports to its caller on purpose."""

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        # Hint for RESOURCE_EXHAUSTED / UNAVAILABLE: when a retry may succeed.
        self.retry_after_s = retry_after_s


class InvalidArgument(LlmeshError):
    """The request itself is wrong: a bad field, value or metadata entry."""


class NotFound(LlmeshError):
    """A named thing (model, session, collection) does not exist for this tenant."""


class AlreadyExists(LlmeshError):
    """A create collided with an existing thing."""


class Aborted(LlmeshError):
    """A conditional write lost a race (optimistic concurrency): re-read and retry."""


class FailedPrecondition(LlmeshError):
    """The system is not in the state the request needs (e.g. a dimension mismatch)."""


class ResourceExhausted(LlmeshError):
    """A limit was hit: admission queue, rate limit, size quota."""


class Unavailable(LlmeshError):
    """A dependency is down or not ready; the same request may succeed later."""


class DeadlineExceeded(LlmeshError):
    """The request's deadline passed before the work finished."""


class PermissionDenied(LlmeshError):
    """The caller is known but may not do this (e.g. a model outside its tenant's list)."""


class Unauthenticated(LlmeshError):
    """The caller did not prove who it is (missing or unknown API key)."""
