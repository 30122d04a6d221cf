"""Redis users per service: the shipped ACL files, rendered by the shipped script, in a real Redis.

deploy/redis/users.acl (the shared Redis) and cache-users.acl (the cache's response tier) give
each service a user limited to its own key patterns and channels, and disable the default user;
deploy/redis/acl.sh adds the passwords from the environment. Before these files any client that
reached Redis could rewrite the shared ruleset and the audit log (issue 14).

Key names come from the code that builds them, so a renamed key fails here, not in production.
"""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis
from llmesh.v1 import cache_pb2, common_pb2, policy_pb2, policy_pb2_grpc
from pydantic import SecretStr
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError
from redis.retry import Retry

from cache.backend import Backend
from cache.backend import connect as cache_connect
from cache.domain import ResponseKey
from cache.keys import RedisKeys
from cache.responses import DIRECT_TERMS_KEY, WAKE_CHANNEL, LeaseTerms, ResponseStore
from cache.semantic import LOG_KEY
from cache.session_index import index_key
from cache.sessions import SessionStore
from gateway import usage
from gateway.admin import keys as admin_keys
from gateway.admin import tenants as admin_tenants
from gateway.admin.directory import Directory
from gateway.auth import Principal
from gateway.config import TenantSettings
from gateway.direct_lookup import DirectLookups
from gateway.ratelimit import RedisLimiter
from policy.app import create
from policy.audit import DEFAULT_KEY as AUDIT_KEY
from policy.audit import checkpoints_key, heads_key, stream_key
from policy.config import DEFAULT_RULESET, PolicySettings
from policy.service import TENANTS_KEY
from policy.share import DEFAULT_KEY as RULESET_KEY
from services.embeddings.store import collections_key
from services.runtime import namespaces, redis_client
from services.runtime.errors import ResourceExhausted
from services.runtime.invalidations import VersionWatch
from services.runtime.server import build_server
from services.runtime.versions import version_key
from tests.fixtures.processes import ROOT
from tests.integration.cache.redis_proc import RedisProcess
from tests.integration.policy.conftest import ADMIN_TOKEN, admin_md, tenant_md

REDIS_DIR = ROOT / "deploy" / "redis"
RENDER = REDIS_DIR / "acl.sh"
TENANT = "acme"
TODAY = datetime.date(2025, 1, 31)
RESPONSE = RedisKeys.of(TENANT, ResponseKey(model="m", prompt="p"))
PASSWORDS = {
    "gateway": "gateway-test-password-0001",
    "policy": "policy-test-password-0002",
    "embeddings": "embeddings-test-password-3",
    "cache": "cache-test-password-000004",
}

# The keys each service writes (and therefore may read).
OWN_KEYS: dict[str, list[str]] = {
    "gateway": [
        f"llmesh:rl:{{{TENANT}:key1}}:tokens",  # gateway/ratelimit.py
        usage.day_key(TENANT, TODAY),  # gateway/usage.py
        usage.month_key(TENANT, TODAY),
        usage.tenants_key(TODAY),
        admin_keys.record_key("key_0123456789abcdef"),  # gateway/admin/keys.py
        admin_keys.digest_key("0" * 64),
        admin_keys.tenant_keys(TENANT),
        admin_keys.ALL_KEYS,
        admin_tenants.tenant_key(TENANT),  # gateway/admin/tenants.py
        admin_tenants.ALL_TENANTS,
        RESPONSE.lease,  # gateway/direct_lookup.py: the misses it decides itself
        RESPONSE.grant,
    ],
    "policy": [
        TENANTS_KEY,
        RULESET_KEY,
        stream_key(AUDIT_KEY),
        heads_key(AUDIT_KEY),
        checkpoints_key(AUDIT_KEY),
        version_key(TENANT, namespaces.POLICY),
    ],
    "embeddings": [
        f"llmesh:rag:{{{TENANT}:{namespaces.rag_collection('docs')}}}:meta",
        collections_key(TENANT),
        version_key(TENANT, namespaces.rag_collection("docs")),
    ],
    "cache": [
        version_key(TENANT, namespaces.TENANT),
        version_key(TENANT, namespaces.response_scope("")),
        *SessionStore._keys(TENANT, "s1"),
        index_key(TENANT),  # cache/session_index.py
        RESPONSE.entry,
        RESPONSE.lease,
        RESPONSE.grant,
        LOG_KEY,
        DIRECT_TERMS_KEY,  # cache/app.py
    ],
}
# Keys a service reads but never writes: the cache stamps policy and RAG versions on entries.
READ_ONLY: dict[str, list[str]] = {
    "cache": [version_key(TENANT, namespaces.POLICY), version_key(TENANT, namespaces.rag_collection("docs"))],
    # The gateway's local hits follow every version (services/runtime/invalidations.py); its
    # direct lookups read entries and the cache's terms (gateway/direct_lookup.py).
    "gateway": [
        *(key for keys in OWN_KEYS.values() for key in keys if key.startswith("llmesh:ver:")),
        RESPONSE.entry,
        DIRECT_TERMS_KEY,
    ],
}


