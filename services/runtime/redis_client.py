"""Every service's Redis client, from one URL: a single Redis, or a primary found through Sentinel.

URLs (``REDIS_URL`` and the services' own ``*_REDIS_URL`` settings):

* ``redis://[user:password@]host[:port][/db]``, ``rediss://...`` (TLS), ``unix:///path?db=N``:
  one Redis, exactly as redis-py reads them;
* ``redis+sentinel://[user:password@]host1[:26379],host2[:26379],.../<master-name>[/<db>]``
  (``rediss+sentinel://`` with TLS to the sentinels and to Redis): the primary of
  ``<master-name>`` as the sentinels name it now. The user and password are those of Redis
  (the ACL user of the service); the sentinels' own are the ``sentinel_username`` /
  ``sentinel_password`` query parameters, else ``REDIS_SENTINEL_USERNAME`` /
  ``REDIS_SENTINEL_PASSWORD`` from the environment, else none. ``min_other_sentinels=N``: ignore
  a sentinel that sees fewer than N others (a partitioned one).

Failover. A client of a sentinel URL asks the sentinels for the primary whenever it opens a
connection. After the primary dies, calls fail with ``redis.exceptions.ConnectionError`` (fast:
connection refused, or the call's own timeout) until a sentinel promotes a replica; the next
connection goes to the new primary. A server that answers but cannot act as the primary, the
old primary demoted to a replica (``READONLY``) or one cut off from its replicas under
``min-replicas-to-write`` (``NOREPLICAS``), raises :class:`PrimaryUnavailable`, a
``ConnectionError``, after dropping the connection, so the next one looks for the primary
again. Every caller therefore meets one kind of error, the one it already treats as "Redis is
unavailable, retry later"; this holds for plain URLs too (a ``redis://`` name that a failover
repoints, such as a Kubernetes Service).

Acknowledged writes survive a failover only if a replica had them before the primary died:
replication is asynchronous. So a client can wait for replicas after each write
(``WAIT``, on the same connection): ``wait_replicas=N`` (query parameter; default 1 for a
sentinel URL, 0 otherwise) and ``wait_timeout_ms`` (default 500, kept under the client's socket
timeout). A write that fewer than N replicas acknowledged in time raises
:class:`NotReplicated` (a ``ConnectionError``: the caller retries, and every write llmesh
retries is idempotent or conditional). Reads skip the wait. The servers complement it with
``min-replicas-to-write 1``: a primary cut off from every replica refuses writes instead of
taking ones a failover would drop.

A Redis Cluster is not addressed here: :func:`cache.backend.connect` opens it
(``cluster=True``) from a ``redis://`` URL of any of its nodes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.asyncio.connection import (
    URL_QUERY_ARGUMENT_PARSERS,
    AbstractConnection,
    BlockingConnectionPool,
    Connection,
    ConnectionPool,
    SSLConnection,
    UnixDomainSocketConnection,
    parse_url,
)
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import (
    MasterNotFoundError,
    Sentinel,
    SentinelConnectionPool,
    SentinelManagedConnection,
)
from redis.backoff import NoBackoff
from redis.commands import READ_COMMANDS
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}  # scheme -> TLS
DEFAULT_SENTINEL_PORT = 26379
DEFAULT_WAIT_TIMEOUT_MS = 500
SENTINEL_USERNAME_ENV = "REDIS_SENTINEL_USERNAME"
SENTINEL_PASSWORD_ENV = "REDIS_SENTINEL_PASSWORD"

# Query parameters this module reads itself (any URL); the rest go to redis-py's connections.
_OWN_PARAMS = {
    "wait_replicas",
    "wait_timeout_ms",
    "sentinel_username",
    "sentinel_password",
    "min_other_sentinels",
}
# Query parameters redis-py reads as strings (the typed ones are URL_QUERY_ARGUMENT_PARSERS).
_STRING_PARAMS = {
    "client_name",
    "ssl_keyfile",
    "ssl_certfile",
    "ssl_cert_reqs",
    "ssl_ca_certs",
    "ssl_ca_path",
    "ssl_ca_data",
    "ssl_password",
}
# TLS settings of the Redis connections that the sentinel connections share.
_SHARED_WITH_SENTINELS = ("ssl_", "socket_")

# Commands after which no WAIT is sent: reads, and commands that change no data.
_NO_WAIT = READ_COMMANDS | {
    "WAIT",
    "PING",
    "ECHO",
    "TIME",
    "INFO",
    "HELLO",
    "AUTH",
    "SELECT",
    "PUBLISH",
    "SPUBLISH",
    "SUBSCRIBE",
    "UNSUBSCRIBE",
    "PSUBSCRIBE",
    "PUNSUBSCRIBE",
    "WATCH",
    "UNWATCH",
    "MULTI",
    "DISCARD",
    "GET",
    "MGET",
    "HGET",
    "HMGET",
    "HGETALL",
    "XRANGE",
    "XREVRANGE",
    "XREAD",
    "XLEN",
}
_NO_WAIT_PREFIXES = ("CLIENT", "SCRIPT", "CONFIG", "COMMAND", "MEMORY", "SENTINEL", "CLUSTER")

_NOREPLICAS = re.compile(r"^NOREPLICAS\b")


class PrimaryUnavailable(RedisConnectionError):
    """The server answered but cannot act as the primary now (demoted: READONLY; cut off from its
    replicas: NOREPLICAS). The connection is dropped; the next one looks for the primary again."""


class NotReplicated(RedisConnectionError):
    """A write the primary applied but fewer replicas than asked acknowledged in time: a failover
    now could lose it, so it is not reported as done."""


@dataclass(frozen=True)
class SentinelTarget:
    """What a ``redis+sentinel://`` URL names (see the module doc)."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    sentinel_username: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)
    ssl: bool = False
    min_other_sentinels: int = 0
    # Further connection settings from the query (typed as redis-py types them).
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Durability:
    """``WAIT`` after each write: ``replicas`` acknowledgements within ``timeout_ms`` (0: none)."""

    replicas: int = 0
    timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS


