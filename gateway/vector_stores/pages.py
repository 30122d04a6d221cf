"""Cursor pages over a Redis sorted set kept in lexicographic order (every score 0).

OpenAI lists take ``limit``, ``order`` (by creation), and an ``after`` or ``before``
cursor that is an object id. Members here sort by creation time (an id starts with
its creation time in hex, see :func:`new_id`), so a cursor is a position even after
its object was deleted, and a page is one ``ZRANGE BYLEX`` call (more when a filter
drops members).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from redis.exceptions import RedisError

from services.runtime.errors import InvalidArgument, Unavailable

T = TypeVar("T")
Order = Literal["asc", "desc"]


def new_id(prefix: str) -> str:
    """``<prefix><12 hex digits of the creation time in ms><16 random hex digits>``."""
    return f"{prefix}{int(time.time() * 1000):012x}{os.urandom(8).hex()}"


@dataclass(frozen=True, slots=True)
class PageQuery:
    """One page request: at most ``limit`` objects in ``order``, after or before a member."""

    limit: int
    order: Order = "desc"
    after: str | None = None
    before: str | None = None

    def __post_init__(self) -> None:
        if self.after is not None and self.before is not None:
            raise InvalidArgument("after and before cannot be used together")


async def lex_page(
    redis: Any,
    key: str,
    query: PageQuery,
    load: Callable[[Sequence[str]], Awaitable[Sequence[T | None]]],
) -> tuple[list[T], bool]:
    """The page's objects (``load`` turns members into objects, None = skip) and whether more
    follow in the direction of travel."""
    cursor = query.before if query.before is not None else query.after
    # Walking "up" the lexicographic order lists ascending; ``before`` walks the other way.
    up = (query.order == "asc") != (query.before is not None)
    batch = min(max(query.limit + 1, 32), 1000)
    found: list[T] = []
    more = False
    while True:
        if up:
            start = "(" + cursor if cursor is not None else "-"
            members = await redis.zrangebylex(key, start, "+", start=0, num=batch)
        else:
            start = "(" + cursor if cursor is not None else "+"
            members = await redis.zrevrangebylex(key, start, "-", start=0, num=batch)
        names = [m.decode() if isinstance(m, bytes) else str(m) for m in members]
        if not names:
            break
        for item in await load(names):
            if item is not None:
                found.append(item)
        if len(found) > query.limit:
            more = True
            break
        if len(names) < batch:
            break
        cursor = names[-1]
    found = found[: query.limit]
    if query.before is not None:
        found.reverse()
    return found, more


@contextlib.asynccontextmanager
async def redis_errors(what: str) -> AsyncIterator[None]:
    """A Redis failure becomes Unavailable (503 + Retry-After) naming ``what``."""
    try:
        yield
    except (RedisError, OSError) as exc:
        raise Unavailable(
            f"{what} is unavailable now (Redis: {type(exc).__name__})", retry_after_s=1.0
        ) from exc
