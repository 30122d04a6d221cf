"""Settings of the policy service (env ``LLMESH_POLICY_*``)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from services.runtime.settings import ServiceSettings, redis_url

DEFAULT_RULESET = Path(__file__).parent / "rulesets" / "default.yaml"


class PolicySettings(ServiceSettings):
    """Where the policy service listens, its ruleset file, its Redis and its limits."""

    model_config = SettingsConfigDict(env_prefix="LLMESH_POLICY_", extra="ignore")
    service_name: ClassVar[str] = "policy"

    port: int = 50052
    redis_url: str = Field(default_factory=redis_url)
    redis_connect_timeout_s: float = 0.5
    redis_timeout_s: float = 1.0
    # The ruleset file; it is watched and reloaded when it changes.
    ruleset_path: Path = DEFAULT_RULESET
    # How often the file's mtime/size are compared (a stat call, no reading).
    watch_interval_s: float = 2.0
    # ReloadRules needs an admin credential (LLMESH_POLICY_ADMIN_TOKEN, or the "admin" certificate
    # over mTLS: services.runtime.authz). Non-empty: a reload must also name one of these tenants
    # in x-llmesh-tenant. A tenant alone never authorises a reload.
    admin_tenants: list[str] = Field(default_factory=list)
    # A request whose texts are longer than this (characters, all messages and documents) is rejected.
    max_text_chars: int = 1_000_000
    # Answers open at once on one ModerateStreams call (the gateway's multiplexed moderation).
    max_streams_per_call: int = Field(default=10_000, ge=1)
    # Checks in one CheckInputs call (the gateway's batched input checks).
    max_checks_per_call: int = Field(default=256, ge=1)
    # Audit: Redis key prefix (hash-tagged), records kept in memory while Redis is down.
    audit_key: str = "llmesh:audit:{audit}"
    audit_buffer_limit: int = 10_000
    # The secret the audit chain is HMAC'd with, kept out of Redis (policy/audit_key.py): the key
    # itself, or a file holding it. Unset: loopback-only generates one in the data directory;
    # any other host refuses to start.
    audit_hmac_key: SecretStr = SecretStr("")
    audit_hmac_key_file: str = ""
    # Where a ruleset loaded through ReloadRules is shared with the other replicas.
    shared_ruleset_key: str = "llmesh:policy:ruleset"
    # After Redis failed, how long version reads are skipped before the next try.
    redis_retry_s: float = 2.0
    # Detector matches of texts checked before (policy/memo.py): a re-sent conversation is not
    # scanned again. Bytes kept in all (per tenant keys; 0 = off).
    scan_memo_bytes: int = Field(default=32 * 1024 * 1024, ge=0)
