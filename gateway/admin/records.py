"""What the admin store keeps: API key records, tenant records, and the change messages.

A key record holds the SHA-256 of the key, never the key: the key itself exists only in the
answer that created or rotated it. A tenant record holds :class:`~gateway.config.TenantSettings`
as pydantic serializes them, so a field added to the settings is stored and reloaded with no
change here (a stored record without it gets the field's default). Every record has a
``version``, raised by each write: a gateway applies a change only if it is newer than what it
holds, so a change message that arrives after a full reload cannot roll an entry back.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from gateway.config import TenantSettings
from services.runtime.errors import InvalidArgument
from services.runtime.limits import KEY_IDENTIFIER_CHARS, MAX_IDENTIFIER_CHARS

# Every key the admin API issues starts with this, so scanners and people can recognise one.
KEY_PREFIX = "sk-llmesh-"
# Records (active, expired and revoked) one tenant may hold; at the limit, creating a key first
# drops the tenant's oldest revoked or expired records.
MAX_KEYS_PER_TENANT = 100
# Tenants the store may hold.
MAX_TENANTS = 10_000
MAX_KEY_NAME_CHARS = 128
# Longest expiry a key may be given (ten years).
MAX_EXPIRY_S = 10 * 365 * 24 * 3600
# Bounds of a tenant's stored settings: each list, each string, each number, the whole record.
MAX_LIST_ITEMS = 256
MAX_TEXT_CHARS = 256
MAX_NUMBER = 2**53
MAX_SETTINGS_BYTES = 16 * 1024


def digest(key: str) -> str:
    """The SHA-256 (hex) a key is stored and looked up as."""
    return hashlib.sha256(key.encode()).hexdigest()


def new_secret() -> str:
    """A new API key: the prefix and 256 random bits."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def new_key_id() -> str:
    """The non-secret id of a key (names it in the admin API, the limits and the usage)."""
    return "key_" + secrets.token_hex(8)


def check_tenant_name(name: str) -> str:
    """``name`` if it may name a tenant: 1-128 of [A-Za-z0-9-_.] (no ':', it separates Redis
    key parts); InvalidArgument otherwise."""
    if not name or len(name) > MAX_IDENTIFIER_CHARS or not KEY_IDENTIFIER_CHARS.issuperset(name):
        raise InvalidArgument(
            f"tenant name must be 1-{MAX_IDENTIFIER_CHARS} characters of [A-Za-z0-9-_.], got {name[:40]!r}"
        )
    return name


def check_key_name(name: str) -> str:
    if len(name) > MAX_KEY_NAME_CHARS or not name.isprintable():
        raise InvalidArgument(f"key name must be at most {MAX_KEY_NAME_CHARS} printable characters")
    return name


def check_key_id(key_id: str) -> str:
    if not (key_id.startswith("key_") and len(key_id) <= 64 and KEY_IDENTIFIER_CHARS.issuperset(key_id)):
        raise InvalidArgument(f"not a key id: {key_id[:40]!r} (key ids look like key_0123456789abcdef)")
    return key_id


class KeyStatus(StrEnum):
    ACTIVE = "active"
    EXPIRED = "expired"
    REVOKED = "revoked"


class KeyRecord(BaseModel):
    """One API key as stored (no secret in it)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str
    tenant: str
    name: str = ""
    # SHA-256 (hex) of the key.
    digest: str
    # The key's last four characters, to tell keys apart in a list.
    hint: str = ""
    # Unix seconds.
    created_at: int
    expires_at: int | None = None
    revoked_at: int | None = None
    rotated_at: int | None = None
    version: int = 1

    def status(self, now: float | None = None) -> KeyStatus:
        if self.revoked_at is not None:
            return KeyStatus.REVOKED
        if self.expires_at is not None and (time.time() if now is None else now) >= self.expires_at:
            return KeyStatus.EXPIRED
        return KeyStatus.ACTIVE

    @property
    def redacted(self) -> str:
        return f"{KEY_PREFIX}...{self.hint}"


class TenantRecord(BaseModel):
    """One tenant as stored: its settings and when they changed."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str
    settings: TenantSettings
    created_at: int
    updated_at: int
    version: int = 1


def _check_value(field: str, value: Any) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        if not 0 <= value <= MAX_NUMBER:
            raise InvalidArgument(f"{field} must be between 0 and {MAX_NUMBER}")
    elif isinstance(value, str):
        if len(value) > MAX_TEXT_CHARS:
            raise InvalidArgument(f"{field} is longer than {MAX_TEXT_CHARS} characters")
    elif isinstance(value, list):
        if len(value) > MAX_LIST_ITEMS:
            raise InvalidArgument(f"{field} holds more than {MAX_LIST_ITEMS} items")
        for item in value:
            _check_value(field, item)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_value(f"{field}.{key}", item)


def tenant_settings(values: dict[str, Any]) -> TenantSettings:
    """Settings from an admin request: every field of :class:`TenantSettings` may be given,
    an unknown one is refused (a typo must not pass silently), and every value is bounded."""
    known = set(TenantSettings.model_fields)
    unknown = sorted(set(values) - known)
    if unknown:
        raise InvalidArgument(
            f"unknown tenant setting {unknown[0]!r}; the settings are: {', '.join(sorted(known))}"
        )
    try:
        settings = TenantSettings.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise InvalidArgument(f"{where}: {first.get('msg', 'invalid value')}") from None
    dumped = settings.model_dump(mode="json")
    for field, value in dumped.items():
        _check_value(field, value)
    if len(TenantSettings.model_validate(dumped).model_dump_json()) > MAX_SETTINGS_BYTES:
        raise InvalidArgument(f"tenant settings are larger than {MAX_SETTINGS_BYTES} bytes")
    return settings


# -- change messages (one channel, every gateway subscribed) ---------------------------------------


class Change(BaseModel):
    """What a write published: the entry as it now is (or the key record that was dropped)."""

    model_config = ConfigDict(extra="ignore")

    kind: Literal["key", "key_deleted", "tenant"]
    key: KeyRecord | None = None
    tenant: TenantRecord | None = None


def key_changed(record: KeyRecord) -> str:
    return Change(kind="key", key=record).model_dump_json()


def key_deleted(record: KeyRecord) -> str:
    return Change(kind="key_deleted", key=record).model_dump_json()


def tenant_changed(record: TenantRecord) -> str:
    return Change(kind="tenant", tenant=record).model_dump_json()


def now_s() -> int:
    return int(time.time())
