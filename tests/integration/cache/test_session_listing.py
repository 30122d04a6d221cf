"""ListSessions and the per-tenant session index on a real Redis; Invalidate's only_existing."""

from __future__ import annotations

import uuid

import grpc
import pytest
import redis.asyncio as aioredis
from llmesh.v1 import cache_pb2

from cache.session_index import encode_token, index_key
from cache.sessions import SessionStore
from services.runtime import namespaces
from services.runtime.versions import version_key
from tests.integration.cache.conftest import Client, Served, serve_cache, user


async def _append(client: Client, session_id: str, *texts: str, ttl_s: int = 0) -> int:
    reply = await client.call(
        "AppendTurns",
        cache_pb2.AppendTurnsRequest(
            session_id=session_id, turns=[user(t) for t in texts or ("hi",)], ttl_seconds=ttl_s
        ),
    )
    return int(reply.version)


async def _list_all(client: Client, page_size: int) -> list[str]:
    ids: list[str] = []
    token = ""
    while True:
        page = await client.call(
            "ListSessions", cache_pb2.ListSessionsRequest(page_size=page_size, page_token=token)
        )
        assert len(page.sessions) <= page_size
        ids.extend(s.session_id for s in page.sessions)
        token = page.next_page_token
        if not token:
            return ids


async def test_lists_sessions_latest_to_expire_first_with_their_size_and_version(client: Client) -> None:
    old = await _append(client, "old", "a", "b", ttl_s=100)
    new = await _append(client, "new", "c", ttl_s=1000)
    page = await client.call("ListSessions", cache_pb2.ListSessionsRequest())
    assert [s.session_id for s in page.sessions] == ["new", "old"]
    assert [s.total_turns for s in page.sessions] == [1, 2]
    assert [s.version for s in page.sessions] == [new, old]
    expires = {s.session_id: s.expires_at_ms for s in page.sessions}
    assert 0 < expires["new"] - expires["old"] <= 900_000 + 5_000
    assert page.next_page_token == ""
    # An append moves a session to the front (its lifetime starts again).
    await _append(client, "old", "d", ttl_s=2000)
    page = await client.call("ListSessions", cache_pb2.ListSessionsRequest())
    assert [s.session_id for s in page.sessions] == ["old", "new"]
    assert page.sessions[0].total_turns == 3


async def test_pages_cover_every_session_once_even_with_equal_expiries(
    client: Client, redis_url: str
) -> None:
    ids = [f"s{i:02d}" for i in range(23)]
    for session_id in ids:
        await _append(client, session_id)
    # Ties: several sessions sharing one score (the same ms), as appends in one ms would.
    r = aioredis.Redis.from_url(redis_url)
    try:
        await r.zadd(index_key(client.tenant), dict.fromkeys(ids[5:15], 4102444800000))
    finally:
        await r.aclose()
    for size in (1, 4, 7, 100):
        listed = await _list_all(client, size)
        assert sorted(listed) == ids, size
        assert len(listed) == len(set(listed))


async def test_deleted_sessions_leave_the_listing_and_others_see_none(client: Client, served: Served) -> None:
    await _append(client, "keep")
    await _append(client, "drop")
    await client.call("DeleteSession", cache_pb2.DeleteSessionRequest(session_id="drop"))
    assert await _list_all(client, 10) == ["keep"]
    other = Client(stub=served.stub, tenant="t-" + uuid.uuid4().hex[:12])
    assert await _list_all(other, 10) == []


async def test_a_session_gone_behind_the_index_is_left_out_and_forgotten(
    client: Client, redis_url: str
) -> None:
    await _append(client, "here")
    await _append(client, "ghost")
    r = aioredis.Redis.from_url(redis_url)
    try:
        # The turns go without the index hearing of it (a delete whose index update failed).
        await r.delete(*SessionStore._keys(client.tenant, "ghost"))
        assert await _list_all(client, 10) == ["here"]
        assert await r.zscore(index_key(client.tenant), "ghost") is None
        # Expired entries are pruned by the next write or listing.
        await r.zadd(index_key(client.tenant), {"expired": 1})
        await _list_all(client, 10)
        assert await r.zscore(index_key(client.tenant), "expired") is None
        assert 0 < await r.pttl(index_key(client.tenant)) <= 7 * 24 * 3600 * 1000
    finally:
        await r.aclose()


async def test_the_index_keeps_the_latest_sessions_past_its_cap(redis_url: str) -> None:
    served = await serve_cache(redis_url, max_listed_sessions=3)
    try:
        client = Client(stub=served.stub, tenant="t-" + uuid.uuid4().hex[:12])
        for i in range(5):
            await _append(client, f"s{i}", ttl_s=100 + i)
        assert await _list_all(client, 10) == ["s4", "s3", "s2"]
        # Unlisted sessions still work.
        got = await client.call("GetSession", cache_pb2.GetSessionRequest(session_id="s0"))
        assert got.total_turns == 1
    finally:
        await served.close()


@pytest.mark.parametrize(
    ("page_size", "page_token"),
    [(-1, ""), (1001, ""), (10, "not-a-token"), (10, encode_token(5, "")), (10, "x" * 600)],
)
async def test_bad_pages_are_invalid_argument(client: Client, page_size: int, page_token: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.call(
            "ListSessions", cache_pb2.ListSessionsRequest(page_size=page_size, page_token=page_token)
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_only_existing_bumps_an_existing_version_and_makes_no_key(
    client: Client, redis_url: str
) -> None:
    r = aioredis.Redis.from_url(redis_url)
    try:
        made_up = namespaces.response_scope("rag:nothing-here:k4:s0")
        reply = await client.call(
            "Invalidate", cache_pb2.InvalidateRequest(namespace=made_up, only_existing=True)
        )
        assert reply.versions[0].version > 0
        assert not await r.exists(version_key(client.tenant, made_up))
        # The tenant namespace exists once anything was looked up or stored: then it moves.
        read = await client.call("GetVersions", cache_pb2.GetVersionsRequest(namespaces=["tenant"]))
        before = read.versions[0].version
        bumped = await client.call("Invalidate", cache_pb2.InvalidateRequest(tenant=True, only_existing=True))
        assert bumped.versions[0].namespace == "tenant"
        assert bumped.versions[0].version > before
        assert await r.get(version_key(client.tenant, "tenant")) == str(bumped.versions[0].version).encode()
    finally:
        await r.aclose()
