"""Request-rate leases on a real Redis (gateway/ratelimit.py): a key allowed many requests a
minute pays one Redis call per lease, not per request, and every gateway together still stays
within its bucket."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway import ratelimit
from gateway.auth import Principal
from gateway.config import TenantSettings
from gateway.ratelimit import RedisLimiter
from services.runtime.errors import ResourceExhausted


@pytest.fixture
def tenant() -> Iterator[str]:
    yield f"lease-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def redis(redis_url: str, tenant: str) -> AsyncIterator[Any]:
    client = aioredis.from_url(redis_url, decode_responses=True)
    yield client
    keys = [k async for k in client.scan_iter(match=f"llmesh:rl:{{{tenant}:*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


def _bucket(tenant: str) -> str:
    return f"llmesh:rl:{{{tenant}:k}}:rpm"


def _clocked(redis_url: str) -> tuple[list[float], RedisLimiter]:
    """A limiter whose clock is ``clock[0]``, moved by the test."""
    clock = [0.0]
    return clock, RedisLimiter.from_url(redis_url, clock=lambda: clock[0])


async def _level(redis: Any, tenant: str) -> float:
    return float(await redis.hget(_bucket(tenant), "level"))


async def test_a_busy_key_takes_a_lease_once_and_spends_it_locally(
    redis_url: str, redis: Any, tenant: str
) -> None:
    limiter = RedisLimiter.from_url(redis_url)  # 60,000/min: leases of 100 requests
    principal = Principal(tenant, TenantSettings(requests_per_minute=60_000), "k")
    try:
        started = time.perf_counter()
        await limiter.admit(principal)
        assert await _level(redis, tenant) == 59_900
        stamp = await redis.hget(_bucket(tenant), "ts")
        for _ in range(99):
            await limiter.admit(principal)
        assert await redis.hget(_bucket(tenant), "ts") == stamp  # no call for the other 99
        await limiter.admit(principal)  # the 101st: a new lease
        refilled = (time.perf_counter() - started) * 1000  # 1,000 a second
        assert await _level(redis, tenant) <= 59_800 + refilled + 1
    finally:
        await limiter.close()


async def test_concurrent_requests_share_one_refill(redis_url: str, redis: Any, tenant: str) -> None:
    limiter = RedisLimiter.from_url(redis_url)
    principal = Principal(tenant, TenantSettings(requests_per_minute=60_000), "k")
    try:
        await asyncio.gather(*(limiter.admit(principal) for _ in range(50)))
        assert await _level(redis, tenant) == 59_900  # one lease of 100, not 50
    finally:
        await limiter.close()


async def test_a_lapsed_lease_is_not_spent(redis_url: str, redis: Any, tenant: str) -> None:
    clock, limiter = _clocked(redis_url)
    principal = Principal(tenant, TenantSettings(requests_per_minute=60_000), "k")
    try:
        started = time.perf_counter()
        await limiter.admit(principal)
        clock[0] += ratelimit.LEASE_S  # 99 left, but lapsed: the next request takes a new lease
        await limiter.admit(principal)
        refilled = (time.perf_counter() - started) * 1000  # 1,000 a second
        assert await _level(redis, tenant) <= 59_800 + refilled + 1
    finally:
        await limiter.close()


async def test_two_gateways_together_stay_within_the_bucket(redis_url: str, redis: Any, tenant: str) -> None:
    """1,800/min (leases of 3): two gateways admit in turn until both are refused; they admit no
    more than the bucket held plus what it refilled, and lose at most a lease each."""
    per_minute = 1_800
    gateways = [RedisLimiter.from_url(redis_url), RedisLimiter.from_url(redis_url)]
    principal = Principal(tenant, TenantSettings(requests_per_minute=per_minute), "k")
    admitted = 0
    refused: list[ResourceExhausted] = []
    started = time.monotonic()
    try:
        while len(refused) < 2:
            refused.clear()
            for gateway in gateways:
                try:
                    await gateway.admit(principal)
                    admitted += 1
                except ResourceExhausted as exc:
                    refused.append(exc)
        elapsed = time.monotonic() - started
    finally:
        for gateway in gateways:
            await gateway.close()
    refilled = elapsed * per_minute / 60
    assert admitted <= per_minute + refilled + 1
    assert admitted >= per_minute - 2 * 3
    assert all(exc.retry_after_s and exc.retry_after_s > 0 for exc in refused)
    assert "request rate limit of 1800/min" in str(refused[0])


async def test_a_quiet_key_is_charged_per_request(redis_url: str, redis: Any, tenant: str) -> None:
    """Below 1,200/min a lease would be one request: every request is a call, refused at the limit."""
    limiter = RedisLimiter.from_url(redis_url)
    principal = Principal(tenant, TenantSettings(requests_per_minute=3), "k")
    try:
        for _ in range(3):
            await limiter.admit(principal)
        assert await _level(redis, tenant) < 1
        with pytest.raises(ResourceExhausted):
            await limiter.admit(principal)
    finally:
        await limiter.close()


async def test_a_redis_that_never_answers_holds_busy_requests_once_not_in_turn() -> None:
    """Redis hangs: the request refilling a lease times out and is admitted unenforced; the
    requests that waited for that refill are admitted with it, not one timeout after another."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # reads nothing, answers nothing

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    limiter = RedisLimiter.from_url(f"redis://127.0.0.1:{port}/0")
    principal = Principal("hung", TenantSettings(requests_per_minute=60_000), "k")
    try:
        started = time.perf_counter()
        await limiter.admit(principal)
        alone = time.perf_counter() - started
        started = time.perf_counter()
        await asyncio.gather(*(limiter.admit(principal) for _ in range(8)))
        together = time.perf_counter() - started
    finally:
        await limiter.close()
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()
    assert together < 3 * alone, (alone, together)


