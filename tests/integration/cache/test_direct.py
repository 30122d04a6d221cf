"""A miss decided outside the cache (cache.responses.DirectAcquire, the gateway's direct lookups)
against the real cache service and Redis: the lease it takes is the one the cache's own lookup
would have given in that state, and where it cannot decide it writes nothing."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import redis.asyncio as aioredis
from llmesh.v1 import cache_pb2

from cache import convert
from cache.keys import RedisKeys, response_namespace
from cache.responses import DIRECT_TERMS_KEY, DirectAcquire, LeaseTerms
from services.runtime import namespaces
from services.runtime.versions import version_key
from tests.integration.cache.conftest import Client, Served, answer, key, user


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(redis_url)
    yield client
    await client.aclose()


async def _state(raw: aioredis.Redis, names: list[str]) -> list[tuple[object, int]]:
    """Each key's value and whether it expires (what a refused decision must leave alone)."""
    return [(await raw.get(n), -1 if await raw.ttl(n) == -1 else 0) for n in names]


@dataclass
class Miss:
    """One new prompt of a tenant whose versions exist, and the decision on it outside the cache."""

    terms: LeaseTerms
    tenant: str
    pb: cache_pb2.ResponseKey
    keys: RedisKeys
    scope: str
    _acquire: DirectAcquire

    async def decide(self) -> tuple[str, str]:
        return await self._acquire(self.tenant, self.keys, self.scope, self.terms)


async def _miss(client: Client, raw: aioredis.Redis, text: str) -> Miss:
    terms = LeaseTerms.load(await raw.get(DIRECT_TERMS_KEY))
    assert terms is not None, "the cache offers direct lookups on one plain Redis"
    # The tenant's first miss, through the cache, creates its versions.
    warm = key([user("warm")])
    lead = await client.call("LookupResponse", cache_pb2.LookupResponseRequest(key=warm, single_flight=True))
    await client.call("ReleaseLease", cache_pb2.ReleaseLeaseRequest(key=warm, lease_token=lead.lease_token))
    pb = key([user(f"{text} {uuid.uuid4().hex}")])
    domain = convert.key_from_pb(pb)
    keys = RedisKeys.of(client.tenant, domain)
    return Miss(terms, client.tenant, pb, keys, response_namespace(domain), DirectAcquire(raw))


async def test_the_lease_taken_outside_is_the_one_the_cache_gives(
    served: Served, client: Client, raw: aioredis.Redis
) -> None:
    miss = await _miss(client, raw, "direct")
    pb = miss.pb
    outcome, token = await miss.decide()
    assert outcome == "acquired"
    # The cache's lookup now finds the lease taken: a follower, not a second producer.
    follower = await client.call(
        "LookupResponse", cache_pb2.LookupResponseRequest(key=pb, single_flight=True, wait_ms=1)
    )
    assert not follower.lease_token
    await client.call("ReleaseLease", cache_pb2.ReleaseLeaseRequest(key=pb, lease_token=token))
    # Released, the cache's own lookup gives a token carrying the same versions.
    own = await client.call("LookupResponse", cache_pb2.LookupResponseRequest(key=pb, single_flight=True))
    assert own.lease_token.split(".", 1)[1] == token.split(".", 1)[1]
    # And a token taken outside stores through the cache.
    await client.call("ReleaseLease", cache_pb2.ReleaseLeaseRequest(key=pb, lease_token=own.lease_token))
    outcome, token = await miss.decide()
    stored = await client.call(
        "StoreResponse", cache_pb2.StoreResponseRequest(key=pb, entry=answer("hi"), lease_token=token)
    )
    assert stored.stored, stored.detail
    assert (await miss.decide())[0] == "entry"


async def test_what_it_cannot_decide_it_leaves_as_it_was(
    served: Served, client: Client, raw: aioredis.Redis
) -> None:
    miss = await _miss(client, raw, "undecided")
    pb, keys, terms = miss.pb, miss.keys, miss.terms
    tenant_version = version_key(miss.tenant, namespaces.TENANT)
    scope_version = version_key(miss.tenant, miss.scope)
    names = [keys.entry, keys.lease, keys.grant, tenant_version, scope_version]

    # A version the cache's read would extend (less than the read TTL left): 'versions'.
    await raw.expire(scope_version, terms.read_ttl_s - 1)
    before = await _state(raw, names)
    assert (await miss.decide()) == ("versions", "")
    assert await _state(raw, names) == before
    assert await raw.ttl(scope_version) < terms.read_ttl_s
    # A version missing (flushed, expired): 'versions' too; the cache creates it.
    await raw.delete(scope_version)
    assert (await miss.decide()) == ("versions", "")
    assert await raw.exists(scope_version, keys.lease, keys.grant) == 0
    lead = await client.call("LookupResponse", cache_pb2.LookupResponseRequest(key=pb, single_flight=True))
    assert lead.lease_token and await raw.exists(scope_version) == 1
    # The lease held: 'busy', the holder's lease untouched.
    before = await _state(raw, names)
    assert (await miss.decide()) == ("busy", "")
    assert await _state(raw, names) == before
    await client.call("ReleaseLease", cache_pb2.ReleaseLeaseRequest(key=pb, lease_token=lead.lease_token))


def test_terms_that_do_not_parse_are_no_terms() -> None:
    good = LeaseTerms(read_ttl_s=900, lease_ms=30_000, grace_ms=0, max_key_bytes=1024)
    assert LeaseTerms.load(good.dump()) == good
    for raw in (None, b"", b"{", b"[]", b'{"lease_ms": 1}', good.dump().replace("900", '"x"')):
        assert LeaseTerms.load(raw) is None
    assert LeaseTerms.load(good.dump().replace("30000", "0")) is None
