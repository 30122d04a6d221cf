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