def is_sentinel_url(url: str) -> bool:
    return url.partition("://")[0].lower() in SENTINEL_SCHEMES


def _split_hosts(hosts: str) -> tuple[tuple[str, int], ...]:
    out: list[tuple[str, int]] = []
    for item in hosts.split(","):
        entry = item.strip()
        if not entry:
            raise ValueError("a sentinel URL lists host[:port] entries separated by commas, one is empty")
        if entry.startswith("["):  # [IPv6]:port
            host, _, rest = entry[1:].partition("]")
            port_text = rest[1:] if rest.startswith(":") else rest
        else:
            host, _, port_text = entry.partition(":")
        if not host:
            raise ValueError(f"sentinel address {entry!r} has no host")
        if port_text:
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                raise ValueError(f"sentinel address {entry!r} has no valid port")
            port = int(port_text)
        else:
            port = DEFAULT_SENTINEL_PORT
        out.append((unquote(host), port))
    return tuple(out)


def _query(query: str) -> dict[str, str]:
    return {name: values[-1] for name, values in parse_qs(query, keep_blank_values=True).items()}


def _typed(name: str, value: str) -> Any:
    parser = URL_QUERY_ARGUMENT_PARSERS.get(name)
    if parser is None:
        if name not in _STRING_PARAMS:
            raise ValueError(f"unknown Redis URL parameter {name!r}")
        return value
    try:
        return parser(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"invalid value for {name!r} in the Redis URL: {value!r}") from exc


def _nonnegative(name: str, value: str) -> int:
    if not value.isdigit():
        raise ValueError(f"{name} must be a whole number >= 0, got {value!r}")
    return int(value)


