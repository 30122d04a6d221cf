"""Usage reports from the counters of :mod:`gateway.usage`."""

from __future__ import annotations

import datetime as dt

from redis.exceptions import RedisError

from gateway.api.usage.protocol import UsageReport, UsageReportList
from gateway.mesh import Gateway
from gateway.usage import RedisUsage, days, summarize
from services.runtime.errors import FailedPrecondition, Unavailable


def _store(gateway: Gateway) -> RedisUsage:
    if gateway.usage is None:
        raise FailedPrecondition("usage is not recorded on this gateway")
    return gateway.usage


def _range(store: RedisUsage, start: dt.date | None, end: dt.date | None) -> tuple[dt.date, dt.date]:
    """``end`` defaults to today (UTC), ``start`` to ``end``."""
    last = end or store.today()
    first = start or last
    days(first, last)  # InvalidArgument for a reversed or too long range
    return first, last


async def tenant_report(
    gateway: Gateway, tenant: str, start: dt.date | None, end: dt.date | None
) -> UsageReport:
    store = _store(gateway)
    first, last = _range(store, start, end)
    try:
        rows = await store.rows(tenant, first, last)
    except (RedisError, OSError) as exc:
        raise Unavailable(f"the usage store (Redis) is unreachable: {exc}", retry_after_s=1.0) from exc
    return UsageReport.of(summarize(tenant, first, last, rows))


async def all_reports(
    gateway: Gateway, start: dt.date | None, end: dt.date | None, tenant: str | None
) -> UsageReportList:
    store = _store(gateway)
    first, last = _range(store, start, end)
    try:
        tenants = [tenant] if tenant else await store.tenants(first, last)
    except (RedisError, OSError) as exc:
        raise Unavailable(f"the usage store (Redis) is unreachable: {exc}", retry_after_s=1.0) from exc
    return UsageReportList(data=[await tenant_report(gateway, t, first, last) for t in tenants])
