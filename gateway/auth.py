"""API keys to tenants, and the admin credential.

Keys are never stored in clear. Two places hold them:

* the configuration (``LLMESH_GATEWAY_API_KEYS``): ``sha256:<hex>`` of each key mapped to its
  tenant, for bootstrapping; ``python -m gateway.auth KEY`` prints the hash to put there;
* the admin store in Redis (:mod:`gateway.admin`), managed through the admin API: each gateway
  keeps a live snapshot of it (:class:`~gateway.admin.directory.Directory`), so a key created,
  rotated or revoked on one gateway takes effect on every gateway at once, with no restart.

A presented key is hashed and looked up: the configuration first, then the snapshot (a dict
lookup: no Redis round trip on the common path). A key the snapshot does not know is looked up
in Redis (it may have been created a moment ago), and while the snapshot cannot be trusted (its
subscription is down) every stored key is. An expired key is refused with "API key expired", a
revoked one with "API key revoked". A tenant's settings come from the store, else the
configuration's ``tenants``, else ``default_tenant``.

Open mode (every request is the ``default`` tenant, no key needed) holds only while no key
exists at all: none configured and no record in the store, whether active, expired or revoked
(revoking the last key never opens a gateway), and only on a gateway that may run open: on
loopback, or with ``LLMESH_GATEWAY_ALLOW_OPEN``. The first key created through the admin API
therefore closes every open gateway of the mesh at once. When the store cannot be read and no
key is configured, requests are refused (503) rather than served open.

The admin API (``/v1/admin/...``) takes only the gateway's admin token
(``LLMESH_GATEWAY_ADMIN_TOKEN``), compared in constant time (:func:`authorize_admin`): an API
key never authorizes it, and the admin token is never an API key.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from redis.exceptions import RedisError

from gateway.admin.directory import Directory
from gateway.admin.records import KeyRecord, KeyStatus
from gateway.admin.records import digest as key_digest
from gateway.config import GatewaySettings, TenantSettings
from services.runtime.context import DEFAULT_TENANT
from services.runtime.errors import NotFound, PermissionDenied, Unauthenticated, Unavailable
from services.runtime.settings import is_loopback

log = logging.getLogger(__name__)

_PREFIX = "sha256:"
ADMIN_TOKEN_SETTING = "LLMESH_GATEWAY_ADMIN_TOKEN"
# Seconds a client is told to wait when the key store cannot be read.
STORE_RETRY_AFTER_S = 1.0


def hash_key(key: str) -> str:
    """The form a key takes in the configuration."""
    return _PREFIX + key_digest(key)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the tenant, its settings and a non-secret id of the key (for limits)."""

    tenant: str
    settings: TenantSettings
    key_id: str

    def check_model(self, model: str) -> None:
        """PermissionDenied unless the tenant may use ``model``."""
        if self.settings.models and model not in self.settings.models:
            raise PermissionDenied(f"the model {model!r} is not enabled for this API key")


def _bearer(authorization: str | None, what: str) -> str:
    if not authorization:
        raise Unauthenticated(f"missing {what}: send 'Authorization: Bearer <{what}>'")
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise Unauthenticated(f"malformed Authorization header: expected 'Bearer <{what}>'")
    return value.strip()


def authorize_admin(settings: GatewaySettings, authorization: str | None) -> None:
    """Passes when ``authorization`` carries the gateway's admin token; NotFound (the admin API
    is disabled) without one configured, Unauthenticated for any other credential."""
    token = settings.admin_token.get_secret_value()
    if not token:
        raise NotFound(f"the admin API is disabled: set {ADMIN_TOKEN_SETTING} on the gateway to enable it")
    sent = _bearer(authorization, "admin token")
    if not hmac.compare_digest(sent.encode(), token.encode()):
        raise Unauthenticated(
            f"invalid admin token (the admin API takes {ADMIN_TOKEN_SETTING}, not an API key)"
        )


def may_run_open(settings: GatewaySettings) -> bool:
    """Whether the gateway may serve without keys: on loopback only, unless allowed."""
    return settings.allow_open or (is_loopback(settings.host) and is_loopback(settings.http_host))


