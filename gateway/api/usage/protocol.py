"""``GET /v1/usage`` and ``GET /v1/admin/usage`` wire models (llmesh endpoints)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from gateway.usage import Counts, Report


class UsageCounts(BaseModel):
    """Requests answered (cache hits and blocked ones included), the tokens generated for them
    (a cache hit costs none), cache hits, and requests the content policy blocked."""

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_hits: int = 0
    blocked_requests: int = 0

    @classmethod
    def of(cls, counts: Counts) -> UsageCounts:
        return cls(**counts.as_dict())


class ModelDayUsage(UsageCounts):
    date: str
    model: str


class KeyUsage(UsageCounts):
    key_id: str


class UsageReport(BaseModel):
    """One tenant's usage from ``start`` to ``end`` (UTC days, inclusive)."""

    object: Literal["usage.report"] = "usage.report"
    tenant: str
    start: str
    end: str
    total: UsageCounts
    by_model: list[ModelDayUsage] = Field(default_factory=list)
    by_key: list[KeyUsage] = Field(default_factory=list)

    @classmethod
    def of(cls, report: Report) -> UsageReport:
        return cls(
            tenant=report.tenant,
            start=report.start.isoformat(),
            end=report.end.isoformat(),
            total=UsageCounts.of(report.total),
            by_model=[
                ModelDayUsage(date=day.isoformat(), model=model, **counts.as_dict())
                for (day, model), counts in sorted(report.by_day_and_model.items())
            ],
            by_key=[
                KeyUsage(key_id=key, **counts.as_dict()) for key, counts in sorted(report.by_key.items())
            ],
        )


class UsageReportList(BaseModel):
    """The admin view: one report per tenant with any usage in the range."""

    object: Literal["list"] = "list"
    data: list[UsageReport] = Field(default_factory=list)