def parse_sentinel_url(url: str, env: Mapping[str, str] | None = None) -> SentinelTarget:
    """The sentinels, master name, database and credentials a sentinel URL names (ValueError if
    it is malformed); ``env`` (default ``os.environ``) supplies the sentinels' credentials when
    the URL does not."""
    env = os.environ if env is None else env
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SENTINEL_SCHEMES:
        raise ValueError(f"not a sentinel URL (redis+sentinel:// or rediss+sentinel://): {redact(url)}")
    rest, _, query_text = rest.partition("?")
    rest = rest.partition("#")[0]
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if not at:
        hosts = netloc
    username = password = None
    if userinfo:
        user_text, colon, password_text = userinfo.partition(":")
        username = unquote(user_text) or None
        password = unquote(password_text) if colon and password_text else None
    if not hosts:
        raise ValueError(f"a sentinel URL names at least one sentinel host: {redact(url)}")
    sentinels = _split_hosts(hosts)
    parts = [unquote(p) for p in path.split("/")] if path else []
    if not parts or not parts[0]:
        raise ValueError(f"a sentinel URL names the master after the hosts (/<master-name>): {redact(url)}")
    if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise ValueError(f"a sentinel URL's path is /<master-name>[/<db>]: {redact(url)}")
    query = _query(query_text)
    db = int(parts[1]) if len(parts) == 2 else 0
    if "db" in query:
        db = _nonnegative("db", query.pop("db"))
    sentinel_username = query.pop("sentinel_username", None) or env.get(SENTINEL_USERNAME_ENV) or None
    sentinel_password = query.pop("sentinel_password", None) or env.get(SENTINEL_PASSWORD_ENV) or None
    min_other = _nonnegative("min_other_sentinels", query.pop("min_other_sentinels", "0"))
    options = {name: _typed(name, value) for name, value in query.items() if name not in _OWN_PARAMS}
    return SentinelTarget(
        sentinels=sentinels,
        master=parts[0],
        db=db,
        username=username,
        password=password,
        sentinel_username=sentinel_username,
        sentinel_password=sentinel_password,
        ssl=SENTINEL_SCHEMES[scheme.lower()],
        min_other_sentinels=min_other,
        options=options,
    )


def durability(url: str, socket_timeout_s: float | None = None) -> Durability:
    """The ``WAIT`` a client of ``url`` sends after writes (module doc); the timeout stays under
    half the socket timeout, so the wait ends before the read of its answer would."""
    query = _query(urlsplit(url).query) if "?" in url else {}
    default = 1 if is_sentinel_url(url) else 0
    replicas = _nonnegative("wait_replicas", query.get("wait_replicas", str(default)))
    timeout_ms = _nonnegative("wait_timeout_ms", query.get("wait_timeout_ms", str(DEFAULT_WAIT_TIMEOUT_MS)))
    if socket_timeout_s is not None:
        timeout_ms = min(timeout_ms, max(1, int(socket_timeout_s * 500)))
    if replicas and not timeout_ms:
        raise ValueError("wait_timeout_ms must be > 0 (0 would wait forever)")
    return Durability(replicas, timeout_ms)


def _without_own_params(url: str) -> str:
    """``url`` without the query parameters this module reads (redis-py would pass them on)."""
    base, sep, query = url.partition("?")
    if not sep:
        return url
    kept = [p for p in query.split("&") if p and unquote(p.partition("=")[0]) not in _OWN_PARAMS]
    return base + ("?" + "&".join(kept) if kept else "")


def redact(url: str) -> str:
    """``url`` with its passwords (Redis's and the sentinels') replaced by ``***``."""
    base, sep, query = url.partition("?")
    scheme, colon_slashes, rest = base.partition("://")
    if colon_slashes:
        netloc, slash, path = rest.partition("/")
        userinfo, at, hosts = netloc.rpartition("@")
        if at and ":" in userinfo:
            userinfo = userinfo.partition(":")[0] + ":***"
            base = f"{scheme}://{userinfo}@{hosts}{slash}{path}"
    if sep:
        params = []
        for part in query.split("&"):
            name, eq, _ = part.partition("=")
            params.append(f"{name}=***" if eq and "password" in unquote(name) else part)
        query = "&".join(params)
    return base + (sep + query if sep else "")


# -- connections -------------------------------------------------------------------------------


async def _read_as_primary(conn: Connection, read: Any) -> Any:
    try:
        return await read
    except ResponseError as exc:
        if isinstance(exc, ReadOnlyError):
            why = "READONLY, a replica now"
        elif _NOREPLICAS.match(str(exc)):
            why = "NOREPLICAS, no replica follows it"
        else:
            raise
        await conn.disconnect()
        raise PrimaryUnavailable(
            f"Redis at {conn.host}:{conn.port} is not a usable primary ({why}): {exc}"
        ) from exc


class PrimaryConnection(Connection):
    """A TCP connection that turns READONLY and NOREPLICAS answers into :class:`PrimaryUnavailable`."""

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        return await _read_as_primary(self, super().read_response(*args, **kwargs))


class PrimarySSLConnection(PrimaryConnection, SSLConnection):
    """:class:`PrimaryConnection` over TLS."""


class SentinelPrimaryConnection(SentinelManagedConnection, PrimaryConnection):
    """A connection to the primary the sentinels name (looked up at each connect)."""


class SentinelPrimarySSLConnection(SentinelManagedConnection, PrimarySSLConnection):
    """:class:`SentinelPrimaryConnection` over TLS."""


