"""API keys to tenants.

Keys are never stored in clear: the configuration holds ``sha256:<hex>`` of each
key, and a presented key is hashed and looked up in constant time per entry.
``python -m gateway.auth KEY`` prints the hash to put into the configuration.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.config import GatewaySettings, TenantSettings
from services.runtime.context import DEFAULT_TENANT
from services.runtime.errors import PermissionDenied, Unauthenticated

_PREFIX = "sha256:"


def hash_key(key: str) -> str:
    """The form a key takes in the configuration."""
    return _PREFIX + hashlib.sha256(key.encode()).hexdigest()


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


class Authenticator:
    """Resolves ``Authorization: Bearer <key>`` to a :class:`Principal`."""

    def __init__(self, settings: GatewaySettings) -> None:
        self._settings = settings
        keys: dict[str, str] = {}
        for hashed, tenant in settings.api_keys.items():
            if not hashed.startswith(_PREFIX) or len(hashed) != len(_PREFIX) + 64:
                raise ValueError(f"api_keys entries must look like sha256:<64 hex>, got {hashed[:16]!r}...")
            keys[hashed[len(_PREFIX) :].lower()] = tenant
        self._keys: Mapping[str, str] = keys

    @property
    def open(self) -> bool:
        """True when no key is configured: everyone is the default tenant."""
        return not self._keys

    def authenticate(self, authorization: str | None) -> Principal:
        if self.open:
            return Principal(DEFAULT_TENANT, self._settings.tenant(DEFAULT_TENANT), "anonymous")
        if not authorization:
            raise Unauthenticated("missing API key: send 'Authorization: Bearer <key>'")
        scheme, _, key = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise Unauthenticated("malformed Authorization header: expected 'Bearer <key>'")
        digest = hashlib.sha256(key.strip().encode()).hexdigest()
        # A dict lookup on the digest leaks nothing about the key (timing reveals only the hash).
        tenant = self._keys.get(digest)
        if tenant is None:
            raise Unauthenticated("invalid API key")
        return Principal(tenant, self._settings.tenant(tenant), digest[:16])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m gateway.auth API_KEY   (prints the value for LLMESH_GATEWAY_API_KEYS)")
        return 2
    print(hash_key(args[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
