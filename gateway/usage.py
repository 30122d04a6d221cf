"""What each tenant used, per API key, model and UTC day: Redis counters the pipeline writes.

Every answered request is one record (:class:`Outcome`), written where the pipeline finishes it
(:mod:`gateway.pipeline`): a generated answer (its input and output tokens), a cache hit (no
tokens: nothing was generated for it), a request the content policy blocked (at the input: no
tokens; at the output: the tokens generated before the block), and embeddings (input tokens). A
request that failed otherwise (a limit, an upstream down, a bad request) is not counted. Each
prompt of a batched ``/v1/completions`` request counts as one request.

Redis (the gateway's ``redis_url``); the hash tag is the tenant, and every key expires
:data:`RETENTION_DAYS` days after its last write::

    llmesh:usage:{<tenant>}:d:<YYYY-MM-DD>   hash  "<counter>|<key id>|<model>" -> count;
                                                   "tokens" -> tokens of the day (all keys, models)
    llmesh:usage:{<tenant>}:m:<YYYY-MM>      hash  "tokens" -> tokens of the month
    llmesh:usage:tenants:<YYYY-MM-DD>        set   tenants with usage that day (the admin view)

Bounded: a day hash has at most 5 x (the tenant's keys) x (the served models) + 1 fields, since
a model is counted only once it resolved to a served one; the tenant sets hold the tenants.
Days are UTC days of the gateway's clock.

Written behind the response, coalesced: a request never waits for its record. Records join a
batch (counters of the same field added together) that one writer task sends as one pipelined
round trip; records arriving while a batch is on the wire form the next one. Idle, a record is
sent at once; under load one round trip carries every record of the last round trip's
duration. This process's own reads (:meth:`RedisUsage.spent_tokens`, :meth:`RedisUsage.rows`,
:meth:`RedisUsage.tenants`) first wait for the records it holds, so a tenant reading its usage
through the gateway that served it sees every request answered before; another gateway sees
them one round trip later. A process that dies loses the batch it held (at most one round
trip's records; SIGTERM writes it: :meth:`RedisUsage.close`).

Redis down never fails a request: a record that cannot be written is logged (one line per
batch) and counted (``llmesh_usage_write_failures_total``), and for :data:`DOWN_BACKOFF_S`
after a failure records are dropped (counted) without trying, so a dead Redis costs one
timeout per window, not one per request.

Prometheus: ``llmesh_usage_requests_total{model,outcome}`` and
``llmesh_usage_tokens_total{model,direction}`` always; the same labelled by tenant as well
(``llmesh_tenant_requests_total``, ``llmesh_tenant_tokens_total``) only with
``LLMESH_GATEWAY_USAGE_METRICS_BY_TENANT=true``: one series per tenant and model, which the
operator must be ready to store.

The read API other code uses (stable): :meth:`RedisUsage.spent_tokens` — the tokens a tenant
spent today or this month (UTC), what its token budget is checked against.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Protocol

import redis.asyncio as aioredis
from prometheus_client import Counter
from redis.exceptions import RedisError

from gateway.auth import Principal
from services.runtime import redis_client
from services.runtime.errors import InvalidArgument

log = logging.getLogger(__name__)

# How long a usage key lives after its last write (a year and a month: this month last year).
RETENTION_DAYS = 400
RETENTION_S = RETENTION_DAYS * 24 * 3600
# The longest range one report reads (one key per day).
MAX_RANGE_DAYS = RETENTION_DAYS
# After a failed write, records are dropped without trying Redis for this long.
DOWN_BACKOFF_S = 5.0
# Redis timeouts of the usage client: a record waits at most about this long.
REDIS_TIMEOUT_S = 0.5

Period = Literal["day", "month"]
# The counters of a record, in the order of the Redis fields' names.
COUNTERS = ("requests", "input_tokens", "output_tokens", "cache_hits", "blocked_requests")
_TOTAL_TOKENS = "tokens"
_SEP = "|"

USAGE_REQUESTS = Counter(
    "llmesh_usage_requests_total",
    "Requests answered, by model and outcome (generated, cache_hit, blocked).",
    ["model", "outcome"],
)
USAGE_TOKENS = Counter(
    "llmesh_usage_tokens_total",
    "Tokens generated for callers, by model and direction (input, output).",
    ["model", "direction"],
)
TENANT_REQUESTS = Counter(
    "llmesh_tenant_requests_total",
    "Requests answered by tenant, model and outcome (only with LLMESH_GATEWAY_USAGE_METRICS_BY_TENANT).",
    ["tenant", "model", "outcome"],
)
TENANT_TOKENS = Counter(
    "llmesh_tenant_tokens_total",
    "Tokens by tenant, model and direction (only with LLMESH_GATEWAY_USAGE_METRICS_BY_TENANT).",
    ["tenant", "model", "direction"],
)
WRITE_FAILURES = Counter(
    "llmesh_usage_write_failures_total",
    "Usage records not written: Redis failed, or was skipped while it was down.",
)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one answered request used."""

    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cache_hit: bool = False
    blocked: bool = False

    @property
    def label(self) -> str:
        return "blocked" if self.blocked else "cache_hit" if self.cache_hit else "generated"

    def increments(self) -> dict[str, int]:
        """The counters this request adds (zeros left out)."""
        values = {
            "requests": 1,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_hits": int(self.cache_hit),
            "blocked_requests": int(self.blocked),
        }
        return {name: n for name, n in values.items() if n}