class RotatingSentinel(Sentinel):
    """redis-py's ``Sentinel`` with a lookup safe under concurrent calls.

    redis-py moves the sentinel that answered to the front of its list by index, computed before
    an ``await``: two lookups at once (the rule during a failover, when the first sentinel reports
    the primary down) can leave one sentinel twice in the list and drop another, which is then
    never asked again nor closed. Here the move is by identity, with no ``await`` in between.
    """

    def __init__(self, sentinels: Sequence[tuple[str, int]], **kwargs: Any) -> None:
        super().__init__(sentinels, **kwargs)  # type: ignore[no-untyped-call]
        self.sentinels: list[Any]

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        errors: list[str] = []
        for sentinel in list(self.sentinels):
            try:
                masters: Any = await sentinel.sentinel_masters()
            except (RedisConnectionError, RedisTimeoutError) as exc:
                errors.append(f"{sentinel} - {exc!r}")
                continue
            state = masters.get(service_name)
            if state and self.check_master_state(state, service_name):  # type: ignore[no-untyped-call]
                if sentinel in self.sentinels:
                    self.sentinels.remove(sentinel)
                    self.sentinels.insert(0, sentinel)
                forced = self._force_master_ip
                return (state["ip"] if forced is None else forced), state["port"]
        detail = f" : {', '.join(errors)}" if errors else ""
        raise MasterNotFoundError(f"No master found for {service_name!r}{detail}")


class BlockingSentinelConnectionPool(SentinelConnectionPool, BlockingConnectionPool):  # type: ignore[misc]
    """A sentinel pool that, full, makes callers wait for a connection (bounded by ``timeout``)
    instead of failing, like :class:`redis.asyncio.BlockingConnectionPool`."""


def _needs_wait(command: Any) -> bool:
    name = command.decode() if isinstance(command, bytes) else str(command)
    name = name.upper()
    return name not in _NO_WAIT and not name.startswith(_NO_WAIT_PREFIXES)


async def _wait_replicas(conn: AbstractConnection, durable: Durability) -> None:
    await conn.send_command("WAIT", durable.replicas, durable.timeout_ms)
    acked = int(await conn.read_response())
    if acked < durable.replicas:
        raise NotReplicated(
            f"the write reached {acked} of the {durable.replicas} replicas asked for within "
            f"{durable.timeout_ms} ms; it may be lost if the primary fails now"
        )


class WaitingPipeline(Pipeline):
    """A pipeline that sends ``WAIT`` after its commands when any of them writes."""

    durable = Durability()

    def _writes(self, commands: Any) -> bool:
        return bool(self.durable.replicas) and any(_needs_wait(args[0]) for args, _ in commands)

    async def _execute_transaction(self, connection: Any, commands: Any, raise_on_error: Any) -> Any:
        result = await super()._execute_transaction(connection, commands, raise_on_error)
        if self._writes(commands):
            await _wait_replicas(connection, self.durable)
        return result

    async def _execute_pipeline(self, connection: Any, commands: Any, raise_on_error: bool) -> Any:
        result = await super()._execute_pipeline(connection, commands, raise_on_error)
        if self._writes(commands):
            await _wait_replicas(connection, self.durable)
        return result


class Client(aioredis.Redis):
    """``redis.asyncio.Redis`` plus ``WAIT`` after writes (:class:`Durability`) and, for a
    sentinel URL, the sentinel connections it owns (closed with it)."""

    durable = Durability()
    sentinel_manager: Sentinel | None = None

    async def _send_command_parse_response(
        self, conn: Any, command_name: Any, *args: Any, **options: Any
    ) -> Any:
        response = await super()._send_command_parse_response(  # type: ignore[no-untyped-call]
            conn, command_name, *args, **options
        )
        if self.durable.replicas and _needs_wait(command_name):
            await _wait_replicas(conn, self.durable)
        return response

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Pipeline:
        if not self.durable.replicas:
            return super().pipeline(transaction, shard_hint)
        pipe = WaitingPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
        pipe.durable = self.durable
        return pipe

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        try:
            await super().aclose(close_connection_pool)
        finally:
            sentinel, self.sentinel_manager = self.sentinel_manager, None
            if sentinel is not None:
                await sentinel.aclose()


