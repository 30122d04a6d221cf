"""Prometheus metrics of the policy service (labels bounded: actions, rule ids, entity types)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

DECISIONS = Counter(
    "llmesh_policy_decisions_total",
    "Policy decisions by kind (input, output, stream, stream_abandoned) and resulting action.",
    ["kind", "action"],
)
FINDINGS = Counter(
    "llmesh_policy_findings_total",
    "Rule matches by rule id and entity type.",
    ["rule", "entity"],
)
AUDIT_BUFFERED = Gauge(
    "llmesh_policy_audit_buffered_records",
    "Audit records waiting in memory to be written to Redis.",
)
AUDIT_WRITTEN = Counter(
    "llmesh_policy_audit_written_total",
    "Audit records written to the Redis stream.",
)
AUDIT_REFUSED = Counter(
    "llmesh_policy_audit_refused_total",
    "Decisions refused (UNAVAILABLE) because the audit buffer was full.",
)
RULESET_RELOADS = Counter(
    "llmesh_policy_ruleset_reloads_total",
    "Ruleset swaps by where the ruleset came from (api, file, shared) and outcome.",
    ["source", "result"],
)
STREAM_HELD_BACK = Histogram(
    "llmesh_policy_stream_held_back_chars",
    "Characters held back after each streamed delta.",
    buckets=(0, 1, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
)
SCAN_MEMO = Counter(
    "llmesh_policy_scan_memo_total",
    "Input texts whose detector matches were found in the scan memo (hit) or scanned (miss).",
    ["result"],
)
