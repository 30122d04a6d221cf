"""What the semantic cache decided about its candidates, and what verifying them cost.

Served on the cache service's metrics port (``LLMESH_CACHE_METRICS_PORT``). The gateway counts
lookups and their outcome (``llmesh_gateway_cache_lookups_total``); these say, per language of
the prompt, which stage decided each candidate, so an operator who enables another language
sees how often its verifier runs and what a batch costs (cache/README.md, "Consistency", the
semantic entry).
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

# One candidate of a semantic lookup, at or above the index threshold, by what decided it:
# guard (vetoed), same_words (accepted without a model), verified / not_verified (the verifier's
# score at or above its threshold, or below), unverifiable (the verifier failed: no hit),
# unverified (no verifier configured: accepted).
SEMANTIC_CANDIDATES = Counter(
    "llmesh_cache_semantic_candidates_total",
    "Semantic cache candidates by the prompt's language and the stage that decided them",
    ["language", "decision"],
)
# Semantic lookups that did not happen, by why: language_off (the prompt's language, in
# ``language``, is not in LLMESH_CACHE_SEMANTIC_LANGUAGES), no_embeddings, embeddings_timeout,
# embeddings_failed. The language_off counts say how much traffic enabling a language would reach.
SEMANTIC_SKIPPED = Counter(
    "llmesh_cache_semantic_skipped_total",
    "Semantic cache lookups skipped, by reason (and the prompt's language when it is not enabled)",
    ["reason", "language"],
)
VERIFY_SECONDS = Histogram(
    "llmesh_cache_semantic_verify_seconds",
    "Wall time of one verification batch (a lookup's surviving candidates), by verifier",
    ["verifier"],
    buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0),
)
