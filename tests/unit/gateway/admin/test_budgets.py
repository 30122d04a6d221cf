"""Token budgets at admission: 429 budget_exceeded naming the period and when it resets."""

from __future__ import annotations

from datetime import UTC, datetime

import grpc
import pytest

from gateway.admin.budgets import BudgetedLimiter, Period, period_end
from gateway.auth import Principal
from gateway.config import TenantSettings
from gateway.errors import BudgetExceeded, to_http
from gateway.ratelimit import NoLimits


class Spent:
    """Usage counters with fixed values (the :class:`~gateway.admin.budgets.SpentTokens` side)."""

    def __init__(self, day: int, month: int) -> None:
        self.values: dict[Period, int] = {"day": day, "month": month}
        self.reads: list[Period] = []

    async def spent_tokens(self, tenant: str, period: Period) -> int:
        self.reads.append(period)
        return self.values[period]


class CountingLimits(NoLimits):
    def __init__(self) -> None:
        self.admitted = 0

    async def admit(self, principal: Principal) -> None:
        self.admitted += 1


def _principal(**settings: int) -> Principal:
    return Principal("t", TenantSettings(**settings), "key_1")  # type: ignore[arg-type]


NOW = datetime(2025, 3, 14, 22, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("period", "now", "end"),
    [
        ("day", NOW, datetime(2025, 3, 15, tzinfo=UTC)),
        ("month", NOW, datetime(2025, 4, 1, tzinfo=UTC)),
        ("month", datetime(2025, 12, 31, 23, 59, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC)),
        ("day", datetime(2024, 2, 28, 12, tzinfo=UTC), datetime(2024, 2, 29, tzinfo=UTC)),
    ],
)
def test_period_end(period: Period, now: datetime, end: datetime) -> None:
    assert period_end(period, now) == end


async def test_no_budget_reads_no_counter_and_admits() -> None:
    spent, inner = Spent(10**9, 10**9), CountingLimits()
    await BudgetedLimiter(inner, spent).admit(_principal())
    assert spent.reads == [] and inner.admitted == 1


async def test_under_the_budget_is_admitted_through_the_rate_limits() -> None:
    spent, inner = Spent(99, 99), CountingLimits()
    principal = _principal(token_budget_per_day=100, token_budget_per_month=100)
    await BudgetedLimiter(inner, spent).admit(principal)
    assert spent.reads == ["day", "month"] and inner.admitted == 1


async def test_a_spent_day_budget_is_429_budget_exceeded_until_midnight_utc() -> None:
    inner = CountingLimits()
    limiter = BudgetedLimiter(inner, Spent(100, 100))
    with pytest.raises(BudgetExceeded) as caught:
        await limiter.check(_principal(token_budget_per_day=100), now=NOW)
    assert caught.value.period == "day"
    assert caught.value.resets_at == datetime(2025, 3, 15, tzinfo=UTC)
    error = to_http(caught.value, "rid")
    assert error.status == 429 and error.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    body = error.body["error"]
    assert isinstance(body, dict)
    assert body["code"] == "budget_exceeded" and body["type"] == "insufficient_quota"
    assert "per day (100 tokens)" in body["message"] and "2025-03-15T00:00:00Z" in body["message"]
    assert error.headers["retry-after"] == str(2 * 3600)
    # The refused request never reached the rate limits.
    assert inner.admitted == 0


async def test_a_spent_month_budget_names_the_month() -> None:
    limiter = BudgetedLimiter(CountingLimits(), Spent(5, 1000))
    with pytest.raises(BudgetExceeded) as caught:
        await limiter.check(_principal(token_budget_per_day=10, token_budget_per_month=1000), now=NOW)
    assert caught.value.period == "month"
    assert "per month" in caught.value.message and "2025-04-01T00:00:00Z" in caught.value.message
