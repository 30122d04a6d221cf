"""VersionStore.get_many (services/runtime/versions.py) on a real Redis of the test's own."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from services.runtime.versions import VersionStore, version_key
from tests.integration.cache.redis_proc import RedisProcess


@pytest.fixture
async def client() -> AsyncIterator[aioredis.Redis]:
    proc = RedisProcess()
    proc.start()
    redis = aioredis.Redis.from_url(proc.url)
    yield redis
    await redis.aclose()
    proc.close()


async def test_several_namespaces_are_read_in_one_script_call(client: aioredis.Redis) -> None:
    store = VersionStore(client)
    bumped = await store.bump("t", "b")
    calls: list[int] = []
    script = store._read

    async def counted(*, keys: list[str], args: list[Any]) -> Any:
        calls.append(len(keys))
        return await script(keys=keys, args=args)

    store._read = counted  # type: ignore[method-assign]
    got = await store.get_many("t", ["a", "b", "a", "c"], hold="keep")
    assert calls == [3]
    assert got["b"] == bumped
    assert set(got) == {"a", "b", "c"}
    # The missing ones were created and are kept (a day, extended to twice that).
    for namespace in ("a", "c"):
        stored = await client.get(version_key("t", namespace))
        assert stored is not None and int(stored) == got[namespace]
        assert await client.ttl(version_key("t", namespace)) > 24 * 3600
    # Read again: the same versions.
    assert await store.get_many("t", ["a", "b", "c"]) == got


async def test_a_server_that_refuses_keys_of_several_slots_gets_one_call_each(
    client: aioredis.Redis,
) -> None:
    """A proxy in front of a sharded Redis answers CROSSSLOT: get_many falls back to one call
    per namespace (pipelined) and stops trying the single call."""
    store = VersionStore(client)
    bumped = await store.bump("t", "x")
    refused: list[int] = []
    script = store._read

    async def proxy(*, keys: list[str], args: list[Any], client: Any = None) -> Any:
        if len(keys) > 1:
            refused.append(len(keys))
            raise ResponseError("CROSSSLOT Keys in request don't hash to the same slot")
        return await script(keys=keys, args=args, client=client)

    store._read = proxy  # type: ignore[assignment]
    first = await store.get_many("t", ["x", "y"])
    second = await store.get_many("t", ["x", "y"])
    assert first == second
    assert first["x"] == bumped
    assert refused == [2]  # tried once, then straight to the pipeline


async def test_other_errors_are_not_taken_for_a_refusal(client: aioredis.Redis) -> None:
    store = VersionStore(client)

    async def broken(*, keys: list[str], args: list[Any], client: Any = None) -> Any:
        raise ResponseError("OOM command not allowed when used memory > 'maxmemory'")

    store._read = broken  # type: ignore[assignment]
    with pytest.raises(ResponseError, match="OOM"):
        await store.get_many("t", ["x", "y"])
    assert not store._cross_slot_refused


@pytest.mark.parametrize("refuse_cross_slot", [False, True])
async def test_each_namespace_is_read_as_its_own_hold_says_in_one_call(
    client: aioredis.Redis, refuse_cross_slot: bool
) -> None:
    """get_held: a kept, a read and a peeked namespace in one script call (or, behind a proxy
    that refuses keys of several slots, one pipelined call each), each with its own lifetime."""
    store = VersionStore(client, ttl_s=3600, read_ttl_s=60)
    owned = await store.bump("t", "owned")  # exists: peeked as it is
    calls: list[int] = []
    script = store._read

    async def counted(*, keys: list[str], args: list[Any], client: Any = None) -> Any:
        calls.append(len(keys))
        if refuse_cross_slot and len(keys) > 1:
            raise ResponseError("CROSSSLOT Keys in request don't hash to the same slot")
        return await script(keys=keys, args=args, client=client)

    store._read = counted  # type: ignore[assignment]
    got = await store.get_held("t", {"kept": "keep", "read": "read", "peeked": "peek", "owned": "peek"})
    assert calls == ([4, 1, 1, 1, 1] if refuse_cross_slot else [4])
    assert got["owned"] == owned
    # Created with the lifetime each asked for (twice it), and the peeked one not at all.
    assert 2 * 3600 - 5 <= await client.ttl(version_key("t", "kept")) <= 2 * 3600
    assert 2 * 60 - 5 <= await client.ttl(version_key("t", "read")) <= 2 * 60
    assert await client.exists(version_key("t", "peeked")) == 0
    again = await store.get_held("t", {"kept": "read", "read": "read", "owned": "peek"})
    assert again == {name: got[name] for name in ("kept", "read", "owned")}
