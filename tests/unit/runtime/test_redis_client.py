"""The Redis URL every service reads: plain URLs as redis-py reads them, sentinel URLs, the WAIT
settings, redaction, and the client each builds (nothing here connects)."""

from __future__ import annotations

import asyncio

import pytest
from redis._parsers import _AsyncHiredisParser
from redis.asyncio.connection import BlockingConnectionPool, UnixDomainSocketConnection
from redis.asyncio.sentinel import MasterNotFoundError, SentinelConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError

from services.runtime import redis_client as rc

NO_ENV: dict[str, str] = {}


def test_a_sentinel_url_names_hosts_master_db_and_credentials() -> None:
    target = rc.parse_sentinel_url(
        "redis+sentinel://cache:s%3Acret@sentinel-0:26379,sentinel-1:26380,sentinel-2/llmesh/3", NO_ENV
    )
    assert target.sentinels == (("sentinel-0", 26379), ("sentinel-1", 26380), ("sentinel-2", 26379))
    assert (target.master, target.db, target.username, target.password) == ("llmesh", 3, "cache", "s:cret")
    assert not target.ssl and target.sentinel_password is None and target.min_other_sentinels == 0


def test_a_sentinel_url_defaults_to_db_0_and_reads_ipv6_and_tls() -> None:
    target = rc.parse_sentinel_url("rediss+sentinel://[::1]:26390,[fd00::2]/my%20master", NO_ENV)
    assert target.sentinels == (("::1", 26390), ("fd00::2", 26379))
    assert (target.master, target.db, target.ssl) == ("my master", 0, True)
    assert target.username is None and target.password is None


def test_a_password_without_a_user_is_the_default_user() -> None:
    target = rc.parse_sentinel_url("redis+sentinel://:pw@h1/m", NO_ENV)
    assert (target.username, target.password) == (None, "pw")


def test_sentinel_credentials_come_from_the_query_before_the_environment() -> None:
    env = {"REDIS_SENTINEL_USERNAME": "env-user", "REDIS_SENTINEL_PASSWORD": "env-pw"}
    from_env = rc.parse_sentinel_url("redis+sentinel://h1/m", env)
    assert (from_env.sentinel_username, from_env.sentinel_password) == ("env-user", "env-pw")
    from_url = rc.parse_sentinel_url(
        "redis+sentinel://h1/m?sentinel_username=u&sentinel_password=p%26q&min_other_sentinels=1", env
    )
    assert (from_url.sentinel_username, from_url.sentinel_password) == ("u", "p&q")
    assert from_url.min_other_sentinels == 1
    assert rc.parse_sentinel_url("redis+sentinel://h1/m", NO_ENV).sentinel_password is None


