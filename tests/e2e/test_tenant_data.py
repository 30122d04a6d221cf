"""End to end: what the mesh keeps for a tenant, through the official openai SDK (its generic
``post``/``get``/``delete`` where it has no method) and the ChatService RPCs, against the gateway
in front of the real services and the real model: a repeated request is a HIT, a purge's version
makes the next one miss, sessions are listed, read and deleted (404 for another tenant), and the
usage report adds up the tokens of the requests made."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Awaitable
from typing import Any

import grpc
import httpx
import openai
import pytest
from llmesh.v1 import chat_pb2, chat_pb2_grpc

from services.runtime import context as rc
from tests.e2e.mesh import KEYS, Mesh

pytestmark = pytest.mark.slow


def sdk(mesh: Mesh, tenant: str = "main") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=mesh.gateway.base_url, api_key=KEYS[tenant], max_retries=0, timeout=120
    )


def _range() -> dict[str, str]:
    today = dt.datetime.now(dt.UTC).date()
    return {"start": str(today - dt.timedelta(days=1)), "end": str(today + dt.timedelta(days=1))}


async def _json(call: Awaitable[object]) -> dict[str, Any]:
    """The JSON body the SDK's generic methods return with ``cast_to=object``."""
    value = await call
    assert isinstance(value, dict)
    return value


async def _usage(client: openai.AsyncOpenAI) -> dict[str, Any]:
    return await _json(client.get("/usage", cast_to=object, options={"params": _range()}))


async def _ask(
    client: openai.AsyncOpenAI, text: str, *, version: str = "", session_id: str = ""
) -> tuple[str, Any]:
    """(X-Cache-Status, the parsed completion) of a greedy, short chat request."""
    raw = await client.chat.completions.with_raw_response.create(
        model="",
        messages=[{"role": "user", "content": text}],
        max_tokens=8,
        temperature=0,
        extra_headers={"X-Cache-Version": version} if version else None,
        extra_body={"session_id": session_id} if session_id else None,
    )
    return raw.headers["x-cache-status"], raw.parse()


async def test_purge_sessions_and_usage_over_http(mesh: Mesh) -> None:
    async with sdk(mesh) as client, sdk(mesh, "strict") as other:
        before = (await _usage(client))["total"]
        spent: list[Any] = []

        prompt = f"Name a colour. ({uuid.uuid4().hex[:8]})"
        status, first = await _ask(client, prompt)
        assert status == "MISS"
        spent.append(first.usage)
        status, _ = await _ask(client, prompt)
        assert status == "HIT"

        purged = await client.post("/cache/purge", body={}, cast_to=httpx.Response)
        assert purged.status_code == 200
        payload = purged.json()
        assert (
            payload["namespace"] == "tenant" and purged.headers["x-cache-version"] == payload["cache_version"]
        )
        status, again = await _ask(client, prompt, version=payload["cache_version"])
        assert status != "HIT"
        spent.append(again.usage)

        session = f"e2e-{uuid.uuid4().hex[:12]}"
        for text in ("I like green tea.", "What do I like?"):
            _, reply = await _ask(client, text, session_id=session)
            spent.append(reply.usage)
        listed = await _json(client.get("/sessions", cast_to=object, options={"params": {"limit": 100}}))
        assert any(s["id"] == session and s["total_turns"] == 4 for s in listed["data"])
        got = await _json(client.get(f"/sessions/{session}", cast_to=object))
        assert [m["role"] for m in got["messages"]] == ["user", "assistant", "user", "assistant"]
        assert got["messages"][0]["content"] == "I like green tea."
        with pytest.raises(openai.NotFoundError):
            await other.get(f"/sessions/{session}", cast_to=object)
        with pytest.raises(openai.NotFoundError):
            await other.delete(f"/sessions/{session}", cast_to=object)
        deleted = await _json(client.delete(f"/sessions/{session}", cast_to=object))
        assert deleted["deleted"] is True and deleted["version"] > got["version"]
        with pytest.raises(openai.NotFoundError):
            await client.get(f"/sessions/{session}", cast_to=object)

        after = (await _usage(client))["total"]
    assert after["requests"] - before["requests"] == 5
    assert after["cache_hits"] - before["cache_hits"] == 1
    assert after["input_tokens"] - before["input_tokens"] == sum(u.prompt_tokens for u in spent)
    assert after["output_tokens"] - before["output_tokens"] == sum(u.completion_tokens for u in spent)


async def test_each_new_chat_service_rpc(mesh: Mesh) -> None:
    session = f"e2e-grpc-{uuid.uuid4().hex[:12]}"
    async with sdk(mesh) as client:
        await _ask(client, "Say hi.", session_id=session)
    md = [("authorization", f"Bearer {KEYS['main']}")]
    async with grpc.aio.insecure_channel(mesh.chat_address) as channel:
        chat = chat_pb2_grpc.ChatServiceStub(channel)
        call = chat.PurgeCache(chat_pb2.PurgeCacheRequest(), metadata=md, timeout=30)
        purged = await call
        trailers = {k: str(v) for k, v in await call.trailing_metadata() or ()}
        assert rc.parse_versions(trailers["x-llmesh-cache-version"])["tenant"] == purged.version.version
        listed = await chat.ListSessions(chat_pb2.ChatServiceListSessionsRequest(), metadata=md, timeout=30)
        assert session in [s.session_id for s in listed.sessions]
        got = await chat.GetSession(
            chat_pb2.ChatServiceGetSessionRequest(session_id=session), metadata=md, timeout=30
        )
        assert len(got.messages) == 2
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await chat.GetSession(
                chat_pb2.ChatServiceGetSessionRequest(session_id=session),
                metadata=[("authorization", f"Bearer {KEYS['strict']}")],
                timeout=30,
            )
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        deleted = await chat.DeleteSession(
            chat_pb2.ChatServiceDeleteSessionRequest(session_id=session), metadata=md, timeout=30
        )
        assert deleted.version > got.version
