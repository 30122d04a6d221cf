"""The version namespaces every service stamps, reads and invalidates.

A namespace names one thing whose version a request can observe and bound
(``x-llmesh-cache-version``, see :mod:`services.runtime.context`); the version
itself lives in Redis under ``llmesh:ver:{<tenant>:<namespace>}``
(:mod:`services.runtime.versions`). The strings built here are on the wire and
in Redis keys, so they never change: existing data and pinned floors depend on
them byte for byte.
"""

from __future__ import annotations

from collections.abc import Iterable

# Bumped to invalidate every cached response of a tenant at once (no scan).
TENANT = "tenant"
# The tenant's policy ruleset (policy service).
POLICY = "policy"

RESPONSE_PREFIX = "response:"
SESSION_PREFIX = "session:"
RAG_PREFIX = "rag:"
# Bumped when one exact response entry is dropped (Invalidate with a key), for whoever keeps a
# copy of it: ``entry:<id>`` (cache.keys.exact_digest); nothing is stamped with it.
ENTRY_PREFIX = "entry:"

# Scope of a response key that names none.
DEFAULT_RESPONSE_SCOPE = "default"

# Namespaces the cache service stamps on a response entry itself: a response derived from
# a cached answer must not carry them into a new entry as if it depended on them.
CACHE_OWNED_PREFIXES = (TENANT, RESPONSE_PREFIX)


def response_scope(scope: str) -> str:
    """The namespace of the response cache entries of ``scope`` (``response:<scope>``)."""
    return RESPONSE_PREFIX + (scope or DEFAULT_RESPONSE_SCOPE)


def entry(entry_id: str) -> str:
    """The namespace bumped when the exact entry ``entry_id`` is dropped (``entry:<id>``)."""
    return ENTRY_PREFIX + entry_id


def session(session_id: str) -> str:
    """The namespace of one conversation session (``session:<id>``)."""
    return SESSION_PREFIX + session_id


def rag_collection(collection: str) -> str:
    """The namespace of one RAG collection (``rag:<collection>``)."""
    return RAG_PREFIX + collection


def rag_scope(collections: Iterable[str], top_k: int, min_score: float) -> str:
    """The response-cache scope of an answer grounded on a RAG search.

    Answers over other collections or other search bounds are different entries,
    so every one of them is in the scope (collections sorted: order does not matter).
    """
    return f"{RAG_PREFIX}{'+'.join(sorted(collections))}:k{top_k}:s{min_score:g}"


def created_by_cache(namespace: str) -> bool:
    """Whether the cache service creates ``namespace``'s version key when it reads or stamps one
    that is missing (``tenant``, ``response:*``, ``session:*``: the versions of what it stores).

    Any other version (``policy``, ``rag:*``) belongs to the service that owns the data, which
    creates it; the cache only reads it, so a name nobody created (a collection that does not
    exist) makes no key (:mod:`services.runtime.versions`, ``peek``).
    """
    return namespace == TENANT or namespace.startswith((RESPONSE_PREFIX, SESSION_PREFIX))


def is_cache_owned(namespace: str) -> bool:
    """Whether the cache service stamps ``namespace`` itself (see :data:`CACHE_OWNED_PREFIXES`)."""
    return namespace.startswith(CACHE_OWNED_PREFIXES)
