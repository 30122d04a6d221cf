"""Exact misses decided in Redis by the gateway (gateway/direct_lookup.py) over HTTP, on the real
cache service and Redis: the miss takes the lease the cache would have given, the answer is
stored through the cache with it, single flight holds across gateways, and anything the gateway
cannot decide goes to the cache service."""

from __future__ import annotations

import asyncio
import uuid

import redis.asyncio as aioredis

from cache.responses import DIRECT_TERMS_KEY
from gateway.direct_lookup import OUTCOMES, DirectLookups
from tests.fixtures.gateway import RunningGateway, serve_gateway
from tests.integration.gateway.conftest import Tenant, Upstreams, make_settings
from tests.integration.gateway.test_pipeline import _body, _post


def _direct(gw: RunningGateway) -> DirectLookups:
    direct = gw.gateway.pipeline.cache.direct
    assert direct is not None, "direct lookups are on by default"
    return direct


def _count(outcome: str) -> float:
    value: float = OUTCOMES.labels(outcome)._value.get()
    return value


async def _settled(gw: RunningGateway) -> None:
    """Waits for the background stores of the answers already sent."""
    writes = set(gw.gateway.pipeline._writes)
    if writes:
        await asyncio.wait(writes, timeout=10)


async def test_a_miss_decided_by_the_gateway_is_stored_through_the_cache(
    upstreams: Upstreams, tenant: Tenant
) -> None:
    async with serve_gateway(make_settings(upstreams, tenant)) as gw:
        assert _direct(gw).terms is not None, "the cache offers direct lookups on one plain Redis"
        # A new tenant's first lookup creates its versions: that one goes to the cache.
        warm = await _post(gw, tenant, _body(f"warm {uuid.uuid4().hex}"))
        assert warm.headers["x-cache-status"] == "MISS"
        await _settled(gw)
        acquired, calls = _count("acquired"), len(upstreams.fake.calls)
        body = _body(f"direct {uuid.uuid4().hex}")
        first = await _post(gw, tenant, body)
        assert first.headers["x-cache-status"] == "MISS"
        assert _count("acquired") == acquired + 1
        await _settled(gw)
        second = await _post(gw, tenant, body)
        assert second.headers["x-cache-status"] == "HIT", "stored with the lease the gateway took"
        assert second.json()["choices"] == first.json()["choices"]
        assert len(upstreams.fake.calls) == calls + 1
        assert _count("acquired") == acquired + 1  # a hit is the cache's (or the local copy's)


async def test_single_flight_holds_across_two_gateways_deciding_misses(
    upstreams: Upstreams, tenant: Tenant
) -> None:
    """Two gateways, the same new prompt at once: one takes the lease in Redis, the other finds it
    taken and waits at the cache for the leader's answer; the engine generates it once."""
    settings = make_settings(upstreams, tenant)
    async with serve_gateway(settings) as a, serve_gateway(settings) as b:
        await _post(a, tenant, _body(f"warm {uuid.uuid4().hex}"))
        await _settled(a)
        # The second finds the lease taken (busy), or the answer already stored (entry).
        later, calls = _count("busy") + _count("entry"), len(upstreams.fake.calls)
        body = _body(f"together {uuid.uuid4().hex}", max_tokens=64)
        first, second = await asyncio.gather(_post(a, tenant, body), _post(b, tenant, body))
        statuses = sorted([first.headers["x-cache-status"], second.headers["x-cache-status"]])
        assert statuses == ["HIT", "MISS"], statuses
        assert first.json()["choices"] == second.json()["choices"]
        assert len(upstreams.fake.calls) == calls + 1
        assert _count("busy") + _count("entry") >= later + 1


async def test_without_the_caches_terms_lookups_go_to_the_cache(
    upstreams: Upstreams, tenant: Tenant, redis_url: str
) -> None:
    """The terms gone (a cache stopped or moved: they expire): the gateway decides nothing itself
    and every lookup is the cache service's, with the same answers."""
    async with serve_gateway(make_settings(upstreams, tenant)) as gw:
        direct = _direct(gw)
        raw = aioredis.from_url(redis_url)
        try:
            await raw.delete(DIRECT_TERMS_KEY)
        finally:
            await raw.aclose()
        await direct.refresh()
        assert direct.terms is None
        counts = {name: _count(name) for name in ("acquired", "entry", "versions", "busy")}
        body = _body(f"no terms {uuid.uuid4().hex}")
        first = await _post(gw, tenant, body)
        await _settled(gw)
        second = await _post(gw, tenant, body)
        assert [first.headers["x-cache-status"], second.headers["x-cache-status"]] == ["MISS", "HIT"]
        assert {name: _count(name) for name in counts} == counts


async def test_direct_lookups_off(upstreams: Upstreams, tenant: Tenant) -> None:
    settings = make_settings(upstreams, tenant).model_copy(update={"direct_lookups": False})
    async with serve_gateway(settings) as gw:
        assert gw.gateway.direct is None and gw.gateway.pipeline.cache.direct is None
        body = _body(f"off {uuid.uuid4().hex}")
        first = await _post(gw, tenant, body)
        await _settled(gw)
        second = await _post(gw, tenant, body)
        assert [first.headers["x-cache-status"], second.headers["x-cache-status"]] == ["MISS", "HIT"]
