"""Usage records are written behind the response, coalesced (gateway/usage.py), on a real Redis:
every record lands, many records take one round trip, and this process's reads wait for them."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from gateway.auth import Principal
from gateway.config import TenantSettings
from gateway.usage import Counts, Outcome, RedisUsage


@pytest.fixture
async def usage(redis_url: str) -> AsyncIterator[RedisUsage]:
    store = RedisUsage.from_url(redis_url)
    yield store
    await store.close()


def _tenant() -> str:
    return f"usage-{uuid.uuid4().hex[:8]}"


async def test_records_made_together_are_one_round_trip_and_all_land(
    usage: RedisUsage, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenant = _tenant()
    sent: list[int] = []
    send = usage._send

    async def counting(batch):  # type: ignore[no-untyped-def]
        sent.append(batch.records)
        await send(batch)

    monkeypatch.setattr(usage, "_send", counting)
    keys = [Principal(tenant, TenantSettings(), f"k{i % 3}") for i in range(60)]
    for i, principal in enumerate(keys):
        await usage.record(principal, Outcome("m", input_tokens=2, output_tokens=1, cache_hit=i % 2 == 0))
    # Reads wait for the records this process holds.
    assert await usage.spent_tokens(tenant, "day") == 60 * 3
    assert sent == [60]
    today = usage.today()
    rows = await usage.rows(tenant, today, today)
    assert [r.key_id for r in rows] == ["k0", "k1", "k2"]
    assert rows[0].counts == Counts(requests=20, input_tokens=40, output_tokens=20, cache_hits=10)
    assert tenant in await usage.tenants(today, today)


async def test_records_made_while_a_batch_is_on_the_wire_form_the_next(usage: RedisUsage) -> None:
    tenant = _tenant()
    principal = Principal(tenant, TenantSettings(), "k")

    async def one(n: int) -> None:
        for _ in range(n):
            await usage.record(principal, Outcome("m", input_tokens=1))
            await asyncio.sleep(0)  # other requests run between records

    await asyncio.gather(*(one(25) for _ in range(8)))
    assert await usage.spent_tokens(tenant, "month") == 200
    today = usage.today()
    [row] = await usage.rows(tenant, today, today)
    assert row.counts == Counts(requests=200, input_tokens=200)


async def test_close_writes_what_is_held(redis_url: str) -> None:
    tenant = _tenant()
    store = RedisUsage.from_url(redis_url)
    await store.record(Principal(tenant, TenantSettings(), "k"), Outcome("m", output_tokens=5))
    await store.close()
    reader = RedisUsage.from_url(redis_url)
    try:
        assert await reader.spent_tokens(tenant, "day") == 5
    finally:
        await reader.close()


async def test_a_read_waits_for_earlier_records_only(
    usage: RedisUsage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A steady stream of records must not hold a budget check back: a read waits for the batch
    holding the records made before it, not for the ones made while it waits."""
    tenant = _tenant()
    principal = Principal(tenant, TenantSettings(), "k")
    release_later = asyncio.Event()
    send = usage._send
    sent: list[int] = []

    async def gated(batch):  # type: ignore[no-untyped-def]
        sent.append(batch.records)
        if len(sent) > 1:
            await release_later.wait()  # every batch after the first stays on the wire
        await send(batch)

    monkeypatch.setattr(usage, "_send", gated)
    await usage.record(principal, Outcome("m", input_tokens=1))
    read = asyncio.ensure_future(usage.spent_tokens(tenant, "day"))
    await asyncio.sleep(0)  # the read starts waiting; then more records arrive
    for _ in range(5):
        await usage.record(principal, Outcome("m", input_tokens=1))
    assert await asyncio.wait_for(read, 10) == 1
    release_later.set()
    await usage.flush()
    assert sent == [1, 5]
    assert await usage.spent_tokens(tenant, "day") == 6
