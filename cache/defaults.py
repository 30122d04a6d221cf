"""Default limits and lifetimes of the cache, defined once.

:class:`cache.config.CacheSettings` (the environment) and the limit dataclasses
of the stores (:class:`cache.sessions.SessionLimits`,
:class:`cache.service.ResponseLimits`, :class:`cache.semantic.SemanticCache`)
take their defaults from here, so a store built in a test behaves like the
service with no configuration.
"""

from __future__ import annotations

# Sessions.
SESSION_TTL_S = 7 * 24 * 3600
MAX_SESSION_TURNS = 10_000
MAX_TURNS_PER_APPEND = 1_000
MAX_TURN_BYTES = 256 * 1024

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
SEMANTIC_THRESHOLD = 0.86
SEMANTIC_CANDIDATES = 4
# Entries kept in the replicated semantic log (Redis stream) and in each in-process index.
SEMANTIC_MAX_ENTRIES = 200_000
# Partitions above this size switch from an exact flat index to HNSW.
SEMANTIC_HNSW_MIN = 4096
