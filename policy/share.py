"""A ruleset loaded through the API, shared by every policy replica through Redis.

ReloadRules reaches one replica; it publishes the YAML (and its digest) under one
hash key, and every replica's watch tick compares the digest with its own and
loads the shared ruleset when they differ. Reloading the file (through the API or
because the file changed) clears the key, so the replicas go back to the file,
which they all watch. A replica that starts while the key is set starts with the
shared ruleset.
"""

from __future__ import annotations

from typing import Any, Protocol

DEFAULT_KEY = "llmesh:policy:ruleset"


class RulesetShare(Protocol):
    async def publish(self, yaml_text: str, digest: str) -> None: ...

    async def clear(self) -> None: ...

    async def digest(self) -> str | None: ...

    async def fetch(self) -> tuple[str, str] | None:
        """(yaml, digest) of the shared ruleset, or None."""
        ...


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class RedisRulesetShare:
    """The shared ruleset in a Redis hash (fields ``yaml`` and ``digest``)."""

    def __init__(self, redis: Any, key: str = DEFAULT_KEY) -> None:
        self._redis = redis
        self._key = key

    async def publish(self, yaml_text: str, digest: str) -> None:
        await self._redis.hset(self._key, mapping={"yaml": yaml_text, "digest": digest})

    async def clear(self) -> None:
        await self._redis.delete(self._key)

    async def digest(self) -> str | None:
        value = await self._redis.hget(self._key, "digest")
        return None if value is None else _text(value)

    async def fetch(self) -> tuple[str, str] | None:
        yaml_text, digest = await self._redis.hmget(self._key, ["yaml", "digest"])
        if yaml_text is None or digest is None:
            return None
        return _text(yaml_text), _text(digest)