def render(rules: Path, out: Path, passwords: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], **{f"REDIS_PASSWORD_{u.upper()}": p for u, p in passwords.items()}}
    return subprocess.run(
        ["sh", str(RENDER), str(rules), str(out)], env=env, capture_output=True, text=True, check=False
    )


@pytest.fixture(scope="module")
def shared_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    acl = tmp_path_factory.mktemp("acl") / "users.acl"
    proc = render(REDIS_DIR / "users.acl", acl, PASSWORDS)
    assert proc.returncode == 0, proc.stderr
    server = RedisProcess(extra_args=["--aclfile", str(acl)])
    server.start()
    try:
        yield server
    finally:
        server.close()


def client(server: RedisProcess, user: str | None, password: str | None = None) -> redis.Redis:
    """A connection as ``user`` (None: anonymous); a refused login fails at once, not after retries."""
    return redis.Redis(
        host="127.0.0.1",
        port=server.port,
        username=user,
        password=None if user is None else password or PASSWORDS[user],
        retry=Retry(NoBackoff(), 0),
    )


def refused_anonymous() -> pytest.RaisesExc[Exception]:
    # NOAUTH on a RESP2 connection; with RESP3 already the HELLO is refused.
    return pytest.raises((ResponseError, AuthenticationError), match=r"(?i)auth")


@pytest.mark.parametrize("user", sorted(PASSWORDS))
def test_each_service_writes_its_own_keys(shared_redis: RedisProcess, user: str) -> None:
    with client(shared_redis, user) as conn:
        for key in OWN_KEYS[user]:
            # Through a script too: the services write through Lua (versions, sessions, limits),
            # reading the server's clock (the version HLC, token buckets).
            script = "redis.call('TIME') return redis.call('SET', KEYS[1], ARGV[1])"
            assert conn.eval(script, 1, key, "v") == b"OK", key
            assert conn.get(key) == b"v", key
            conn.delete(key)
        for key in READ_ONLY.get(user, []):
            conn.get(key)
            with pytest.raises(NoPermissionError):
                conn.set(key, "v")


@pytest.mark.parametrize("user", sorted(PASSWORDS))
def test_each_service_is_refused_the_others_keys(shared_redis: RedisProcess, user: str) -> None:
    readable = set(OWN_KEYS[user]) | set(READ_ONLY.get(user, []))
    others = [key for other, keys in OWN_KEYS.items() if other != user for key in keys]
    with client(shared_redis, user) as conn:
        for key in others:
            if key in readable:
                continue
            with pytest.raises(NoPermissionError):
                conn.get(key)
            with pytest.raises(NoPermissionError):
                conn.set(key, "x")
            with pytest.raises(NoPermissionError):
                conn.eval("return redis.call('DEL', KEYS[1])", 1, key)
        for command in (("FLUSHALL",), ("KEYS", "*"), ("CONFIG", "GET", "*"), ("ACL", "LIST")):
            with pytest.raises(NoPermissionError):
                conn.execute_command(*command)


def test_policy_data_is_out_of_reach_of_every_other_service(shared_redis: RedisProcess) -> None:
    """The issue's case: whoever reaches Redis rewrote the shared ruleset and the audit log."""
    for user in ("gateway", "embeddings", "cache"):
        with client(shared_redis, user) as conn:
            with pytest.raises(NoPermissionError):
                conn.hset(RULESET_KEY, mapping={"yaml": "rules: []", "digest": "x"})
            with pytest.raises(NoPermissionError):
                conn.xadd(stream_key(AUDIT_KEY), {"chain": "forged"})


def test_no_anonymous_or_wrong_password_access(shared_redis: RedisProcess) -> None:
    with client(shared_redis, None) as conn, refused_anonymous():
        conn.get(RULESET_KEY)
    with pytest.raises(AuthenticationError):
        client(shared_redis, "policy", "wrong-password-of-policy").ping()
    with client(shared_redis, "probe", "anything") as conn:
        assert conn.ping() is True
        with pytest.raises(NoPermissionError):
            conn.get(RULESET_KEY)


def test_only_the_cache_uses_the_wake_up_channel(shared_redis: RedisProcess) -> None:
    with client(shared_redis, "cache") as conn:
        conn.publish(WAKE_CHANNEL, "digest")
        pubsub = conn.pubsub()
        pubsub.subscribe(WAKE_CHANNEL)
        pubsub.close()
    with client(shared_redis, "gateway") as conn, pytest.raises(NoPermissionError):
        conn.publish(WAKE_CHANNEL, "digest")


