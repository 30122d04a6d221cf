"""The consistency checker through the gRPC service: two cache replicas on one real Redis,
which is killed and restarted (or flushed) in the middle of every history.

Floors and max-ages travel as request metadata, versions come back in trailing metadata,
exactly as the gateway uses them; workers are spread over both replicas, so a write acked
by one replica must bound what the other serves.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from llmesh.v1 import cache_pb2, common_pb2

from services.runtime import context as rc
from tests.integration.cache import checker
from tests.integration.cache.checker import Failed, History, check
from tests.integration.cache.conftest import Client, Served, key, serve_cache, user
from tests.integration.cache.redis_proc import RedisProcess

log = logging.getLogger(__name__)

HISTORIES = 6
HISTORY_TIMEOUT_S = 120.0
# Refusals the protocol allows (Redis away, a version conflict, a call cut short): recorded, not checked.
REFUSALS = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED, grpc.StatusCode.DEADLINE_EXCEEDED}
)
KEYS = [key([user(f"q{i}")]) for i in range(checker.KEY_COUNT)]


class GrpcTarget:
    """One tenant's calls to one cache replica over gRPC."""

    def __init__(self, served: Served, tenant: str) -> None:
        self.tenant = tenant
        self.stub = served.stub

    async def _call(
        self, method: str, request: Any, floors: dict[str, int] | None = None, max_age_ms: int | None = None
    ) -> tuple[Any, dict[str, int]]:
        """The reply and the versions of its trailing metadata."""
        client = Client(stub=self.stub, tenant=self.tenant)
        try:
            reply = await client.call(
                method,
                request,
                floors=rc.format_versions(floors) if floors else None,
                max_age_ms=max_age_ms,
                deadline_s=5.0,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() in REFUSALS:
                raise Failed(exc.code().name) from exc
            raise
        return reply, rc.parse_versions(client.trailers.get(rc.CACHE_VERSION, ""))

    async def append(self, sid: str, turn: str, expected: int | None) -> int:
        request = cache_pb2.AppendTurnsRequest(session_id=sid, turns=[user(turn)], expected_version=expected)
        reply, _ = await self._call("AppendTurns", request)
        return int(reply.version)

    async def read(self, sid: str, floor: int) -> tuple[int, list[str]]:
        namespace = "session:" + sid
        try:
            reply, _ = await self._call(
                "GetSession",
                cache_pb2.GetSessionRequest(session_id=sid),
                {namespace: floor} if floor else None,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise
            # No turns (yet, or flushed): the version the service read comes back in the trailers.
            trailers = dict(exc.trailing_metadata() or ())
            versions = rc.parse_versions(str(trailers.get(rc.CACHE_VERSION, "")))
            assert namespace in versions, f"NOT_FOUND without the session's version: {trailers}"
            return versions[namespace], []
        return int(reply.version), [m.content for m in reply.messages]

    async def store(self, key_index: int, value: str, derived: dict[str, int]) -> dict[str, int]:
        entry = cache_pb2.CachedResponse(
            choices=[common_pb2.Completion(index=0, text=value, finish_reason=common_pb2.FINISH_REASON_STOP)],
            derived_from=[common_pb2.VersionStamp(namespace=ns, version=v) for ns, v in derived.items()],
            model="smol",
        )
        _, versions = await self._call(
            "StoreResponse", cache_pb2.StoreResponseRequest(key=KEYS[key_index], entry=entry)
        )
        return versions

    async def lookup(
        self, key_index: int, floors: dict[str, int], max_age_ms: int | None
    ) -> tuple[str, str, dict[str, int], int]:
        reply, _ = await self._call(
            "LookupResponse", cache_pb2.LookupResponseRequest(key=KEYS[key_index]), floors, max_age_ms
        )
        status = common_pb2.CacheStatus.Name(reply.status).removeprefix("CACHE_STATUS_")
        if status != "HIT":
            return status, "", {}, 0
        stamps = {s.namespace: s.version for s in reply.entry.derived_from}
        return "HIT", reply.entry.choices[0].text, stamps, int(reply.age_ms)

    async def bump(self, namespace: str) -> int:
        reply, _ = await self._call("Invalidate", cache_pb2.InvalidateRequest(namespace=namespace))
        return int({s.namespace: s.version for s in reply.versions}[namespace])


@pytest.fixture(scope="module")
async def replicas() -> AsyncIterator[tuple[RedisProcess, list[Served]]]:
    proc = RedisProcess()
    proc.start()
    served = [await serve_cache(proc.url, redis_timeout_s=0.5, redis_connect_timeout_s=0.5) for _ in range(2)]
    yield proc, served
    for s in served:
        await s.close()
    proc.close()


async def _history(seed: int, proc: RedisProcess, served: list[Served]) -> History:
    restart = seed % 2 == 1

    async def reset() -> None:
        if restart:
            proc.stop()
            proc.start()
        else:
            await checker.flush_all(proc.url)

    targets = [GrpcTarget(s, f"grpc-checker-{seed}") for s in served]
    return await checker.run_history(targets, seed, reset, "restart" if restart else "flush")  # type: ignore[arg-type]


async def test_histories_over_grpc_across_redis_restarts(replicas: tuple[RedisProcess, list[Served]]) -> None:
    proc, served = replicas
    histories = []
    for seed in range(HISTORIES):
        history = await checker.bounded(_history(seed, proc, served), seed, HISTORY_TIMEOUT_S)
        errors = check(history)
        assert not errors, f"seed {seed}: " + "; ".join(errors[:5])
        histories.append(history)
    counts = checker.tally(histories)
    log.info(
        "checked %d gRPC histories, %d operations: %s",
        len(histories),
        sum(len(h.ops) for h in histories),
        sorted(counts.items()),
    )
    assert counts.get("lookup:HIT", 0) > 0
    assert counts.get("lookup:STALE", 0) + counts.get("lookup:MISS", 0) > 0
    assert sum(1 for h in histories for r in h.resets if r.kind == "restart") == HISTORIES // 2
