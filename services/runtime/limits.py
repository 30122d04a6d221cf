"""Limits of the contracts between services, defined once.

The gateway checks a request against them before it crosses a hop, and the
service that owns the resource checks them again (a direct gRPC caller skips the
gateway); both read the numbers from here so the two checks cannot drift apart.
"""

from __future__ import annotations

# Completions per request (OpenAI ``n``); each one is a sequence in the engine's batch.
MAX_CHOICES = 16
# A session id, a request id and a tenant name: 1-128 of these characters.
MAX_SESSION_ID_CHARS = 128
MAX_IDENTIFIER_CHARS = 128
IDENTIFIER_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")
# Ids that become part of a Redis key (tenant names, session ids) have no ':'. Keys join the
# tenant and a namespace with ':' (``{<tenant>:session:<id>}``), so a tenant "a:session" and
# a tenant "a" with session "session:x"... would name the same key; without ':' in the tenant
# the first ':' ends it and no two (tenant, namespace) pairs share a key.
KEY_IDENTIFIER_CHARS = IDENTIFIER_CHARS - {":"}