def test_query_settings_are_typed_as_redis_py_types_them() -> None:
    target = rc.parse_sentinel_url(
        "redis+sentinel://h1/m?db=5&socket_timeout=0.5&ssl_ca_certs=/ca.pem&wait_replicas=2", NO_ENV
    )
    assert target.db == 5
    assert target.options == {"socket_timeout": 0.5, "ssl_ca_certs": "/ca.pem"}


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://h1/0", "not a sentinel URL"),
        ("redis+sentinel:///m", "at least one sentinel host"),
        ("redis+sentinel://h1", "names the master"),
        ("redis+sentinel://h1/", "names the master"),
        ("redis+sentinel://h1/m/x", "/<master-name>[/<db>]"),
        ("redis+sentinel://h1/m/1/2", "/<master-name>[/<db>]"),
        ("redis+sentinel://h1,,h2/m", "one is empty"),
        ("redis+sentinel://h1:0/m", "no valid port"),
        ("redis+sentinel://h1:http/m", "no valid port"),
        ("redis+sentinel://:26379/m", "has no host"),
        ("redis+sentinel://h1/m?bogus=1", "unknown Redis URL parameter 'bogus'"),
        ("redis+sentinel://h1/m?socket_timeout=soon", "invalid value for 'socket_timeout'"),
        ("redis+sentinel://h1/m?min_other_sentinels=-1", "whole number"),
    ],
)
def test_malformed_sentinel_urls_are_refused(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        rc.parse_sentinel_url(url, NO_ENV)


def test_an_error_never_shows_the_password() -> None:
    with pytest.raises(ValueError) as info:
        rc.parse_sentinel_url("redis+sentinel://u:topsecret@h1/", NO_ENV)
    assert "topsecret" not in str(info.value) and "u:***@h1" in str(info.value)


def test_redact_hides_every_password() -> None:
    assert rc.redact("redis://u:pw@h:6379/0") == "redis://u:***@h:6379/0"
    assert rc.redact("redis://h:6379/0") == "redis://h:6379/0"
    assert rc.redact("redis://u@h/0") == "redis://u@h/0"
    assert (
        rc.redact("redis+sentinel://u:p@w@h1:1,h2:2/m/1?sentinel_password=x&db=1")
        == "redis+sentinel://u:***@h1:1,h2:2/m/1?sentinel_password=***&db=1"
    )


def test_describe_names_the_master_and_the_sentinels_without_secrets() -> None:
    text = rc.describe("redis+sentinel://u:pw@h1,h2:26380/llmesh/2")
    assert text == "the primary of 'llmesh' (db 2) through the sentinels at h1:26379,h2:26380"
    assert rc.describe("redis://u:pw@h/0") == "redis://u:***@h/0"


def test_sentinel_urls_wait_for_one_replica_by_default_and_plain_urls_for_none() -> None:
    assert rc.durability("redis+sentinel://h/m") == rc.Durability(1, rc.DEFAULT_WAIT_TIMEOUT_MS)
    assert rc.durability("redis://h/0") == rc.Durability(0, rc.DEFAULT_WAIT_TIMEOUT_MS)
    assert rc.durability("redis+sentinel://h/m?wait_replicas=0").replicas == 0
    assert rc.durability("redis://h/0?wait_replicas=2&wait_timeout_ms=50") == rc.Durability(2, 50)


def test_the_wait_ends_before_the_socket_timeout_would() -> None:
    assert rc.durability("redis+sentinel://h/m", socket_timeout_s=0.5).timeout_ms == 250
    assert rc.durability("redis+sentinel://h/m", socket_timeout_s=10).timeout_ms == rc.DEFAULT_WAIT_TIMEOUT_MS
    with pytest.raises(ValueError, match="wait_timeout_ms must be > 0"):
        rc.durability("redis+sentinel://h/m?wait_timeout_ms=0")
    with pytest.raises(ValueError, match="whole number"):
        rc.durability("redis://h/0?wait_replicas=some")


def test_only_writes_are_waited_for() -> None:
    for command in ("EVALSHA", "SET", "XADD", "HSET", "DEL", "EXPIRE", b"INCR", "EXEC"):
        assert rc._needs_wait(command), command
    for command in ("GET", "HGETALL", "XRANGE", "PING", "WAIT", "SCRIPT LOAD", "CLIENT SETNAME", "PUBLISH"):
        assert not rc._needs_wait(command), command


async def test_plain_urls_keep_redis_py_reading_and_drop_the_wait_settings() -> None:
    client = rc.connect("redis://u:pw@h:6380/4?wait_replicas=1&socket_timeout=2", socket_timeout=9)
    try:
        pool = client.connection_pool
        kwargs = pool.connection_kwargs
        assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("h", 6380, 4)
        assert (kwargs["username"], kwargs["password"]) == ("u", "pw")
        assert kwargs["socket_timeout"] == 2.0  # the URL wins, as in redis-py
        assert "wait_replicas" not in kwargs
        assert pool.connection_class is rc.PrimaryConnection
        assert client.durable == rc.Durability(1, rc.DEFAULT_WAIT_TIMEOUT_MS)
    finally:
        await client.aclose()


async def test_tls_and_unix_urls_get_their_connection_classes() -> None:
    tls = rc.connect("rediss://h:6379/0")
    unix = rc.connect("unix:///run/redis.sock?db=2")
    try:
        assert tls.connection_pool.connection_class is rc.PrimarySSLConnection
        assert unix.connection_pool.connection_class is UnixDomainSocketConnection
        assert unix.connection_pool.connection_kwargs["db"] == 2
    finally:
        await tls.aclose()
        await unix.aclose()


async def test_a_blocking_pool_when_asked() -> None:
    client = rc.connect("redis://h/0", pool_timeout_s=0.25, max_connections=7)
    try:
        pool = client.connection_pool
        assert isinstance(pool, BlockingConnectionPool)
        assert (pool.timeout, pool.max_connections) == (0.25, 7)
    finally:
        await client.aclose()


async def test_a_sentinel_client_asks_the_sentinels_with_their_own_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REDIS_SENTINEL_PASSWORD", "sentinel-pw")
    client = rc.connect(
        "rediss+sentinel://svc:pw@s1:26379,s2:26380/llmesh/2?ssl_ca_certs=/ca.pem",
        pool_timeout_s=0.5,
        max_connections=9,
        socket_timeout=1.0,
        decode_responses=True,
    )
    try:
        pool = client.connection_pool
        assert isinstance(pool, SentinelConnectionPool) and isinstance(pool, BlockingConnectionPool)
        assert pool.service_name == "llmesh" and pool.is_master
        assert pool.connection_class is rc.SentinelPrimarySSLConnection
        kwargs = pool.connection_kwargs
        assert (kwargs["db"], kwargs["username"], kwargs["password"]) == (2, "svc", "pw")
        assert kwargs["decode_responses"] is True and kwargs["ssl_ca_certs"] == "/ca.pem"
        assert (pool.timeout, pool.max_connections) == (0.5, 9)
        sentinel = client.sentinel_manager
        assert sentinel is not None
        sentinel_kwargs = [s.connection_pool.connection_kwargs for s in sentinel.sentinels]
        assert [(k["host"], k["port"]) for k in sentinel_kwargs] == [("s1", 26379), ("s2", 26380)]
        for k in sentinel_kwargs:
            assert k["password"] == "sentinel-pw" and k["socket_timeout"] == 1.0
            assert k["ssl_ca_certs"] == "/ca.pem" and k["decode_responses"] is False
            assert k["retry"].get_retries() == 0
        assert client.durable == rc.Durability(1, rc.DEFAULT_WAIT_TIMEOUT_MS)
    finally:
        await client.aclose()
    assert client.sentinel_manager is None


def test_the_blocking_client_reads_sentinel_urls_too() -> None:
    client = rc.connect_sync("redis+sentinel://:pw@s1/llmesh/1", socket_timeout=2)
    try:
        pool = client.connection_pool
        assert pool.connection_kwargs["db"] == 1 and pool.connection_kwargs["password"] == "pw"
        assert pool.service_name == "llmesh"  # type: ignore[attr-defined]
    finally:
        client.close()
    plain = rc.connect_sync("redis://h:1/3?wait_replicas=1")
    try:
        assert plain.connection_pool.connection_kwargs["db"] == 3
    finally:
        plain.close()


class FakeSentinel:
    """A sentinel answering SENTINEL MASTERS after yielding to other tasks."""

    def __init__(self, name: str, master_down: bool) -> None:
        self.name = name
        self.master_down = master_down

    async def sentinel_masters(self) -> dict[str, dict[str, object]]:
        await asyncio.sleep(0)
        state = {"ip": "10.0.0.9", "port": 6379, "is_master": True, "num-other-sentinels": 2}
        return {"llmesh": {**state, "is_sdown": self.master_down, "is_odown": self.master_down}}


async def test_concurrent_lookups_keep_every_sentinel_once() -> None:
    # During a failover the first sentinel reports the old primary down, so every lookup moves
    # another sentinel to the front: concurrent lookups must neither duplicate nor drop one.
    sentinel = rc.RotatingSentinel([("s1", 1), ("s2", 2), ("s3", 3)])
    await sentinel.aclose()
    fakes = [FakeSentinel("s1", True), FakeSentinel("s2", False), FakeSentinel("s3", False)]
    sentinel.sentinels = list(fakes)
    answers = await asyncio.gather(*(sentinel.discover_master("llmesh") for _ in range(20)))
    assert set(answers) == {("10.0.0.9", 6379)}
    assert sorted(s.name for s in sentinel.sentinels) == ["s1", "s2", "s3"]
    assert sentinel.sentinels[0].name in {"s2", "s3"}


async def test_no_sentinel_naming_a_live_primary_is_a_connection_error() -> None:
    sentinel = rc.RotatingSentinel([("s1", 1)])
    await sentinel.aclose()
    sentinel.sentinels = [FakeSentinel("s1", True)]
    with pytest.raises(MasterNotFoundError, match="No master found for 'llmesh'"):
        await sentinel.discover_master("llmesh")
    assert issubclass(MasterNotFoundError, RedisConnectionError)


def test_every_client_parses_replies_with_hiredis() -> None:
    """hiredis (a core dependency) is what redis-py parses with: not its pure-Python parser."""
    for url in ("redis://127.0.0.1:6379/0", "redis+sentinel://sentinel-0:26379/llmesh/0"):
        client = rc.connect(url)
        assert client.connection_pool.connection_kwargs.get("parser_class", _AsyncHiredisParser) is (
            _AsyncHiredisParser
        )
        connection = client.connection_pool.make_connection()  # type: ignore[no-untyped-call]
        assert isinstance(connection._parser, _AsyncHiredisParser), url