def test_response_tier_admits_only_the_cache(tmp_path: Path) -> None:
    acl = tmp_path / "cache-users.acl"
    proc = render(REDIS_DIR / "cache-users.acl", acl, {"cache": PASSWORDS["cache"]})
    assert proc.returncode == 0, proc.stderr
    server = RedisProcess(config=REDIS_DIR / "redis.conf", extra_args=["--aclfile", str(acl)])
    server.start()
    try:
        keys = RESPONSE
        with client(server, "cache") as conn:
            for key in (keys.entry, keys.lease, keys.grant, LOG_KEY):
                conn.set(key, "v")
            conn.publish(WAKE_CHANNEL, "digest")
            with pytest.raises(NoPermissionError):
                conn.set("other:key", "v")
        for user in ("gateway", "policy", "embeddings"):
            with pytest.raises(AuthenticationError):
                client(server, user).ping()
        with client(server, None) as conn, refused_anonymous():
            conn.get(keys.entry)
    finally:
        server.close()


def test_render_refuses_a_missing_or_weak_password(tmp_path: Path) -> None:
    out = tmp_path / "users.acl"
    missing = {u: p for u, p in PASSWORDS.items() if u != "policy"}
    proc = render(REDIS_DIR / "users.acl", out, missing)
    assert proc.returncode == 1
    assert "REDIS_PASSWORD_POLICY is not set" in proc.stderr
    assert not out.exists()
    proc = render(REDIS_DIR / "users.acl", out, {**PASSWORDS, "policy": "short"})
    assert proc.returncode == 1 and "shorter than 16" in proc.stderr
    proc = render(REDIS_DIR / "users.acl", out, {**PASSWORDS, "policy": "has space in it 12345"})
    assert proc.returncode == 1 and "only letters" in proc.stderr


async def test_the_real_policy_service_runs_as_its_redis_user(
    shared_redis: RedisProcess, tmp_path: Path
) -> None:
    """The policy service with its own user and its default keys: checks write the audit log,
    ReloadRules shares the ruleset and bumps the policy version; nothing is refused."""
    ruleset = tmp_path / "ruleset.yaml"
    shutil.copy(DEFAULT_RULESET, ruleset)
    url = f"redis://policy:{PASSWORDS['policy']}@127.0.0.1:{shared_redis.port}/0"
    settings = PolicySettings(
        port=0,
        redis_url=url,
        ruleset_path=ruleset,
        watch_interval_s=0,
        grace_seconds=2.0,
        admin_token=SecretStr(ADMIN_TOKEN),
    )
    app = await create(settings)
    server = await build_server(settings, [app.binding()])
    await app.start(server)
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = policy_pb2_grpc.PolicyServiceStub(channel)
            message = common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content="hello")
            reply = await stub.CheckInput(
                policy_pb2.CheckInputRequest(messages=[message]), metadata=tenant_md(TENANT)
            )
            assert reply.action == policy_pb2.POLICY_ACTION_ALLOW
            yaml_text = ruleset.read_text(encoding="utf-8")
            reload = await stub.ReloadRules(
                policy_pb2.ReloadRulesRequest(yaml=yaml_text), metadata=admin_md(TENANT)
            )
            assert reload.rule_count > 0
        await app.audit.flush(5)
    finally:
        await server.stop(0)
        await app.close()
    with client(shared_redis, "policy") as conn:
        assert conn.xlen(stream_key(AUDIT_KEY)) >= 1
        assert conn.hget(RULESET_KEY, "digest")
        assert conn.exists(version_key(TENANT, namespaces.POLICY))
        conn.delete(
            stream_key(AUDIT_KEY), heads_key(AUDIT_KEY), RULESET_KEY, version_key(TENANT, namespaces.POLICY)
        )


async def test_the_gateway_rate_limits_as_its_redis_user(shared_redis: RedisProcess) -> None:
    """The limiter fails open on a Redis error, so a refused command would silently lift every
    limit: the second request of a 1/min tenant must still be refused under the gateway's user."""
    url = f"redis://gateway:{PASSWORDS['gateway']}@127.0.0.1:{shared_redis.port}/0"
    limiter = RedisLimiter.from_url(url)
    principal = Principal(TENANT, TenantSettings(requests_per_minute=1), "acl-test")
    try:
        await limiter.admit(principal)
        with pytest.raises(ResourceExhausted, match="request rate limit"):
            await limiter.admit(principal)
    finally:
        await limiter.close()


