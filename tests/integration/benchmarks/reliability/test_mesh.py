"""The harness's process control on a real (small) mesh: Redis of its own and the policy service.

Kill -9, pause, drain and restart must reach the real process, a restart must come back on the same
port, and stopping must leave nothing running.
"""

from __future__ import annotations

import os
import signal

import grpc
import psutil
import redis.asyncio as aioredis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks.reliability.mesh import LocalMesh
from services.runtime.channels import connect


async def _serving(address: str) -> bool:
    async with await connect(address) as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=5.0
            )
        except grpc.aio.AioRpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


async def test_kill_restart_pause_drain_and_stop() -> None:
    mesh = LocalMesh(only=["policy"])
    async with mesh:
        policy = mesh["policy"]
        assert os.environ.get("REDIS_URL") != mesh.redis.url  # the harness's Redis stays its own
        assert policy.env["LLMESH_POLICY_REDIS_URL"] == mesh.redis.url
        assert await _serving(policy.address)
        first_pid = policy.pid
        assert first_pid is not None

        await policy.kill()
        assert not psutil.pid_exists(first_pid) or psutil.Process(first_pid).status() == psutil.STATUS_ZOMBIE
        assert not await _serving(policy.address)

        await policy.start()
        assert policy.pid != first_pid and policy.starts == 2
        assert await _serving(policy.address)  # same address as before

        await policy.pause()
        assert psutil.Process(policy.pid).status() == psutil.STATUS_STOPPED
        await policy.resume()
        assert psutil.Process(policy.pid).status() != psutil.STATUS_STOPPED

        code, _seconds = await policy.drain()
        assert code == 0  # SIGTERM: drained and exited by itself

        await policy.start()
        await mesh.redis.kill(signal.SIGKILL)
        await mesh.redis.start()  # same port, same data directory
        client = aioredis.Redis.from_url(mesh.redis.url)
        try:
            assert await client.ping()
        finally:
            await client.aclose()
        pids = [policy.pid, mesh.redis.proc.pid if mesh.redis.proc else None]
    for pid in pids:
        assert pid is not None
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