class Authenticator:
    """Resolves ``Authorization: Bearer <key>`` to a :class:`Principal` (see the module doc)."""

    def __init__(self, settings: GatewaySettings, directory: Directory | None = None) -> None:
        self._settings = settings
        self._directory = directory
        keys: dict[str, str] = {}
        for hashed, tenant in settings.api_keys.items():
            if not hashed.startswith(_PREFIX) or len(hashed) != len(_PREFIX) + 64:
                raise ValueError(f"api_keys entries must look like sha256:<64 hex>, got {hashed[:16]!r}...")
            keys[hashed[len(_PREFIX) :].lower()] = tenant
        self._keys: Mapping[str, str] = keys
        self._may_run_open = may_run_open(settings)

    @classmethod
    async def start(cls, settings: GatewaySettings) -> Authenticator:
        """With the admin store of ``settings.redis_url`` loaded and subscribed (or, Redis down,
        still trying: meanwhile stored keys are looked up per request)."""
        directory = Directory(settings.redis_url)
        await directory.start()
        if not directory.fresh:
            log.warning(
                "the admin store (Redis) is not reachable yet: stored API keys are looked up per request"
            )
        return cls(settings, directory)

    async def close(self) -> None:
        if self._directory is not None:
            await self._directory.close()

    @property
    def directory(self) -> Directory | None:
        """The admin store and its live snapshot (None: configured keys only)."""
        return self._directory

    @property
    def has_keys(self) -> bool:
        """Whether any key is known (configured, or in the snapshot of the store)."""
        return bool(self._keys) or (self._directory is not None and self._directory.has_keys)

    @property
    def open(self) -> bool:
        """True when no key exists at all and the gateway may run open: everyone is the
        default tenant (as far as the snapshot knows; see :meth:`authenticate`)."""
        if self._keys or not self._may_run_open:
            return False
        directory = self._directory
        return directory is None or (directory.fresh and not directory.has_keys)

    async def _is_open(self) -> bool:
        if self._keys or not self._may_run_open:
            return False
        directory = self._directory
        if directory is None:
            return True
        if directory.fresh:
            return not directory.has_keys
        try:
            return not await directory.keys.any()
        except (RedisError, OSError) as exc:
            raise self._store_down(exc) from None

    @staticmethod
    def _store_down(exc: BaseException) -> Unavailable:
        log.warning("API key lookup failed: the admin store is unreachable (%s)", exc)
        return Unavailable(
            "the API key store is unreachable; retry shortly", retry_after_s=STORE_RETRY_AFTER_S
        )

    async def tenant_settings(self, tenant: str) -> TenantSettings:
        """The tenant's settings: the store's, else the configuration's, else the default."""
        directory = self._directory
        if directory is not None:
            stored = directory.cached_tenant(tenant)
            if not directory.fresh:
                # Redis away: the last settings seen are the best guess.
                with contextlib.suppress(RedisError, OSError):
                    stored = await directory.lookup_tenant(tenant)
            if stored is not None:
                return stored
        return self._settings.tenant(tenant)

    async def authenticate(self, authorization: str | None) -> Principal:
        """The caller's principal; Unauthenticated (401) for a missing, unknown, expired or
        revoked key, Unavailable (503) when a key can be checked only in an unreachable store."""
        if await self._is_open():
            return Principal(DEFAULT_TENANT, await self.tenant_settings(DEFAULT_TENANT), "anonymous")
        hex_digest = key_digest(_bearer(authorization, "API key"))
        # A dict lookup on the digest leaks nothing about the key (timing reveals only the hash).
        tenant = self._keys.get(hex_digest)
        if tenant is not None:
            return Principal(tenant, await self.tenant_settings(tenant), hex_digest[:16])
        record = await self._stored(hex_digest)
        if record is None:
            raise Unauthenticated("invalid API key")
        status = record.status()
        if status is KeyStatus.EXPIRED:
            raise Unauthenticated("API key expired")
        if status is KeyStatus.REVOKED:
            raise Unauthenticated("API key revoked")
        return Principal(record.tenant, await self.tenant_settings(record.tenant), record.id)

    async def _stored(self, hex_digest: str) -> KeyRecord | None:
        directory = self._directory
        if directory is None:
            return None
        if directory.fresh:
            cached = directory.cached_key(hex_digest)
            if cached is not None:
                return cached
        # Not in a trusted snapshot: created a moment ago (its message still on the way), or
        # the snapshot is stale (subscription down), or no such key. Redis decides.
        try:
            return await directory.lookup(hex_digest)
        except (RedisError, OSError) as exc:
            raise self._store_down(exc) from None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m gateway.auth API_KEY   (prints the value for LLMESH_GATEWAY_API_KEYS)")
        return 2
    print(hash_key(args[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
