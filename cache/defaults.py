"""Default limits and lifetimes of the cache, defined once.

:class:`cache.config.CacheSettings` (the environment) and the limit dataclasses
of the stores (:class:`cache.sessions.SessionLimits`,
:class:`cache.service.ResponseLimits`, :class:`cache.semantic.SemanticCache`)
take their defaults from here, so a store built in a test behaves like the
service with no configuration.
"""

from __future__ import annotations

from services.runtime import versions

# Sessions.
SESSION_TTL_S = 7 * 24 * 3600
# Over either bound, an append drops the session's oldest turns (a leading system/developer
# turn and pinned turns stay) to make room: the session stays usable, never grows past them.
MAX_SESSION_TURNS = 10_000
MAX_SESSION_BYTES = 4 * 1024 * 1024
MAX_TURNS_PER_APPEND = 1_000
MAX_TURN_BYTES = 256 * 1024
# GetSession with a token budget reads the newest turns in pages of this many (doubling),
# not the whole list.
SESSION_PAGE_TURNS = 32
# Sessions a tenant's index lists (cache/session_index.py): past it, the entries of the sessions
# that expire soonest go (those sessions still work, they are only not listed).
MAX_LISTED_SESSIONS = 100_000

# Version keys (services.runtime.versions): a bumped or stamped namespace lives this long after
# its last use (longer than any entry stamped with it), one only read this long.
VERSION_TTL_S = versions.DEFAULT_TTL_S
VERSION_READ_TTL_S = versions.DEFAULT_READ_TTL_S

# Response cache.
RESPONSE_TTL_S = 3600
# TTLs get +-jitter so that entries written together do not expire together.
TTL_JITTER = 0.1
MAX_KEY_BYTES = 1024 * 1024
MAX_ENTRY_BYTES = 4 * 1024 * 1024
# Single-flight: how long a producer holds its lease, how long waiters wait by default.
LEASE_MS = 30_000
# A producer whose lease ran out may still store for this long after it, as long as no
# other producer was granted the lease and no entry was stored meanwhile.
LEASE_GRACE_MS = 600_000
WAIT_MS = 10_000

# Semantic cache.
# Stage one (recall): cosine similarity at which the index proposes a candidate.
# Stage two (precision): the same-question cross-encoder and the score it must give (an English
# candidate in the same words, cache.guard.same_words, needs no score). Both thresholds were
# chosen together on the English dev slices of benchmarks/semantic_datasets.py and the blind
# training pairs of the categories, which the verifier never trained on (the strictest
# verifier threshold that keeps 60 % true hits at <= 1 % false hits there, at the cosine with
# the most true hits; benchmarks/semantic_eval.py `choose`);
# `llmesh bench cache` reports the test halves.
SEMANTIC_THRESHOLD = 0.5
# At most this many candidates per lookup are verified (one batch: ~4 ms of CPU each).
SEMANTIC_CANDIDATES = 2
SEMANTIC_VERIFIER = "same-question-v1"
SEMANTIC_VERIFIER_THRESHOLD = 0.97
# Prompts in other languages go to the multilingual verifier (multilingual-e5-small, trained
# on same-language pairs in eight languages), whose threshold is chosen the same way on the
# multilingual blind set's tune half, which it never trained on.
SEMANTIC_MULTILINGUAL_VERIFIER = "same-question-multilingual-v1"
SEMANTIC_MULTILINGUAL_VERIFIER_THRESHOLD = 0.99
# Entries kept in the replicated semantic log (Redis stream) and in each in-process index.
SEMANTIC_MAX_ENTRIES = 200_000
# Partitions above this size switch from an exact flat index to HNSW.
SEMANTIC_HNSW_MIN = 4096
