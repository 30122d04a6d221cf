"""Sessions over gRPC on a real Redis: versions, optimistic concurrency, bad input."""

from __future__ import annotations

import grpc
import pytest
from llmesh.v1 import cache_pb2, common_pb2

from services.runtime.context import parse_versions
from tests.integration.cache.conftest import Client, assistant, system, user


async def test_append_bumps_version_and_get_returns_turns(client: Client) -> None:
    first = await client.call(
        "AppendTurns", cache_pb2.AppendTurnsRequest(session_id="s1", turns=[system("be brief"), user("hi")])
    )
    assert first.total_turns == 2
    assert parse_versions(client.trailers["x-llmesh-cache-version"])["session:s1"] == first.version
    second = await client.call(
        "AppendTurns", cache_pb2.AppendTurnsRequest(session_id="s1", turns=[assistant("hello")])
    )
    assert second.version > first.version
    got = await client.call("GetSession", cache_pb2.GetSessionRequest(session_id="s1"))
    assert [m.content for m in got.messages] == ["be brief", "hi", "hello"]
    assert got.version == second.version
    assert got.total_turns == 3
    assert not got.truncated


async def test_expected_version_conflict_is_aborted(client: Client) -> None:
    created = await client.call(
        "AppendTurns", cache_pb2.AppendTurnsRequest(session_id="s2", turns=[user("a")], expected_version=0)
    )
    with pytest.raises(grpc.aio.AioRpcError) as exists:
        await client.call(
            "AppendTurns",
            cache_pb2.AppendTurnsRequest(session_id="s2", turns=[user("b")], expected_version=0),
        )
    assert exists.value.code() == grpc.StatusCode.ABORTED
    ok = await client.call(
        "AppendTurns",
        cache_pb2.AppendTurnsRequest(
            session_id="s2", turns=[assistant("b")], expected_version=created.version
        ),
    )
    # A second writer that read the same version loses: no silent interleaving.
    with pytest.raises(grpc.aio.AioRpcError) as lost:
        await client.call(
            "AppendTurns",
            cache_pb2.AppendTurnsRequest(
                session_id="s2", turns=[user("c")], expected_version=created.version
            ),
        )
    assert lost.value.code() == grpc.StatusCode.ABORTED
    got = await client.call("GetSession", cache_pb2.GetSessionRequest(session_id="s2"))
    assert [m.content for m in got.messages] == ["a", "b"]
    assert got.version == ok.version


async def test_delete_bumps_version_and_tenants_are_isolated(client: Client) -> None:
    appended = await client.call(
        "AppendTurns", cache_pb2.AppendTurnsRequest(session_id="s3", turns=[user("x")])
    )
    other = Client(stub=client.stub, tenant=client.tenant + "-other")
    with pytest.raises(grpc.aio.AioRpcError) as guessed:
        await other.call("GetSession", cache_pb2.GetSessionRequest(session_id="s3"))
    assert guessed.value.code() == grpc.StatusCode.NOT_FOUND  # another tenant's id: not their data
    deleted = await client.call("DeleteSession", cache_pb2.DeleteSessionRequest(session_id="s3"))
    assert deleted.deleted
    assert deleted.version > appended.version
    again = await client.call("DeleteSession", cache_pb2.DeleteSessionRequest(session_id="s3"))
    assert not again.deleted
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await client.call("GetSession", cache_pb2.GetSessionRequest(session_id="s3"))
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND
    # The session's version still comes back, so a later read never goes backwards.
    trailers = dict(gone.value.trailing_metadata() or ())
    assert parse_versions(trailers["x-llmesh-cache-version"])["session:s3"] >= again.version


@pytest.mark.parametrize(
    "request_",
    [
        cache_pb2.AppendTurnsRequest(session_id="bad id!", turns=[user("x")]),
        cache_pb2.AppendTurnsRequest(session_id="x" * 200, turns=[user("x")]),
        cache_pb2.AppendTurnsRequest(session_id="{tag}", turns=[user("x")]),
        cache_pb2.AppendTurnsRequest(session_id="ok", turns=[]),
        cache_pb2.AppendTurnsRequest(session_id="ok", turns=[user("x" * 300_000)]),
        cache_pb2.AppendTurnsRequest(session_id="ok", turns=[common_pb2.ChatMessage(content="no role")]),
    ],
)
async def test_bad_session_input_is_invalid_argument(
    client: Client, request_: cache_pb2.AppendTurnsRequest
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.call("AppendTurns", request_)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_budget_without_tokenizer_is_invalid_argument(client: Client) -> None:
    await client.call("AppendTurns", cache_pb2.AppendTurnsRequest(session_id="s4", turns=[user("x")]))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.call("GetSession", cache_pb2.GetSessionRequest(session_id="s4", token_budget=10))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
