"""Usage records (gateway/usage.py): what a request adds, how rows add up, bad ranges, and a Redis
that does not answer (nothing raises; the loss is counted, and a down Redis is not retried per
request)."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from prometheus_client import REGISTRY

from gateway.auth import Principal
from gateway.config import TenantSettings
from gateway.usage import (
    MAX_RANGE_DAYS,
    Counts,
    Outcome,
    RedisUsage,
    UsageRow,
    _parse_day,
    days,
    summarize,
)
from services.runtime.errors import InvalidArgument
from tests.fixtures.ports import free_port

DAY = dt.date(2025, 3, 31)


def _failures() -> float:
    return REGISTRY.get_sample_value("llmesh_usage_write_failures_total") or 0.0


def test_an_outcome_adds_only_what_it_used() -> None:
    assert Outcome("m", input_tokens=5, output_tokens=2).increments() == {
        "requests": 1,
        "input_tokens": 5,
        "output_tokens": 2,
    }
    assert Outcome("m", cache_hit=True).increments() == {"requests": 1, "cache_hits": 1}
    assert Outcome("m", blocked=True).increments() == {"requests": 1, "blocked_requests": 1}
    assert [Outcome("m").label, Outcome("m", cache_hit=True).label, Outcome("m", blocked=True).label] == [
        "generated",
        "cache_hit",
        "blocked",
    ]


def test_a_day_hash_parses_into_rows_by_key_and_model() -> None:
    values = {
        b"requests|k1|org/model|v2": b"3",
        b"input_tokens|k1|org/model|v2": b"30",
        b"requests|k2|m": b"1",
        b"cache_hits|k2|m": b"1",
        b"tokens": b"30",  # the day's total: not a row
        b"future_counter|k1|m": b"9",  # a counter this build does not know
    }
    rows = list(_parse_day(DAY, values))
    assert [(r.key_id, r.model) for r in rows] == [("k1", "org/model|v2"), ("k2", "m")]
    assert rows[0].counts == Counts(requests=3, input_tokens=30)
    assert rows[1].counts == Counts(requests=1, cache_hits=1)


def test_a_report_sums_by_day_and_model_and_by_key() -> None:
    other = DAY + dt.timedelta(days=1)
    rows = [
        UsageRow(DAY, "k1", "m", Counts(requests=2, input_tokens=10, output_tokens=4)),
        UsageRow(DAY, "k2", "m", Counts(requests=1, cache_hits=1)),
        UsageRow(other, "k1", "m", Counts(requests=1, blocked_requests=1)),
    ]
    report = summarize("t", DAY, other, rows)
    assert report.total == Counts(
        requests=4, input_tokens=10, output_tokens=4, cache_hits=1, blocked_requests=1
    )
    assert report.by_day_and_model[(DAY, "m")] == Counts(
        requests=3, input_tokens=10, output_tokens=4, cache_hits=1
    )
    assert report.by_key["k1"] == Counts(requests=3, input_tokens=10, output_tokens=4, blocked_requests=1)


def test_ranges_are_bounded_and_ordered() -> None:
    assert days(DAY, DAY) == [DAY]
    assert len(days(DAY, DAY + dt.timedelta(days=MAX_RANGE_DAYS - 1))) == MAX_RANGE_DAYS
    with pytest.raises(InvalidArgument, match="before start"):
        days(DAY, DAY - dt.timedelta(days=1))
    with pytest.raises(InvalidArgument, match="at most"):
        days(DAY, DAY + dt.timedelta(days=MAX_RANGE_DAYS))


async def test_a_down_redis_never_fails_a_request_and_is_not_retried_per_request() -> None:
    usage = RedisUsage.from_url(f"redis://127.0.0.1:{free_port()}/0")
    principal = Principal("t", TenantSettings(), "k1")
    try:
        before = _failures()
        await usage.record(principal, Outcome("m", input_tokens=3))  # returns before the write
        await usage.flush()
        assert _failures() == before + 1
        # Within the back-off nothing is tried: dropped and counted at once.
        started = time.perf_counter()
        for _ in range(20):
            await usage.record(principal, Outcome("m", input_tokens=3))
        assert time.perf_counter() - started < 0.1
        assert _failures() == before + 21
        # Budgets fail open, as the rate limiter does.
        assert await usage.spent_tokens("t", "month") == 0
        with pytest.raises(ValueError, match="period"):
            await usage.spent_tokens("t", "year")  # type: ignore[arg-type]
    finally:
        await usage.close()
