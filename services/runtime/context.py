"""The request context every hop of a request shares.

The server interceptor builds one :class:`RequestContext` from the incoming
metadata and puts it in a contextvar; service code reads it with :func:`current`.
Client interceptors copy it onto outgoing calls and merge the versions that come
back in trailing metadata into :attr:`RequestContext.observed`, which the server
interceptor returns to the caller when the call ends.

Metadata (ARCHITECTURE.md, "The consistency protocol"):

* ``x-llmesh-cache-version``: version floor(s). Either a bare integer (a floor for
  every namespace) or ``namespace=N`` entries, comma separated, or both. Characters
  of a namespace outside printable ASCII, and ``,=%``, are percent-encoded.
* ``x-llmesh-max-age``: oldest acceptable cache entry, in ms; ``0`` = do not serve
  from cache.
* ``x-llmesh-no-store``: ``1``/``true``: write nothing this request produces.
* ``x-llmesh-semantic``: ``on``: a semantic cache hit is acceptable.
"""

from __future__ import annotations

import contextvars
import time
import urllib.parse
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from services.runtime.cache_status import CacheStatus
from services.runtime.errors import InvalidArgument
from services.runtime.limits import IDENTIFIER_CHARS, KEY_IDENTIFIER_CHARS, MAX_IDENTIFIER_CHARS

REQUEST_ID = "x-request-id"
TENANT = "x-llmesh-tenant"
CACHE_VERSION = "x-llmesh-cache-version"
MAX_AGE = "x-llmesh-max-age"
NO_STORE = "x-llmesh-no-store"
SEMANTIC = "x-llmesh-semantic"
CACHE_STATUS = "x-llmesh-cache-status"
AGE = "x-llmesh-age"
# How a HIT matched: "exact", or "semantic; similarity=S; verifier=NAME; score=V".
CACHE_MATCH = "x-llmesh-cache-match"
RESPONSE_SHA256 = "x-llmesh-response-sha256"
TRACEPARENT = "traceparent"

DEFAULT_TENANT = "default"
# The tenant of an incoming call that named none (only requests that start here get the default).
NO_TENANT = ""
MAX_ID_LENGTH = MAX_IDENTIFIER_CHARS
MAX_VERSION_HEADER_LENGTH = 4096
MAX_VERSION = 2**63 - 1
CACHE_STATUSES = frozenset(CacheStatus)
_ID_CHARS = IDENTIFIER_CHARS
_TRUE = frozenset({"1", "true", "on", "yes"})
_FALSE = frozenset({"0", "false", "off", "no", ""})


