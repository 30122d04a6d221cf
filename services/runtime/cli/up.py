"""``llmesh up``: every implemented service as a child process on this machine.

Starts Redis too when none answers at ``REDIS_URL`` and ``redis-server`` is
installed. Waits for each service's gRPC health check (a Watch, not polling),
prints a table, writes the state file ``llmesh smoke`` reads, and on Ctrl-C or
SIGTERM stops everything in reverse order, letting each service drain.

The services speak plaintext gRPC on loopback, but admin calls still need a credential:
unless ``LLMESH_POLICY_ADMIN_TOKEN`` is set, a random admin token is written to
``<data_dir>/run/admin-token`` (mode 0600) and given to the policy service; send it as
``authorization: Bearer <token>`` to call ``ReloadRules``. The gateway gets the same token as
its admin token (``LLMESH_GATEWAY_ADMIN_TOKEN``: the admin API, ``llmesh admin``) and as the
token it sends to ``ReloadRules`` (``LLMESH_GATEWAY_POLICY_ADMIN_TOKEN``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.runtime.channels import connect
from services.runtime.cli import catalog, doctor
from services.runtime.cli.catalog import MAX_INSTANCES
from services.runtime.cli.state import clear_state, write_state
from services.runtime.settings import data_dir, redis_url

STOP_GRACE_S = 20.0
GATEWAY_HTTP_PORT = 8000
ADMIN_TOKEN_ENV = "LLMESH_POLICY_ADMIN_TOKEN"
GATEWAY_ADMIN_TOKEN_ENV = "LLMESH_GATEWAY_ADMIN_TOKEN"
GATEWAY_POLICY_ADMIN_TOKEN_ENV = "LLMESH_GATEWAY_POLICY_ADMIN_TOKEN"
# A REDIS_URL host for which `llmesh up` starts redis-server itself when none answers.
LOCAL_REDIS_HOSTS = ("127.0.0.1", "localhost", "::1")


def admin_token_path() -> Path:
    return data_dir() / "run" / "admin-token"


def ensure_admin_token() -> tuple[str, Path | None]:
    """The policy admin token: ``LLMESH_POLICY_ADMIN_TOKEN`` if set (no file), else a new random
    one written to :func:`admin_token_path` with mode 0600."""
    given = os.environ.get(ADMIN_TOKEN_ENV, "")
    if given:
        return given, None
    token = secrets.token_urlsafe(32)
    path = admin_token_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # a file of another mode must not be reused
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(token + "\n")
    return token, path


@dataclass
class Child:
    name: str
    address: str
    proc: asyncio.subprocess.Process
    log_path: Path
    state: str = "starting"


def plan(
    replicas: int,
    only: list[str],
    host: str,
    port_offset: int = 0,
    instances: dict[str, int] | None = None,
) -> list[tuple[str, catalog.ServiceSpec, int]]:
    """(instance name, spec, port) for every process to start, in start order.

    ``replicas`` inference replicas; ``instances`` how many of any other service
    (default 1). Several instances are named ``<service>-1``, ``<service>-2``...
    """
    chosen = [s for s in catalog.SERVICES if not only or s.name in only]
    out: list[tuple[str, catalog.ServiceSpec, int]] = []
    for spec in chosen:
        count = replicas if spec.name == "inference" else (instances or {}).get(spec.name, 1)
        if not 1 <= count <= MAX_INSTANCES:
            raise ValueError(f"{spec.name}: {count} instances (1 to {MAX_INSTANCES})")
        for i in range(count):
            name = spec.name if count == 1 else f"{spec.name}-{i + 1}"
            out.append((name, spec, spec.port + port_offset + 100 * i))
    return out


def child_env(
    spec: catalog.ServiceSpec,
    port: int,
    host: str,
    addresses: dict[str, list[str]],
    admin_token: str = "",
) -> dict[str, str]:
    env = dict(os.environ)
    prefix = spec.env_prefix
    if spec.name == "policy" and admin_token:
        env.setdefault(ADMIN_TOKEN_ENV, admin_token)
    if spec.name == "gateway" and admin_token:
        # The same token opens the gateway's admin API (llmesh admin reads the token file), and
        # the gateway sends it to the policy service's ReloadRules (POST /v1/admin/rulesets/reload).
        env.setdefault(GATEWAY_ADMIN_TOKEN_ENV, admin_token)
        env.setdefault(GATEWAY_POLICY_ADMIN_TOKEN_ENV, admin_token)
    env[f"{prefix}HOST"] = host
    env[f"{prefix}PORT"] = str(port)
    env.setdefault(f"{prefix}METRICS_PORT", str(port + 1000))
    if spec.name == "gateway":
        # The HTTP API moves with the gRPC port, so --port-offset keeps two meshes apart.
        env.setdefault("LLMESH_GATEWAY_HTTP_HOST", host)
        env.setdefault("LLMESH_GATEWAY_HTTP_PORT", str(GATEWAY_HTTP_PORT + port - spec.port))
    env.setdefault("REDIS_URL", redis_url())
    # Upstream addresses (each service reads the ones it needs). Several instances of a
    # service are one comma-separated address (services.runtime.channels balances over
    # them); inference replicas have their own list, routed by the gateway.
    for upstream, addrs in addresses.items():
        if upstream == spec.name:
            continue
        key = f"{prefix}{upstream.upper()}_ADDRESS"
        if upstream == "inference":
            env.setdefault(key, addrs[0])
            env.setdefault(f"{prefix}INFERENCE_ADDRESSES", ",".join(addrs))
        else:
            env.setdefault(key, ",".join(addrs))
    return env


async def ensure_redis(log_dir: Path) -> asyncio.subprocess.Process | None:
    """Starts a loopback redis-server when none answers at REDIS_URL; returns it (or None)."""
    import redis.asyncio as aioredis

    from services.runtime import redis_client

    url = redis_url()
    client = redis_client.connect(url, socket_connect_timeout=1, socket_timeout=1)
    try:
        await client.ping()
        return None
    except (OSError, aioredis.RedisError):
        pass
    finally:
        await client.aclose()
    if redis_client.is_sentinel_url(url):
        raise SystemExit(f"no Redis primary answers through {redis_client.describe(url)}")
    parsed = urlparse(url)
    server = shutil.which("redis-server")
    if parsed.hostname not in LOCAL_REDIS_HOSTS or server is None:
        raise SystemExit(f"Redis does not answer at {url}: start one or set REDIS_URL")
    port = parsed.port or 6379
    proc = await asyncio.create_subprocess_exec(
        *redis_server_argv(port, server),
        stdout=(log_dir / "redis.log").open("ab"),
        stderr=asyncio.subprocess.STDOUT,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        client = redis_client.connect(url, socket_connect_timeout=1)
        try:
            await client.ping()
            return proc
        except (OSError, aioredis.RedisError):
            # redis-server has no readiness signal of its own; it answers within ~0.1 s.
            await asyncio.sleep(0.05)
        finally:
            await client.aclose()
    proc.kill()
    raise SystemExit(f"redis-server did not start on port {port}")


def redis_server_argv(port: int, server: str = "redis-server") -> list[str]:
    """A throwaway loopback Redis: no snapshots, no append-only file."""
    return [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]


async def wait_healthy(address: str, proc: asyncio.subprocess.Process, limit_s: float) -> str:
    """Waits for SERVING on the health Watch stream, or for the process to die."""

    async def watch() -> str:
        async with await connect(address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            call = stub.Watch(health_pb2.HealthCheckRequest(service=""), wait_for_ready=True, timeout=limit_s)
            async for reply in call:
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    call.cancel()
                    return "serving"
        return "not serving"

    watcher = asyncio.ensure_future(watch())
    died = asyncio.ensure_future(proc.wait())
    done, _ = await asyncio.wait({watcher, died}, return_when=asyncio.FIRST_COMPLETED)
    for task in (watcher, died):
        if task not in done:
            task.cancel()
    if died in done:
        return f"exited ({proc.returncode})"
    try:
        return watcher.result()
    except grpc.aio.AioRpcError as exc:
        return f"unhealthy ({exc.code().name})"


async def stop_all(children: list[Child], redis_proc: asyncio.subprocess.Process | None) -> None:
    for child in reversed(children):
        if child.proc.returncode is None:
            child.proc.send_signal(signal.SIGTERM)
    for child in reversed(children):
        try:
            await asyncio.wait_for(child.proc.wait(), STOP_GRACE_S)
        except TimeoutError:
            child.proc.kill()
            await child.proc.wait()
        child.state = "stopped"
    if redis_proc is not None and redis_proc.returncode is None:
        redis_proc.terminate()
        await redis_proc.wait()


def print_table(children: list[Child]) -> None:
    print(f"{'SERVICE':<14} {'ADDRESS':<22} {'PID':<8} {'STATE':<14} LOG")
    for c in children:
        print(f"{c.name:<14} {c.address:<22} {c.proc.pid:<8} {c.state:<14} {c.log_path}")
    sys.stdout.flush()


async def _up(replicas: int, only: list[str], host: str, port_offset: int, instances: dict[str, int]) -> int:
    log_dir = data_dir() / "run" / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    redis_proc = await ensure_redis(log_dir)
    unknown = set(only) - {s.name for s in catalog.SERVICES}
    if unknown:
        print(f"unknown services: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    steps = plan(replicas, only, host, port_offset, instances)
    if not steps:
        print("no services to start", file=sys.stderr)
        return 1
    admin_token, token_file = ensure_admin_token()
    if token_file is not None:
        print(f"admin token (gateway admin API, llmesh admin, policy ReloadRules): {token_file}", flush=True)
    addresses: dict[str, list[str]] = {}
    for _name, spec, port in steps:
        addresses.setdefault(spec.name, []).append(f"{host}:{port}")
    children: list[Child] = []
    code = 0
    try:
        for name, spec, port in steps:
            log_path = log_dir / f"{name}.log"
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                spec.package,
                env=child_env(spec, port, host, addresses, admin_token),
                stdout=log_path.open("ab"),
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
            child = Child(name, f"{host}:{port}", proc, log_path)
            children.append(child)
            print(f"starting {name} on {child.address} ...", flush=True)
            child.state = await wait_healthy(child.address, proc, spec.start_timeout_s)
            if child.state != "serving" or stop.is_set():
                print_table(children)
                print(f"{name} failed to start: {child.state}; see {log_path}", file=sys.stderr)
                return 1
        write_state(
            {"pid": os.getpid(), "services": [{"name": c.name, "address": c.address} for c in children]}
        )
        print_table(children)
        print("llmesh is up; Ctrl-C stops it", flush=True)
        exits = [asyncio.ensure_future(c.proc.wait()) for c in children]
        stopper = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait({stopper, *exits}, return_when=asyncio.FIRST_COMPLETED)
        for task in (stopper, *exits):
            if task not in done:
                task.cancel()
        if stopper not in done:
            dead = [c for c in children if c.proc.returncode is not None]
            for c in dead:
                c.state = f"exited ({c.proc.returncode})"
            print_table(children)
            print("a service exited; stopping the others", file=sys.stderr)
            code = 1
    finally:
        await stop_all(children, redis_proc)
        clear_state()
        if token_file is not None:  # the next `llmesh up` makes a new one
            token_file.unlink(missing_ok=True)
        with contextlib.suppress(Exception):
            print_table(children)
    return code


def run_up(
    replicas: int = 1,
    only: list[str] | None = None,
    host: str = "127.0.0.1",
    port_offset: int = 0,
    instances: dict[str, int] | None = None,
) -> int:
    # `llmesh doctor`'s checks for these services first: a clear message and its fix
    # instead of a service that dies with a log path.
    target = doctor.Target(tuple(only or ()), host, port_offset, replicas, dict(instances or {}))
    if not doctor.preflight(target):
        return 1
    return asyncio.run(_up(replicas, only or [], host, port_offset, instances or {}))