def _tokens_bucket(tenant: str) -> str:
    return f"llmesh:rl:{{{tenant}:k}}:tpm"


async def test_a_busy_tokens_limit_is_asked_once_per_lease_and_again_after_a_charge(
    redis_url: str, redis: Any, tenant: str
) -> None:
    """120,000 tokens a minute: one "not in debt" answer serves the requests of the next 0.1 s;
    a charge that puts the bucket in debt is seen by the very next request."""
    clock, limiter = _clocked(redis_url)
    principal = Principal(tenant, TenantSettings(tokens_per_minute=120_000), "k")
    try:
        await limiter.admit(principal)
        stamp = await redis.hget(_tokens_bucket(tenant), "ts")
        assert stamp is not None
        for _ in range(20):
            await limiter.admit(principal)
        assert await redis.hget(_tokens_bucket(tenant), "ts") == stamp  # asked once
        await limiter.charge_tokens(principal, 150_000)  # 30,000 in debt
        with pytest.raises(ResourceExhausted, match="token rate limit of 120000/min"):
            await limiter.admit(principal)
        clock[0] += ratelimit.LEASE_S
        with pytest.raises(ResourceExhausted):
            await limiter.admit(principal)  # a refusal is never reused as an answer
    finally:
        await limiter.close()


async def test_a_lapsed_tokens_answer_is_asked_again(redis_url: str, redis: Any, tenant: str) -> None:
    clock, limiter = _clocked(redis_url)
    principal = Principal(tenant, TenantSettings(tokens_per_minute=120_000), "k")
    try:
        await limiter.admit(principal)
        # Another gateway's charge puts the bucket in debt; this one learns it once its answer lapses.
        await redis.hset(_tokens_bucket(tenant), "level", "-50000")
        await limiter.admit(principal)
        clock[0] += ratelimit.LEASE_S
        with pytest.raises(ResourceExhausted):
            await limiter.admit(principal)
    finally:
        await limiter.close()


async def test_lapsed_leases_of_many_keys_are_dropped(
    redis_url: str, redis: Any, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ratelimit, "HELD_KEYS", 3)
    clock, limiter = _clocked(redis_url)
    limits = TenantSettings(requests_per_minute=60_000, tokens_per_minute=120_000)
    try:
        for i in range(3):
            await limiter.admit(Principal(tenant, limits, f"k{i}"))
        clock[0] += ratelimit.LEASE_S
        await limiter.admit(Principal(tenant, limits, "k3"))
        assert len(limiter._leases) == 1 and len(limiter._solvent) == 1
    finally:
        await limiter.close()