@dataclass(slots=True)
class RequestContext:
    """What one request carries across every hop."""

    request_id: str
    tenant: str = DEFAULT_TENANT
    # Absolute deadline on the time.monotonic() clock, or None.
    deadline: float | None = None
    # W3C traceparent of the caller's span, passed on to the next hop.
    traceparent: str | None = None
    # Version floors: "" is the floor for every namespace.
    floors: dict[str, int] = field(default_factory=dict)
    max_age_ms: int | None = None
    no_store: bool = False
    semantic: bool = False
    # Highest versions this request observed or produced, per namespace.
    observed: dict[str, int] = field(default_factory=dict)
    cache_status: CacheStatus | None = None
    age_ms: int | None = None
    cache_match: str | None = None
    # Further trailing metadata a service returns (e.g. x-llmesh-response-sha256).
    extra_trailers: list[tuple[str, str]] = field(default_factory=list)

    def time_remaining(self) -> float | None:
        """Seconds until the deadline (never negative), or None without one."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.monotonic())

    def floor_for(self, namespace: str) -> int:
        """The lowest version the caller accepts for ``namespace``."""
        return max(self.floors.get("", 0), self.floors.get(namespace, 0))

    def observe(self, namespace: str, version: int) -> None:
        """Records a version this request saw or produced (kept as the max)."""
        if version > self.observed.get(namespace, 0):
            self.observed[namespace] = version

    def merge_observed(self, versions: Mapping[str, int]) -> None:
        for namespace, version in versions.items():
            self.observe(namespace, version)

    def set_cache_status(self, status: CacheStatus | str, age_ms: int | None = None) -> None:
        """Records how the cache served this request (a plain string must name a member)."""
        try:
            self.cache_status = CacheStatus(status)
        except ValueError:
            raise ValueError(f"unknown cache status {status!r}") from None
        self.age_ms = age_ms

    def add_trailer(self, key: str, value: str) -> None:
        """Returns ``key: value`` to the caller in the trailing metadata of this call."""
        if not key.islower() or not key.isascii() or key.endswith("-bin"):
            raise ValueError(f"trailer key must be lowercase ASCII text metadata, got {key!r}")
        if not value.isascii() or not value.isprintable():
            raise ValueError(f"trailer {key!r} must be printable ASCII")
        self.extra_trailers.append((key, value))

    def set_trailer(self, key: str, value: str) -> None:
        """As :meth:`add_trailer`, replacing an earlier value of ``key`` (a count, a state)."""
        kept = [(k, v) for k, v in self.extra_trailers if k != key]
        self.add_trailer(key, value)
        self.extra_trailers[:-1] = kept

    def trailer(self, key: str) -> str | None:
        """The value of ``key`` among the trailers set so far (the first one), or None."""
        return next((v for k, v in self.extra_trailers if k == key), None)

    def outgoing_metadata(self) -> list[tuple[str, str]]:
        """The metadata that carries this context to the next hop."""
        md = [(REQUEST_ID, self.request_id)]
        if self.tenant:
            md.append((TENANT, self.tenant))
        versions = merged_versions(self.floors, self.observed)
        if versions:
            md.append((CACHE_VERSION, format_versions(versions)))
        if self.max_age_ms is not None:
            md.append((MAX_AGE, str(self.max_age_ms)))
        if self.no_store:
            md.append((NO_STORE, "1"))
        if self.semantic:
            md.append((SEMANTIC, "on"))
        if self.traceparent:
            md.append((TRACEPARENT, self.traceparent))
        return md

    def trailing_metadata(self) -> list[tuple[str, str]]:
        """What goes back to the caller: versions (floors merged with observed), cache status, age."""
        md: list[tuple[str, str]] = []
        versions = merged_versions(self.floors, self.observed)
        if versions:
            md.append((CACHE_VERSION, format_versions(versions)))
        if self.cache_status is not None:
            md.append((CACHE_STATUS, self.cache_status))
        if self.age_ms is not None:
            md.append((AGE, str(self.age_ms)))
        if self.cache_match:
            md.append((CACHE_MATCH, self.cache_match))
        md.extend(self.extra_trailers)
        return md

    def absorb_trailers(self, metadata: Iterable[tuple[str, str | bytes]]) -> None:
        """Merges what a downstream call returned in its trailing metadata."""
        for key, value in metadata:
            if key == CACHE_VERSION and isinstance(value, str):
                try:
                    self.merge_observed(parse_versions(value))
                except InvalidArgument:
                    continue  # a broken downstream header must not fail our caller
            elif key == CACHE_STATUS and isinstance(value, str) and value in CACHE_STATUSES:
                self.cache_status = CacheStatus(value)
            elif key == AGE and isinstance(value, str) and value.isdigit():
                self.age_ms = int(value)


_current: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar(
    "llmesh_request_context", default=None
)


def current() -> RequestContext:
    """The context of the request being served; a fresh one outside any request."""
    ctx = _current.get()
    if ctx is None:
        ctx = new_context()
        _current.set(ctx)
    return ctx


def peek() -> RequestContext | None:
    """The context if one is set, without creating one."""
    return _current.get()


def activate(ctx: RequestContext) -> contextvars.Token[RequestContext | None]:
    """Makes ``ctx`` the current context; pass the token to :func:`deactivate`."""
    return _current.set(ctx)


def deactivate(token: contextvars.Token[RequestContext | None]) -> None:
    _current.reset(token)


def new_request_id() -> str:
    return uuid.uuid4().hex


def new_context(**fields: object) -> RequestContext:
    """A context for a request that starts here (the gateway, a CLI, a benchmark)."""
    request_id = fields.pop("request_id", None) or new_request_id()
    return RequestContext(request_id=str(request_id), **fields)  # type: ignore[arg-type]


def from_metadata(
    metadata: Iterable[tuple[str, str | bytes]] | None, time_remaining: float | None
) -> RequestContext:
    """Builds the context of an incoming call; bad entries raise InvalidArgument naming the key.

    Without ``x-llmesh-tenant`` the tenant is ``""`` (never :data:`DEFAULT_TENANT`): a method
    that needs one refuses the call (``services.runtime.authz``)."""
    ctx = RequestContext(request_id="", tenant=NO_TENANT)
    if time_remaining is not None:
        ctx.deadline = time.monotonic() + time_remaining
    for key, raw in metadata or ():
        if key.endswith("-bin") or isinstance(raw, bytes):
            continue
        value = raw
        if key == REQUEST_ID:
            ctx.request_id = _identifier(key, value)
        elif key == TENANT:
            ctx.tenant = _identifier(key, value, KEY_IDENTIFIER_CHARS)
        elif key == CACHE_VERSION:
            ctx.floors = parse_versions(value)
        elif key == MAX_AGE:
            ctx.max_age_ms = _non_negative_int(key, value)
        elif key == NO_STORE:
            ctx.no_store = _flag(key, value)
        elif key == SEMANTIC:
            ctx.semantic = _flag(key, value)
        elif key == TRACEPARENT:
            if len(value) > 512:
                raise InvalidArgument(f"metadata {TRACEPARENT!r} is longer than 512 characters")
            ctx.traceparent = value
    if not ctx.request_id:
        ctx.request_id = new_request_id()
    return ctx


def parse_versions(value: str) -> dict[str, int]:
    """Parses ``N`` / ``ns=N,ns2=M`` into a dict ("" for a bare floor)."""
    if len(value) > MAX_VERSION_HEADER_LENGTH:
        raise InvalidArgument(
            f"metadata {CACHE_VERSION!r} is longer than {MAX_VERSION_HEADER_LENGTH} characters"
        )
    versions: dict[str, int] = {}
    for item in value.split(","):
        entry = item.strip()
        if not entry:
            continue
        namespace, sep, number = entry.rpartition("=")
        if sep and not namespace:
            raise InvalidArgument(f"metadata {CACHE_VERSION!r} has an entry without a namespace: {entry!r}")
        version = _non_negative_int(CACHE_VERSION, number)
        namespace = _unquote(CACHE_VERSION, namespace)
        if version > versions.get(namespace, -1):
            versions[namespace] = version
    return versions


def format_versions(versions: Mapping[str, int]) -> str:
    return ",".join(str(v) if not ns else f"{_quote(ns)}={v}" for ns, v in sorted(versions.items()))


# A metadata value is printable ASCII; "," and "=" separate entries and "%" escapes.
_SAFE = frozenset(chr(c) for c in range(0x21, 0x7F)) - set(",=%")


def _quote(namespace: str) -> str:
    """Percent-encodes what cannot stand in a metadata value (any namespace round-trips)."""
    if _SAFE.issuperset(namespace):
        return namespace
    return "".join(c if c in _SAFE else "".join(f"%{b:02X}" for b in c.encode()) for c in namespace)


def _unquote(key: str, namespace: str) -> str:
    if "%" not in namespace:
        return namespace
    try:
        return urllib.parse.unquote(namespace, errors="strict")
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"metadata {key!r} has a badly escaped namespace") from exc


def merged_versions(*parts: Mapping[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in parts:
        for namespace, version in part.items():
            if version > out.get(namespace, -1):
                out[namespace] = version
    return out


def _non_negative_int(key: str, value: str) -> int:
    text = value.strip()
    if not text.isdigit() or not text.isascii():
        raise InvalidArgument(f"metadata {key!r} must be a non-negative integer, got {value[:40]!r}")
    number = int(text)
    if number > MAX_VERSION:
        raise InvalidArgument(f"metadata {key!r} is out of range (max {MAX_VERSION})")
    return number


def _flag(key: str, value: str) -> bool:
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise InvalidArgument(f"metadata {key!r} must be one of on/off/1/0/true/false, got {value[:40]!r}")


def tenant_name(value: str) -> str:
    """``value`` as a tenant name (the rules of ``x-llmesh-tenant``); InvalidArgument otherwise."""
    return _identifier(TENANT, value, KEY_IDENTIFIER_CHARS)


def request_id_value(value: str) -> str:
    """``value`` as a request id (the rules of ``x-llmesh-request-id``; empty: a new one)."""
    return _identifier(REQUEST_ID, value) if value else new_request_id()


def _identifier(key: str, value: str, chars: frozenset[str] = _ID_CHARS) -> str:
    if len(value) > MAX_ID_LENGTH:
        raise InvalidArgument(f"metadata {key!r} is longer than {MAX_ID_LENGTH} characters")
    if not value or not chars.issuperset(value):
        # A tenant goes into Redis keys, where ':' separates it from the namespace.
        allowed = "[A-Za-z0-9-_.:]" if ":" in chars else "[A-Za-z0-9-_.] (no ':')"
        raise InvalidArgument(f"metadata {key!r} must be 1-{MAX_ID_LENGTH} characters of {allowed}")
    return value
