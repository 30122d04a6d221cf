"""Settings of the gateway (env ``LLMESH_GATEWAY_*``, YAML section ``gateway``).

Upstream addresses use the names ``llmesh up`` sets; policy, cache and embeddings
each take one address, a comma-separated list of instances or ``dns:///name:port``
(``services.runtime.channels``). API keys are stored hashed
(``sha256:<hex>`` of the key) and map to tenants; each tenant has its own
settings (allowed models, policy fail mode, RAG collections, rate limits).
Without any key (configured, or created through the admin API: gateway/auth.py)
the gateway runs open, every request as the ``default`` tenant (a one-machine
development mesh), and therefore refuses to start on an address other than
loopback unless ``allow_open`` is set (``gateway.app.check_exposure``); once a
key exists, every request needs one.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from gateway.resilience import ResilienceSettings
from gateway.vector_stores.settings import VectorStoreSettings
from services.runtime.channels import validate_address
from services.runtime.settings import ServiceSettings, redis_url


class TenantSettings(BaseModel):
    """What one tenant may do and how its requests are treated."""

    # Models the tenant may use; empty = every served model.
    models: list[str] = Field(default_factory=list)
    # Serve without input/output moderation when the policy service is down.
    policy_fail_open: bool = False
    # RAG collections searched on every request of the tenant (a request may name its own).
    rag_collections: list[str] = Field(default_factory=list)
    rag_top_k: int = 4
    # 0 = unlimited.
    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    # Requests of this tenant in flight at once; 0 = the gateway's tenant share of max_inflight.
    max_inflight: int = Field(default=0, ge=0)
    # Tokens (prompt + completion) the tenant may spend per UTC day / calendar month (UTC);
    # once spent, requests get 429 budget_exceeded until the period ends. 0 = no budget.
    token_budget_per_day: int = Field(default=0, ge=0)
    token_budget_per_month: int = Field(default=0, ge=0)


def _split(value: object) -> object:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class GatewaySettings(ServiceSettings, ResilienceSettings, VectorStoreSettings):
    """Where the gateway listens, where its upstreams are, and its tenants."""

    model_config = SettingsConfigDict(env_prefix="LLMESH_GATEWAY_", extra="ignore")
    service_name: ClassVar[str] = "gateway"

    # gRPC ChatService port; the HTTP API listens on http_host:http_port.
    port: int = 50050
    http_host: str = "127.0.0.1"
    http_port: int = 8000

    # Upstreams; an empty address turns that stage off (inference is required).
    inference_addresses: Annotated[list[str], NoDecode] = Field(default_factory=list)
    inference_address: str = ""
    policy_address: str = ""
    # Streamed answers' moderation over a few shared ModerateStreams calls, deltas that arrive
    # together in one message (gateway/stages/moderation_mux.py); false: one call per answer.
    policy_mux: bool = True
    # A shared call takes new answers for this long, then a new one starts (new policy replicas).
    policy_mux_lane_s: float = Field(default=30.0, gt=0)
    # How long the first queued delta waits for the other open answers' (0: no wait); no wait
    # once every open answer has one queued or in flight.
    policy_mux_window_ms: float = Field(default=5.0, ge=0, le=100)
    # Input checks of requests that arrive while earlier checks are out travel in one
    # CheckInputs call (gateway/stages/input_batch.py); false: one CheckInput call per request.
    policy_batch_inputs: bool = True
    # Input-check calls out at once (a check alone goes at once while fewer are out); with
    # several policy replicas, more lets the gateway's checks reach more of them at a time.
    policy_input_calls: int = Field(default=2, ge=1, le=64)
    # Checks in one CheckInputs call at most: the policy's LLMESH_POLICY_MAX_CHECKS_PER_CALL or
    # fewer (a call refused for its size goes again in halves, and the gateway keeps the lower figure).
    policy_max_checks_per_call: int = Field(default=256, ge=1, le=4096)
    # Streamed answers over one shared GenerateStreams call per inference replica, the tokens of
    # one decode step in one message (gateway/inference_mux.py); false: one call per answer.
    inference_mux: bool = True
    # A shared call takes new streams for this long, then a new one starts.
    inference_mux_lane_s: float = Field(default=30.0, gt=0)
    # A stream with nothing but the cache lookup before its generation (no session, no retrieval;
    # with a policy service, once the input check passed) starts generating beside the lookup,
    # while recent lookups mostly missed: kept on a miss, cancelled on a hit (gateway/speculation.py).
    speculative_generation: bool = True
    # With a policy service: engine steps per streamed message once an answer's first word is
    # out (GenerateStreamRequest.stream_interval; the first word still comes step by step, so
    # its release is not delayed). Fewer messages, moderation exchanges and SSE writes per token
    # on every hop; a later word reaches the client up to N - 1 steps later. 1: every step.
    moderated_stream_interval: int = Field(default=2, ge=1, le=256)
    # With a policy service: a speculative generation starts beside the input check instead of
    # after it, on the input as sent (the engine sees input the check may still block or redact;
    # nothing generated is read before the check passed it unchanged). Off: no engine sees
    # unchecked input. Saves the check's round trip before the first token.
    generate_before_input_check: bool = False
    # With a policy service: an answer's first word goes out on the step the service offered for
    # the character after it, as soon as that character arrives (CheckOutputStreamResponse.ahead),
    # not after the service's answer for it. False: every release waits for its answer.
    moderation_ahead: bool = True
    cache_address: str = ""
    embeddings_address: str = ""
    redis_url: str = Field(default_factory=redis_url)

    # sha256:<hex of sha256(key)> -> tenant name (bootstrap keys; more through the admin API,
    # stored in Redis: gateway/auth.py). The admin API (/v1/admin/...) is on when admin_token
    # (LLMESH_GATEWAY_ADMIN_TOKEN) is set.
    api_keys: dict[str, str] = Field(default_factory=dict)
    # The policy service's admin token (its LLMESH_POLICY_ADMIN_TOKEN), which the gateway sends
    # to ReloadRules for POST /v1/admin/rulesets/reload.
    policy_admin_token: SecretStr = SecretStr("")
    # Without API keys the gateway starts only on loopback addresses, unless this is true.
    allow_open: bool = False
    tenants: dict[str, TenantSettings] = Field(default_factory=dict)
    default_tenant: TenantSettings = Field(default_factory=TenantSettings)

    # Admission control: requests in flight at once; one more gets 503 + Retry-After.
    max_inflight: int = 256
    # A tenant without its own max_inflight holds at most max(1, share x max_inflight) of them;
    # one more gets 429 + Retry-After while other tenants are still admitted.
    tenant_max_inflight_share: float = Field(default=0.5, gt=0.0, le=1.0)
    # Deadline of a request without a client timeout, seconds.
    request_timeout_s: float = 300.0
    # Largest accepted HTTP body.
    max_body_bytes: int = 8 * 1024 * 1024

    # Routing across inference replicas: affinity (the replica holding the prompt's longest
    # prefix, as the replicas' KV-cache events report it, else bounded-load consistent
    # hashing), ring (the hashing alone), round_robin or least_loaded.
    route_policy: Literal["affinity", "ring", "round_robin", "least_loaded"] = "affinity"
    # Follow each replica's WatchPrefixes stream (affinity only); off = route by what this
    # gateway sent where, and the ring.
    route_kv_events: bool = True
    route_block_chars: int = 256
    route_max_blocks: int = 16
    route_index_size: int = 100_000
    route_load_factor: float = 1.25
    route_virtual_nodes: int = 64
    health_interval_s: float = 2.0
    breaker_failures: int = 3
    breaker_open_s: float = 10.0
    breaker_ttft_factor: float = 10.0

    # Usage metrics (gateway/usage.py) labelled by tenant as well: one Prometheus series per
    # tenant, model and outcome, so only where the operator can store that many (off by default;
    # the Redis usage counters and GET /v1/usage are per tenant either way).
    usage_metrics_by_tenant: bool = False

    # Gateway-local hits (gateway/local_cache.py): exact response hits and policy input verdicts
    # kept in this process and served without a call while Redis pushes no invalidation of the
    # versions they depend on. The watched Redis (local_hits_redis_url, default redis_url) must
    # be the one that keeps the cache's versions (the cache's LLMESH_CACHE_REDIS_URL).
    local_hits: bool = True
    local_hits_redis_url: str = ""
    local_hits_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    local_hits_tenant_bytes: int = Field(default=8 * 1024 * 1024, ge=0)
    # Exact misses decided in that same Redis by this gateway (gateway/direct_lookup.py), saving
    # the lookup's call to the cache service, wherever the cache offers it (entries and
    # versions in one plain Redis, no tenant list: it publishes its lease terms there).
    direct_lookups: bool = True
    # A kept input verdict is used for at most this long: no longer than a policy replica may
    # take to adopt a ruleset another replica loaded (the policy's watch_interval_s).
    local_verdict_ttl_s: float = Field(default=2.0, ge=0.0)

    # Session context budget: tokens left for the answer when truncating a session.
    session_reserve_tokens: int = 512
    session_ttl_s: int = 0

    @field_validator("inference_addresses", mode="before")
    @classmethod
    def _addresses(cls, value: object) -> object:
        return _split(value)

    @field_validator("policy_address", "cache_address", "embeddings_address")
    @classmethod
    def _upstream(cls, value: str) -> str:
        # One instance, a comma-separated list of instances or dns:///name:port.
        return validate_address(value)

    def upstream_inference(self) -> list[str]:
        """Every inference replica address (the list, else the single address)."""
        if self.inference_addresses:
            return list(self.inference_addresses)
        return [self.inference_address] if self.inference_address else []

    def tenant(self, name: str) -> TenantSettings:
        return self.tenants.get(name, self.default_tenant)