def _sentinel_kwargs(target: SentinelTarget, options: Mapping[str, Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        name: value for name, value in options.items() if name.startswith(_SHARED_WITH_SENTINELS)
    }
    # One attempt per sentinel: a dead one must not hold up the lookup with retries.
    kwargs["retry"] = Retry(NoBackoff(), 0)
    if target.sentinel_username:
        kwargs["username"] = target.sentinel_username
    if target.sentinel_password:
        kwargs["password"] = target.sentinel_password
    if target.ssl:
        kwargs["ssl"] = True
    return kwargs


def connect(url: str, *, pool_timeout_s: float | None = None, **options: Any) -> Client:
    """A ``redis.asyncio`` client of ``url`` (module doc) with the connection ``options`` the
    caller gives (``socket_timeout``, ``socket_connect_timeout``, ``decode_responses``,
    ``client_name``, ``retry``, ``max_connections``...); the URL's own settings win, as in
    redis-py. ``pool_timeout_s``: a blocking pool (a caller waits that long for a free
    connection instead of failing when ``max_connections`` are busy). Connects on first use."""
    blocking: dict[str, Any] = {} if pool_timeout_s is None else {"timeout": pool_timeout_s}
    if is_sentinel_url(url):
        target = parse_sentinel_url(url)
        kwargs: dict[str, Any] = {**blocking, **options, **target.options}
        sentinel = RotatingSentinel(
            target.sentinels,
            min_other_sentinels=target.min_other_sentinels,
            sentinel_kwargs=_sentinel_kwargs(target, kwargs),
        )
        kwargs.update(db=target.db, username=target.username, password=target.password)
        client: Client = sentinel.master_for(
            target.master,
            redis_class=Client,
            connection_pool_class=(
                SentinelConnectionPool if pool_timeout_s is None else BlockingSentinelConnectionPool
            ),
            connection_class=SentinelPrimarySSLConnection if target.ssl else SentinelPrimaryConnection,
            **kwargs,
        )
        client.sentinel_manager = sentinel
    else:
        kwargs = {**blocking, **options, **parse_url(_without_own_params(url))}
        connection_class = kwargs.get("connection_class", Connection)
        if connection_class is not UnixDomainSocketConnection:
            kwargs["connection_class"] = (
                PrimarySSLConnection if issubclass(connection_class, SSLConnection) else PrimaryConnection
            )
        pool_class: type[ConnectionPool] = (
            ConnectionPool if pool_timeout_s is None else BlockingConnectionPool
        )
        client = Client(connection_pool=pool_class(**kwargs))
        client.auto_close_connection_pool = True  # the client owns its pool
    durable = durability(url, kwargs.get("socket_timeout"))
    client.durable = durable
    return client


class SyncClient(redis.Redis):
    """``redis.Redis`` that closes the sentinel connections it owns with its own."""

    sentinel_manager: Any = None

    def close(self) -> None:
        try:
            super().close()
        finally:
            sentinel, self.sentinel_manager = self.sentinel_manager, None
            if sentinel is not None:
                sentinel.close()


def connect_sync(url: str, **options: Any) -> redis.Redis:
    """A blocking ``redis.Redis`` client of ``url`` (command-line checks; no ``WAIT``)."""
    if not is_sentinel_url(url):
        return redis.Redis.from_url(_without_own_params(url), **options)
    from redis.retry import Retry as SyncRetry
    from redis.sentinel import Sentinel as SyncSentinel

    target = parse_sentinel_url(url)
    merged = {**options, **target.options}
    sentinel_kwargs = _sentinel_kwargs(target, merged)
    sentinel_kwargs["retry"] = SyncRetry(NoBackoff(), 0)
    sentinel = SyncSentinel(  # type: ignore[no-untyped-call]
        target.sentinels, min_other_sentinels=target.min_other_sentinels, sentinel_kwargs=sentinel_kwargs
    )
    client: SyncClient = sentinel.master_for(  # type: ignore[no-untyped-call]
        target.master,
        redis_class=SyncClient,
        db=target.db,
        username=target.username,
        password=target.password,
        **({"ssl": True} if target.ssl else {}),
        **merged,
    )
    client.sentinel_manager = sentinel
    return client


def describe(url: str) -> str:
    """A one-line, password-free description of where ``url`` points (logs, ``llmesh doctor``)."""
    if not is_sentinel_url(url):
        return redact(url)
    target = parse_sentinel_url(url)
    hosts = ",".join(f"{host}:{port}" for host, port in target.sentinels)
    return f"the primary of {quote(target.master)!r} (db {target.db}) through the sentinels at {hosts}"
