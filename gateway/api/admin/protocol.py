"""Wire models of the admin API (``/v1/admin/...``): keys, tenants, ruleset reloads."""

from __future__ import annotations

from typing import Any, Literal

from llmesh.v1 import policy_pb2
from pydantic import BaseModel, ConfigDict, Field

from gateway.admin.records import MAX_EXPIRY_S, MAX_KEY_NAME_CHARS, KeyRecord, TenantRecord
from gateway.config import TenantSettings
from services.runtime.limits import MAX_IDENTIFIER_CHARS

# The largest ruleset YAML the reload endpoint forwards (the policy service bounds its rules).
MAX_RULESET_CHARS = 1024 * 1024


class AdminModel(BaseModel):
    # An admin request with a field the API does not know is refused: a typo must not pass.
    model_config = ConfigDict(extra="forbid")


class KeyCreateRequest(AdminModel):
    """``POST /v1/admin/keys``."""

    tenant: str = Field(min_length=1, max_length=MAX_IDENTIFIER_CHARS)
    name: str = Field(default="", max_length=MAX_KEY_NAME_CHARS)
    # Seconds until the key expires; none = never.
    expires_in: int | None = Field(default=None, ge=1, le=MAX_EXPIRY_S)


class ApiKey(BaseModel):
    """An API key as the admin API shows it: never the key, except once (:class:`NewApiKey`)."""

    object: Literal["api_key"] = "api_key"
    id: str
    tenant: str
    name: str
    redacted_value: str
    status: Literal["active", "expired", "revoked"]
    created_at: int
    expires_at: int | None
    revoked_at: int | None
    rotated_at: int | None

    @classmethod
    def from_record(cls, record: KeyRecord) -> ApiKey:
        return cls(
            id=record.id,
            tenant=record.tenant,
            name=record.name,
            redacted_value=record.redacted,
            status=record.status().value,
            created_at=record.created_at,
            expires_at=record.expires_at,
            revoked_at=record.revoked_at,
            rotated_at=record.rotated_at,
        )


class NewApiKey(ApiKey):
    """A key just created or rotated, with the key itself: shown this once, stored nowhere."""

    key: str

    @classmethod
    def with_secret(cls, record: KeyRecord, secret: str) -> NewApiKey:
        return cls(**ApiKey.from_record(record).model_dump(), key=secret)


class ApiKeyList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ApiKey]


class Tenant(BaseModel):
    """A tenant and its settings; ``source`` says where they come from: the admin store, or the
    gateway's configuration (LLMESH_GATEWAY_TENANTS) for a tenant never written here."""

    object: Literal["tenant"] = "tenant"
    name: str
    source: Literal["admin", "configuration"]
    settings: dict[str, Any]
    created_at: int | None = None
    updated_at: int | None = None

    @classmethod
    def from_record(cls, record: TenantRecord) -> Tenant:
        return cls(
            name=record.name,
            source="admin",
            settings=record.settings.model_dump(mode="json"),
            created_at=record.created_at,
            updated_at=record.updated_at,
        )

    @classmethod
    def configured(cls, name: str, settings: TenantSettings) -> Tenant:
        return cls(name=name, source="configuration", settings=settings.model_dump(mode="json"))


class TenantList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Tenant]


class RulesetReloadRequest(AdminModel):
    """``POST /v1/admin/rulesets/reload``: the ruleset YAML, or none to reload the policy
    service's configured file."""

    yaml: str = Field(default="", max_length=MAX_RULESET_CHARS)

    def to_pb(self) -> policy_pb2.ReloadRulesRequest:
        return policy_pb2.ReloadRulesRequest(yaml=self.yaml)


class RulesetReloadResponse(BaseModel):
    object: Literal["ruleset"] = "ruleset"
    version: str
    rule_count: int
    policy_version: int

    @classmethod
    def from_pb(cls, reply: policy_pb2.ReloadRulesResponse) -> RulesetReloadResponse:
        return cls(version=reply.version, rule_count=reply.rule_count, policy_version=reply.policy_version)
