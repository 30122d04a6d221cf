"""A session is bounded in bytes and read from its tail (issue 14, row "a session can grow to
10,000 turns x 256 KiB and is read whole each turn").

``max_session_bytes`` caps what a session holds: an append past it drops the oldest turns (a
leading system turn and pinned turns stay), so a long conversation stays usable; an append that
cannot fit at all is INVALID_ARGUMENT naming the limit. GetSession under a token budget reads the
newest turns only, in growing pages, instead of the whole list.

Real components: the cache over gRPC on the test Redis. The token counter is a stand-in (one
token per 4 characters) that records which turns it was given: what the cache read.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import pytest
import redis.asyncio as aioredis
from llmesh.v1 import cache_pb2, common_pb2

from cache.domain import Strategy, Turn
from cache.sessions import SessionStore
from cache.truncation import truncate
from tests.integration.cache.conftest import Client, Served, assistant, serve_cache, system, user

CAP = 16 * 1024
TURN_CHARS = 1000


class RecordingCounter:
    """One token per 4 characters (plus 4 for the framing); remembers every turn it counted."""

    def __init__(self) -> None:
        self.counted = 0

    async def count_turns(self, turns: Sequence[Turn], model: str = "") -> list[int]:
        self.counted += len(turns)
        return [len(t.content) // 4 + 4 for t in turns]


# One cache server for the module, as every cache test has (tenants keep the tests apart).
@pytest.fixture(scope="module")
async def counter() -> RecordingCounter:
    return RecordingCounter()


@pytest.fixture(scope="module")
async def served(redis_url: str, counter: RecordingCounter) -> AsyncIterator[Served]:
    s = await serve_cache(redis_url, counter=counter, max_session_bytes=CAP, max_turn_bytes=8 * 1024)
    yield s
    await s.close()


@pytest.fixture
def client(served: Served) -> Client:
    return Client(stub=served.stub, tenant="t-" + uuid.uuid4().hex[:12])


async def stored_bytes(redis_url: str, client: Client, session_id: str) -> tuple[int, list[bytes]]:
    """The bytes the session's list holds in Redis, and its raw turns."""
    redis = aioredis.from_url(redis_url)
    try:
        items = await redis.lrange(SessionStore._keys(client.tenant, session_id)[0], 0, -1)
        raw = [t if isinstance(t, bytes) else t.encode() for t in items]
    finally:
        await redis.aclose()
    return sum(len(t) for t in raw), raw


async def append(client: Client, session_id: str, *turns: common_pb2.ChatMessage) -> Any:
    return await client.call("AppendTurns", cache_pb2.AppendTurnsRequest(session_id=session_id, turns=turns))


async def test_appends_past_the_byte_cap_drop_the_oldest_turns_and_keep_system_and_pinned(
    client: Client, redis_url: str
) -> None:
    await append(client, "s", system("be brief"), user("remember: " + "p" * 200))
    await append(client, "s", assistant("noted " + "k" * 200, pinned=True))
    for i in range(60):  # ~60 KB of turns into a 16 KiB session
        reply = await append(client, "s", user(f"q{i} " + "x" * TURN_CHARS), assistant(f"a{i}"))
    size, raw = await stored_bytes(redis_url, client, "s")
    assert size <= CAP, size
    got = await client.call("GetSession", cache_pb2.GetSessionRequest(session_id="s"))
    contents = [m.content for m in got.messages]
    assert reply.total_turns == got.total_turns == len(raw) < 120
    assert contents[0] == "be brief"  # the system turn stays first
    assert any(c.startswith("noted ") for c in contents)  # the pinned turn stays
    assert not any(c.startswith("remember: ") for c in contents)  # the oldest plain turn went
    assert contents[-2:] == [f"q59 {'x' * TURN_CHARS}", "a59"]  # the newest are all there


async def test_an_append_that_cannot_fit_is_refused_naming_the_limit(client: Client) -> None:
    too_big = [user("y" * 7000) for _ in range(3)]  # each under max_turn_bytes, together over the cap
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await append(client, "s2", *too_big)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert str(CAP) in (err.value.details() or "")


async def test_a_token_budget_reads_only_the_newest_turns(client: Client, counter: RecordingCounter) -> None:
    await append(client, "long", system("sys"))
    turns = 0
    while turns < 300:
        await append(client, "long", *(user(f"turn {turns + i} " + "w" * 20) for i in range(50)))
        turns += 50
    whole = await client.call("GetSession", cache_pb2.GetSessionRequest(session_id="long"))
    counter.counted = 0
    budget = 120
    got = await client.call("GetSession", cache_pb2.GetSessionRequest(session_id="long", token_budget=budget))
    # The same answer as truncating the whole session...
    all_turns = [
        Turn(role="system" if m.role == common_pb2.ROLE_SYSTEM else "user", content=m.content)
        for m in whole.messages
    ]
    expected = truncate(all_turns, [len(t.content) // 4 + 4 for t in all_turns], budget, Strategy.SYSTEM_TAIL)
    assert [m.content for m in got.messages] == [all_turns[i].content for i in expected.kept]
    assert got.total_turns == 301 and got.truncated and got.token_count == expected.token_count
    # ...from a page of the newest turns (and the system turn), not all 301.
    assert counter.counted <= 40, counter.counted
