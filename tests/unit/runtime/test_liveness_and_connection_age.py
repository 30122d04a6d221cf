"""The runtime's liveness signal stays apart from readiness, and servers bound connection age."""

from __future__ import annotations

import asyncio
import os

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.runtime.server import LIVENESS, RunningServer, build_server, server_options
from services.runtime.settings import ServiceSettings

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _status(server: RunningServer, service: str) -> int:
    async with grpc.aio.insecure_channel(server.address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
    return int(reply.status)


async def test_liveness_stays_serving_when_readiness_drops() -> None:
    """Redis down (the service sets NOT_SERVING) must not fail the liveness probe."""
    server = await build_server(ServiceSettings(host="127.0.0.1", port=0), [])
    try:
        assert await _status(server, "") == SERVING
        assert await _status(server, LIVENESS) == SERVING
        await server.set_serving(False)
        assert await _status(server, "") == NOT_SERVING
        assert await _status(server, LIVENESS) == SERVING
    finally:
        await server.stop(0)


async def test_liveness_stays_serving_while_draining() -> None:
    server = await build_server(ServiceSettings(host="127.0.0.1", port=0), [])
    async with grpc.aio.insecure_channel(server.address) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
        assert (await watch.read()).status == SERVING
        # SIGTERM's drain: NOT_SERVING, then calls are still accepted for the quiet period.
        stopping = asyncio.create_task(server.stop(1.0, quiet_s=5.0, max_delay_s=5.0))
        assert (await watch.read()).status == NOT_SERVING
        watch.cancel()
    try:
        assert await _status(server, LIVENESS) == SERVING
    finally:
        stopping.cancel()
        await server.server.stop(0)


def test_connection_age_is_bounded_by_default() -> None:
    options = dict(server_options(ServiceSettings()))
    assert options["grpc.max_connection_age_ms"] == 300_000
    assert options["grpc.max_connection_age_grace_ms"] == 600_000


def test_connection_age_follows_the_settings_and_zero_turns_it_off() -> None:
    options = dict(server_options(ServiceSettings(max_connection_age_s=30, max_connection_age_grace_s=90)))
    assert (options["grpc.max_connection_age_ms"], options["grpc.max_connection_age_grace_ms"]) == (
        30_000,
        90_000,
    )
    options = dict(server_options(ServiceSettings(max_connection_age_s=0)))
    assert "grpc.max_connection_age_ms" not in options


async def test_server_closes_an_old_connection_and_the_client_reconnects() -> None:
    """After max_connection_age the server sends GOAWAY: the client's next call goes over a new
    connection (which re-resolves a dns:/// target)."""
    settings = ServiceSettings(
        host="127.0.0.1", port=0, max_connection_age_s=0.5, max_connection_age_grace_s=1
    )
    server = await build_server(settings, [])
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert channel.get_state() == grpc.ChannelConnectivity.READY
            # The GOAWAY moves the channel out of READY; no sleep stands in for it.
            await asyncio.wait_for(channel.wait_for_state_change(grpc.ChannelConnectivity.READY), 10)
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert reply.status == SERVING
    finally:
        await server.stop(0)


def test_shutdown_seconds_counts_each_grace_phase() -> None:
    settings = ServiceSettings(grace_seconds=20, drain_delay_s=5)
    assert settings.shutdown_seconds() == 25
    assert settings.shutdown_seconds(2) == 45


def test_auto_binds_the_cores_a_cpuset_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica on cores 2-3 (compose cpuset, a static CPU manager's exclusive cores) binds 2-3,
    not 0-1: "auto" follows the affinity's core numbers, not its size."""
    from services.inference import config

    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {2, 3, 6}, raising=False)
    assert config.InferenceSettings().threads_bind() == "2-3,6"
    assert config.core_list([0, 1, 2, 5, 6, 9]) == "0-2,5-6,9"
    assert config.InferenceSettings(omp_threads_bind="0-1").threads_bind() == "0-1"
