"""Token budgets per tenant and period, enforced at admission.

A tenant's settings may give ``token_budget_per_day`` and ``token_budget_per_month`` (0 = no
budget). At admission (before the rate limits, so a refused request costs nothing) the tokens
the tenant has spent in the current UTC day or calendar month are read from the usage counters
(:class:`SpentTokens`, i.e. :mod:`gateway.usage`); once they reach the budget the request is
refused with 429 ``budget_exceeded``, naming the period and when it ends (``Retry-After``). A request admitted
just under the budget may take it past: the budget stops the next one, as OpenAI's quotas do.
Counters that cannot be read count 0 (the usage store logs it): a Redis outage never refuses
requests, as with the rate limiter.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal, Protocol

from gateway.auth import Principal
from gateway.errors import BudgetExceeded
from gateway.ratelimit import Limiter

Period = Literal["day", "month"]


class SpentTokens(Protocol):
    """The usage counters as budgets read them (:meth:`gateway.usage.RedisUsage.spent_tokens`)."""

    async def spent_tokens(self, tenant: str, period: Period) -> int:
        """Tokens (input + output) ``tenant`` spent in the current UTC day or month; 0 when the
        counters cannot be read."""
        ...


def period_end(period: Period, now: datetime) -> datetime:
    """When the UTC day or calendar month holding ``now`` ends."""
    day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return day + timedelta(days=1)
    first = day.replace(day=1)
    return (
        first.replace(year=first.year + 1, month=1)
        if first.month == 12
        else first.replace(month=first.month + 1)
    )


class BudgetedLimiter:
    """A :class:`~gateway.ratelimit.Limiter` that checks the tenant's token budgets first."""

    def __init__(self, inner: Limiter, spent: SpentTokens) -> None:
        self.inner = inner
        self._spent = spent

    async def check(self, principal: Principal, now: datetime | None = None) -> None:
        """BudgetExceeded when the tenant has spent a budget of the current period."""
        settings = principal.settings
        budgets: list[tuple[Period, int]] = [
            ("day", settings.token_budget_per_day),
            ("month", settings.token_budget_per_month),
        ]
        moment = now or datetime.now(UTC)
        for period, budget in budgets:
            if budget <= 0:
                continue
            spent = await self._spent.spent_tokens(principal.tenant, period)
            if spent >= budget:
                ends = period_end(period, moment)
                raise BudgetExceeded(period, budget, spent, ends, (ends - moment).total_seconds())

    async def admit(self, principal: Principal) -> None:
        await self.check(principal)
        await self.inner.admit(principal)

    async def charge_tokens(self, principal: Principal, tokens: int) -> None:
        await self.inner.charge_tokens(principal, tokens)

    async def close(self) -> None:
        await self.inner.close()