@dataclass(slots=True)
class Counts:
    """The counters of a usage row."""

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_hits: int = 0
    blocked_requests: int = 0

    def add(self, other: Counts) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(slots=True)
class UsageRow:
    """The usage of one API key of a tenant with one model on one day."""

    day: dt.date
    key_id: str
    model: str
    counts: Counts = field(default_factory=Counts)


class UsageRecorder(Protocol):
    """What the pipeline writes usage through (:class:`RedisUsage`, or :class:`NoUsage`)."""

    async def record(self, principal: Principal, outcome: Outcome) -> None: ...

    async def spent_tokens(self, tenant: str, period: Period) -> int: ...

    async def close(self) -> None: ...


class NoUsage:
    """Counts nothing (a pipeline built without a usage store)."""

    async def record(self, principal: Principal, outcome: Outcome) -> None:
        return None

    async def spent_tokens(self, tenant: str, period: Period) -> int:
        return 0

    async def close(self) -> None:
        return None


def day_key(tenant: str, day: dt.date) -> str:
    return f"llmesh:usage:{{{tenant}}}:d:{day.isoformat()}"


def month_key(tenant: str, day: dt.date) -> str:
    return f"llmesh:usage:{{{tenant}}}:m:{day:%Y-%m}"


def tenants_key(day: dt.date) -> str:
    return f"llmesh:usage:tenants:{day.isoformat()}"


def days(start: dt.date, end: dt.date) -> list[dt.date]:
    """Every day from ``start`` to ``end`` (inclusive); InvalidArgument for a reversed or too
    long range."""
    if end < start:
        raise InvalidArgument(f"end ({end}) is before start ({start})")
    count = (end - start).days + 1
    if count > MAX_RANGE_DAYS:
        raise InvalidArgument(f"a usage report covers at most {MAX_RANGE_DAYS} days, asked for {count}")
    return [start + dt.timedelta(days=i) for i in range(count)]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(slots=True)
class _Batch:
    """Records not yet written: HINCRBY amounts by (key, field) and the (tenants key, tenant)
    members to add; ``done`` is set once the batch was sent (written, or dropped as failed)."""

    records: int = 0
    increments: dict[tuple[str, str], int] = field(default_factory=dict)
    tenants: set[tuple[str, str]] = field(default_factory=set)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, key: str, name: str, n: int) -> None:
        self.increments[(key, name)] = self.increments.get((key, name), 0) + n