async def test_the_gateway_counts_usage_as_its_redis_user(shared_redis: RedisProcess) -> None:
    """Usage records drop silently on a Redis error (they must never fail a request), so a refused
    command would lose every count: the records must land, and read back, under the gateway's user."""
    url = f"redis://gateway:{PASSWORDS['gateway']}@127.0.0.1:{shared_redis.port}/0"
    store = usage.RedisUsage.from_url(url)
    principal = Principal(TENANT, TenantSettings(), "acl-test")
    try:
        await store.record(principal, usage.Outcome("m", input_tokens=4, output_tokens=3))
        assert await store.spent_tokens(TENANT, "day") == 7
        assert await store.spent_tokens(TENANT, "month") == 7
        today = store.today()
        rows = await store.rows(TENANT, today, today)
        assert [(r.key_id, r.model, r.counts.requests) for r in rows] == [("acl-test", "m", 1)]
        assert await store.tenants(today, today) == [TENANT]
    finally:
        await store.close()


async def test_the_gateway_manages_keys_and_hears_changes_as_its_redis_user(
    shared_redis: RedisProcess,
) -> None:
    """The admin store and its change channel under the gateway's user: a refused PUBLISH or
    SUBSCRIBE would leave every other gateway with a revoked key still working."""
    url = f"redis://gateway:{PASSWORDS['gateway']}@127.0.0.1:{shared_redis.port}/0"
    writer, reader = Directory(url), Directory(url)
    await writer.start()
    await reader.start()
    try:
        assert writer.fresh and reader.fresh
        await writer.tenants.put(TENANT, {"token_budget_per_day": 10})
        record, _ = await writer.keys.create(TENANT, "acl")
        await reader.wait_for(lambda: reader.cached_key(record.digest) is not None, 5.0)
        rotated, _ = await writer.keys.rotate(record.id)
        revoked = await writer.keys.revoke(record.id)
        await reader.wait_for(lambda: reader.cached_key(rotated.digest) == revoked, 5.0)
        assert reader.cached_tenant(TENANT) == TenantSettings(token_budget_per_day=10)
    finally:
        await writer.close()
        await reader.close()


async def test_the_gateway_watches_versions_read_only_as_its_redis_user(shared_redis: RedisProcess) -> None:
    """Local hits need the pushes of every version change (CLIENT TRACKING on llmesh:ver:*): under
    the gateway's user the watch connects and hears a bump; the user may read versions but never
    write one (only the services that own them can)."""
    url = f"redis://gateway:{PASSWORDS['gateway']}@127.0.0.1:{shared_redis.port}/0"
    watch = VersionWatch(url, retry_s=0.05)
    heard: list[object] = []
    watch.subscribe(heard.append)
    await watch.start()
    try:
        assert await watch.wait_connected(10.0)
        key = version_key(TENANT, namespaces.POLICY)
        client(shared_redis, "policy").set(key, "7")
        assert await watch.barrier()
        assert [key] in heard
        with pytest.raises(NoPermissionError):
            client(shared_redis, "gateway").set(key, "8")
        assert client(shared_redis, "gateway").get(key) == b"7"
    finally:
        await watch.close()
        client(shared_redis, "policy").delete(version_key(TENANT, namespaces.POLICY))


async def test_the_gateway_decides_a_miss_and_the_cache_stores_it_as_their_redis_users(
    shared_redis: RedisProcess,
) -> None:
    """A direct lookup under the gateway's user reads the cache's terms, the entry and the
    versions and takes the lease (a refused command would send every lookup back to the cache,
    or worse, fail); the cache stores with that lease's token under its user."""
    cache_url = f"redis://cache:{PASSWORDS['cache']}@127.0.0.1:{shared_redis.port}/0"
    gateway_url = f"redis://gateway:{PASSWORDS['gateway']}@127.0.0.1:{shared_redis.port}/0"
    pb_key = cache_pb2.ResponseKey(
        model="m", prompt="acl direct", sampling=common_pb2.SamplingParams(temperature=0.0)
    )
    keys = RedisKeys.of(TENANT, ResponseKey(model="m", prompt="acl direct", sampling={"temperature": 0.0}))
    store = ResponseStore(Backend(cache_connect(cache_url)))
    terms = LeaseTerms(read_ttl_s=60, lease_ms=5000, grace_ms=1000, max_key_bytes=100_000)
    await store.publish_terms(terms, 10_000)
    own = client(shared_redis, "cache")
    scope = version_key(TENANT, namespaces.response_scope(""))
    for key in (version_key(TENANT, namespaces.TENANT), scope):
        own.set(key, "5", ex=600)
    direct = DirectLookups(redis_client.connect(gateway_url))
    await direct.start()
    try:
        assert direct.terms == terms
        token = await direct.acquire(TENANT, pb_key)
        assert token.endswith(".5.5"), token
        created = await store.write(keys, payload=b"answer", stamps={}, model="m", ttl_ms=60_000, token=token)
        assert created is not None
        assert await direct.acquire(TENANT, pb_key) == ""  # an entry now: the cache judges it
    finally:
        await direct.close()
        await store._backend.close()
        own.delete(DIRECT_TERMS_KEY, keys.entry, version_key(TENANT, namespaces.TENANT), scope)
