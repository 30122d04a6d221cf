"""The mesh's surroundings: Redis (answering, or started by ``llmesh up``) and free ports."""

from __future__ import annotations

import errno
import re
import shutil
import socket
import subprocess
from urllib.parse import urlparse

from services.runtime.cli.doctor.report import Result, Status, Target

# XTRIM MINID (the audit log's retention, policy/audit_check.py) needs Redis 6.2.
MIN_REDIS = (6, 2)


def check_redis(_target: Target) -> Result:
    import redis

    from services.runtime import redis_client
    from services.runtime.cli.up import LOCAL_REDIS_HOSTS
    from services.runtime.settings import redis_url

    url = redis_url()
    shown = _redact(url)
    try:
        client = redis_client.connect_sync(url, socket_connect_timeout=1, socket_timeout=2)
    except ValueError as exc:
        return Result(Status.FAIL, f"REDIS_URL is not a Redis URL: {exc}", "fix REDIS_URL")
    try:
        try:
            version = str(client.info("server").get("redis_version", ""))
        except redis.exceptions.NoPermissionError:
            client.ping()  # an ACL user (deploy/redis/users.acl) may not read INFO
            return Result(Status.OK, f"Redis answers at {shown} (this user may not read its version)")
    except (redis.exceptions.AuthenticationError, redis.exceptions.ResponseError) as exc:
        return Result(
            Status.FAIL,
            f"Redis at {shown} refused the connection: {exc}",
            "put the user and password in REDIS_URL (redis://user:password@host:port/db)",
        )
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
        if redis_client.is_sentinel_url(url):
            return Result(
                Status.FAIL,
                f"no Redis primary answers through {redis_client.describe(url)}: {exc}",
                "check the sentinels (SENTINEL masters) and the master name in REDIS_URL",
            )
        parsed = urlparse(url)
        host, port = parsed.hostname or "127.0.0.1", parsed.port or 6379
        server = shutil.which("redis-server")
        if _listening(host, port):
            return Result(
                Status.FAIL,
                f"something listens at {host}:{port} but does not answer as Redis: {exc}",
                f"point REDIS_URL at a Redis, or stop what holds port {port}",
            )
        if host not in LOCAL_REDIS_HOSTS or server is None:
            where = "install redis-server (llmesh up then starts it)" if server is None else "start it"
            return Result(
                Status.FAIL, f"Redis does not answer at {shown}: {exc}", f"{where}, or set REDIS_URL"
            )
        have = _redis_server_version(server)
        if have is not None and _version_tuple(have) < MIN_REDIS:
            return Result(
                Status.FAIL, f"{server} is Redis {have}; llmesh needs {_dotted(MIN_REDIS)}", "upgrade Redis"
            )
        return Result(
            Status.WARN,
            f"nothing answers at {shown}: llmesh up starts {server} (Redis {have or '?'}) on port {port}",
            f"none for llmesh up; a service started another way needs a Redis: redis-server --port {port}",
        )
    finally:
        client.close()
    if version and _version_tuple(version) < MIN_REDIS:
        return Result(
            Status.FAIL,
            f"Redis {version} at {shown}; llmesh needs {_dotted(MIN_REDIS)} or newer",
            "upgrade Redis",
        )
    return Result(Status.OK, f"Redis {version} at {shown}")


def _redact(url: str) -> str:
    from services.runtime.redis_client import redact

    return redact(url)


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _redis_server_version(server: str) -> str | None:
    try:
        out = subprocess.run([server, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"v=(\d+\.\d+(?:\.\d+)?)", out.stdout)
    return match.group(1) if match else None


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def planned_ports(target: Target) -> list[tuple[str, str, int]]:
    """(what, host, port) of every TCP port the processes ``llmesh up`` starts would bind."""
    from services.runtime.cli.up import child_env, plan

    out: list[tuple[str, str, int]] = []
    steps = plan(target.replicas, list(target.only), target.host, target.port_offset, dict(target.instances))
    for name, spec, port in steps:
        env = child_env(spec, port, target.host, {})
        out.append((f"{name} gRPC", target.host, port))
        metrics = int(env.get(f"{spec.env_prefix}METRICS_PORT", "-1"))
        if metrics > 0:
            out.append((f"{name} metrics", target.host, metrics))
        if spec.name == "gateway":
            out.append(
                ("gateway HTTP", env["LLMESH_GATEWAY_HTTP_HOST"], int(env["LLMESH_GATEWAY_HTTP_PORT"]))
            )
    return out


def check_ports(target: Target) -> Result:
    ports = planned_ports(target)
    owners: dict[tuple[str, int], list[str]] = {}
    for what, host, port in ports:
        owners.setdefault((host, port), []).append(what)
    twice = [
        f"{host}:{port} ({' and '.join(whats)})" for (host, port), whats in owners.items() if len(whats) > 1
    ]
    if twice:
        return Result(
            Status.FAIL,
            f"one port for two listeners: {'; '.join(twice)}",
            "unset the *_METRICS_PORT / LLMESH_GATEWAY_HTTP_PORT that pins them: llmesh up gives each "
            "instance its own (gRPC port + 1000)",
        )
    problems = [(what, host, port, why) for what, host, port in ports if (why := bind_problem(host, port))]
    if problems:
        return Result(
            Status.FAIL,
            "; ".join(f"{host}:{port} ({what}) {why}" for what, host, port, why in problems),
            f"stop what listens there (ss -ltnp 'sport = :{problems[0][2]}'), or move every port: "
            f"--port-offset N (now {target.port_offset})",
        )
    return Result(Status.OK, f"{len(ports)} ports free on {target.host} ({_port_span(ports)})")


def bind_problem(host: str, port: int) -> str | None:
    """Why a listener could not bind ``host:port`` now (None: it could)."""
    if not 0 < port < 65536:
        return "is not a port number"
    try:
        family, kind, proto, _name, address = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        return f"cannot be resolved: {exc}"
    with socket.socket(family, kind, proto) as sock:
        # Like the gRPC server: an old connection in TIME_WAIT does not block the port.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return "is taken"
            if exc.errno == errno.EADDRNOTAVAIL:
                return "is not an address of this machine"
            if exc.errno == errno.EACCES:
                return "needs privileges (a port below 1024)"
            return f"cannot be bound: {exc}"
    return None


def _port_span(ports: list[tuple[str, str, int]]) -> str:
    numbers = sorted(p for _w, _h, p in ports)
    return f"{numbers[0]}-{numbers[-1]}" if numbers else "none"