class RedisUsage:
    """Usage counters in Redis (see the module doc). ``by_tenant``: also export the Prometheus
    series labelled by tenant; ``clock``: the current UTC time (tests move it)."""

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        by_tenant: bool = False,
        clock: Callable[[], dt.datetime] = _utc_now,
    ) -> None:
        self._redis = client
        self._by_tenant = by_tenant
        self._clock = clock
        self._down_until = 0.0
        self._batch = _Batch()
        self._sending: _Batch | None = None
        self._writer: asyncio.Task[None] | None = None

    @classmethod
    def from_url(cls, url: str, *, by_tenant: bool = False) -> RedisUsage:
        client = redis_client.connect(
            url, socket_connect_timeout=REDIS_TIMEOUT_S, socket_timeout=REDIS_TIMEOUT_S
        )
        return cls(client, by_tenant=by_tenant)

    async def close(self) -> None:
        """Writes the records still held, then closes the connection."""
        await self.flush()
        await self._redis.aclose()

    def today(self) -> dt.date:
        """The current UTC day."""
        return self._clock().astimezone(dt.UTC).date()

    # -- writing --------------------------------------------------------------------------------

    async def record(self, principal: Principal, outcome: Outcome) -> None:
        """Counts one answered request; never raises, never waits for Redis (the record joins the
        next batch; Redis down: logged, counted, dropped)."""
        self._export(principal.tenant, outcome)
        if time.monotonic() < self._down_until:
            WRITE_FAILURES.inc()
            return
        day = self.today()
        tenant = principal.tenant
        # Key ids never hold the separator (hex digests, key_<hex>): keep it that way for others.
        key_id = principal.key_id.replace(_SEP, "_")
        tokens = outcome.input_tokens + outcome.output_tokens
        daily = day_key(tenant, day)
        batch = self._batch
        batch.records += 1
        for name, n in outcome.increments().items():
            batch.add(daily, _SEP.join((name, key_id, outcome.model)), n)
        if tokens:
            batch.add(daily, _TOTAL_TOKENS, tokens)
            batch.add(month_key(tenant, day), _TOTAL_TOKENS, tokens)
        batch.tenants.add((tenants_key(day), tenant))
        if self._writer is None:
            self._writer = asyncio.create_task(self._write(), name="llmesh-usage-writer")

    async def flush(self) -> None:
        """Returns once every record counted before the call is written (or dropped as failed);
        records counted meanwhile are not waited for, so a steady stream of them cannot hold a
        reader (a budget check) back. Batches go out in order: the last one is enough."""
        batch = self._batch if self._batch.records else self._sending
        if batch is None:
            return
        if self._writer is None:
            self._writer = asyncio.create_task(self._write(), name="llmesh-usage-writer")
        await batch.done.wait()

    async def _write(self) -> None:
        """The writer: sends batches in order until none is waiting (one task at a time)."""
        try:
            while self._batch.records:
                batch, self._batch = self._batch, _Batch()
                self._sending = batch
                try:
                    await self._send(batch)
                finally:
                    batch.done.set()
        finally:
            self._sending = None
            self._writer = None

    async def _send(self, batch: _Batch) -> None:
        expiring: set[str] = set()
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for (key, name), n in batch.increments.items():
                    pipe.hincrby(key, name, n)
                    expiring.add(key)
                for key, tenant in batch.tenants:
                    pipe.sadd(key, tenant)
                    expiring.add(key)
                for key in expiring:
                    pipe.expire(key, RETENTION_S)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            WRITE_FAILURES.inc(batch.records)
            self._down_until = time.monotonic() + DOWN_BACKOFF_S
            log.warning(
                "usage not recorded (%d requests of tenants %s): Redis failed (%s); "
                "dropping records for %g s",
                batch.records,
                ", ".join(sorted({tenant for _, tenant in batch.tenants})),
                exc,
                DOWN_BACKOFF_S,
            )

    def _export(self, tenant: str, outcome: Outcome) -> None:
        USAGE_REQUESTS.labels(outcome.model, outcome.label).inc()
        for direction, n in (("input", outcome.input_tokens), ("output", outcome.output_tokens)):
            if n:
                USAGE_TOKENS.labels(outcome.model, direction).inc(n)
        if self._by_tenant:
            TENANT_REQUESTS.labels(tenant, outcome.model, outcome.label).inc()
            for direction, n in (("input", outcome.input_tokens), ("output", outcome.output_tokens)):
                if n:
                    TENANT_TOKENS.labels(tenant, outcome.model, direction).inc(n)

    # -- reading --------------------------------------------------------------------------------

    async def spent_tokens(self, tenant: str, period: Period) -> int:
        """Tokens ``tenant`` spent in the current UTC ``period`` ("day" or "month"): input plus
        output tokens of every generated answer (cache hits cost none) and embedding inputs, all
        API keys and models together. Stable API (token budgets are checked against it).

        Fails open, like the rate limiter: 0 when Redis does not answer (logged), so a Redis
        outage never refuses requests. Counts lag a request by its own record: a request's
        tokens are added when it ends.
        """
        if period not in ("day", "month"):
            raise ValueError(f"period must be 'day' or 'month', got {period!r}")
        await self.flush()
        day = self.today()
        key = day_key(tenant, day) if period == "day" else month_key(tenant, day)
        try:
            value = await self._redis.hget(key, _TOTAL_TOKENS)
        except (RedisError, OSError) as exc:
            log.warning("spent tokens of tenant %s unknown: Redis failed (%s); counting 0", tenant, exc)
            return 0
        return int(value) if value is not None else 0

    async def rows(self, tenant: str, start: dt.date, end: dt.date) -> list[UsageRow]:
        """The tenant's usage rows from ``start`` to ``end`` (UTC days, inclusive), by day, key
        and model. Raises RedisError/OSError when Redis does not answer (a report is not a
        request to keep serving)."""
        span = days(start, end)
        await self.flush()
        async with self._redis.pipeline(transaction=False) as pipe:
            for day in span:
                pipe.hgetall(day_key(tenant, day))
            hashes: list[dict[Any, Any]] = await pipe.execute()
        out: list[UsageRow] = []
        for day, values in zip(span, hashes, strict=True):
            out.extend(_parse_day(day, values))
        return out

    async def tenants(self, start: dt.date, end: dt.date) -> list[str]:
        """Tenants with any usage from ``start`` to ``end``, sorted."""
        span = days(start, end)
        await self.flush()
        async with self._redis.pipeline(transaction=False) as pipe:
            for day in span:
                pipe.smembers(tenants_key(day))
            sets: list[set[Any]] = await pipe.execute()
        return sorted({_text(t) for members in sets for t in members})


def _parse_day(day: dt.date, values: dict[Any, Any]) -> Iterable[UsageRow]:
    rows: dict[tuple[str, str], UsageRow] = {}
    for raw_field, raw_value in values.items():
        name, sep, rest = _text(raw_field).partition(_SEP)
        key_id, sep2, model = rest.partition(_SEP)
        if not sep or not sep2 or name not in COUNTERS:
            continue  # the day's token total, or a field this build does not know
        row = rows.get((key_id, model))
        if row is None:
            row = rows[(key_id, model)] = UsageRow(day, key_id, model)
        setattr(row.counts, name, getattr(row.counts, name) + int(raw_value))
    return sorted(rows.values(), key=lambda r: (r.key_id, r.model))


@dataclass(slots=True)
class Report:
    """A tenant's usage over a range: the total, by day and model, and by API key."""

    tenant: str
    start: dt.date
    end: dt.date
    total: Counts = field(default_factory=Counts)
    by_day_and_model: dict[tuple[dt.date, str], Counts] = field(default_factory=dict)
    by_key: dict[str, Counts] = field(default_factory=dict)


def summarize(tenant: str, start: dt.date, end: dt.date, rows: Sequence[UsageRow]) -> Report:
    report = Report(tenant, start, end)
    for row in rows:
        report.total.add(row.counts)
        report.by_day_and_model.setdefault((row.day, row.model), Counts()).add(row.counts)
        report.by_key.setdefault(row.key_id, Counts()).add(row.counts)
    return report
