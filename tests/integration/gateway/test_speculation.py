"""Generation started beside the cache lookup (gateway/speculation.py), through a gateway
without a policy service, the real cache service on real Redis and a fake replica of its own
(its calls and cancels counted): a miss streams the speculative generation, a hit cancels it, a
single-flight follower stops it at its first token (the engine does not generate the leader's
answer twice). Through a gateway with the real policy service: the generation starts beside a
lookup still out once the input check passed, a blocked input reaches no engine, and a redacted
one reaches it redacted only. With ``generate_before_input_check`` (off by default) the generation
starts while the check is still out, and a block or a redaction stops it before anything of it
is read."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
import pytest_asyncio

from gateway.auth import hash_key
from gateway.config import GatewaySettings, TenantSettings
from gateway.speculation import OUTCOMES
from tests.fixtures.fake_inference import MODEL, FakeInference, start_fake
from tests.fixtures.gateway import RunningGateway, serve_gateway
from tests.integration.gateway.conftest import Tenant, Upstreams


@pytest_asyncio.fixture(loop_scope="session")
async def replica() -> AsyncIterator[tuple[FakeInference, str]]:
    fake = FakeInference("speculated")
    server = await start_fake(fake)
    yield fake, server.address
    await server.stop(0)


def _settings(
    up: Upstreams, address: str, tenant: Tenant, *, policy: bool = False, before_check: bool = False
) -> GatewaySettings:
    return GatewaySettings(
        generate_before_input_check=before_check,
        inference_addresses=[address],
        cache_address=up.cache,
        policy_address=up.policy if policy else "",
        # Every hit asks the cache service (a local hit never reaches the speculation).
        local_hits=False,
        api_keys={hash_key(tenant.key): tenant.name},
        tenants={tenant.name: TenantSettings()},
    )


def _counted(outcome: str) -> float:
    return float(OUTCOMES.labels(outcome)._value.get())


async def _stream(gw: RunningGateway, tenant: Tenant, text: str) -> tuple[str, str]:
    """The streamed answer's text and its X-Cache-Status."""
    async with openai.AsyncOpenAI(base_url=gw.base_url, api_key=tenant.key, max_retries=0) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": text}], temperature=0, stream=True
        )
        chunks: Any = raw.parse()
        answer = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
        return answer, raw.headers["x-cache-status"]


async def test_a_miss_streams_the_speculative_generation_and_a_hit_cancels_it(
    upstreams: Upstreams, replica: tuple[FakeInference, str], tenant: Tenant
) -> None:
    fake, address = replica
    text = f"speculate on me {uuid.uuid4().hex}"
    async with serve_gateway(_settings(upstreams, address, tenant)) as gw:
        assert gw.gateway.pipeline.speculation.open()
        hits, used = _counted("hit"), _counted("used")
        answer, status = await _stream(gw, tenant, text)
        assert (answer, status) == (f"echo: {text}", "MISS")
        assert len(fake.calls) == 1 and fake.cancelled == 0  # the one generation, streamed
        # Not moderated: the replica's own stream interval (every step, by default).
        assert fake.stream_intervals[-1] == 0
        # The hit's speculative stream is held after its first word, so its cancel is seen.
        fake.hold = asyncio.Event()
        try:
            answer, status = await _stream(gw, tenant, text)
            assert (answer, status) == (f"echo: {text}", "HIT")
            await asyncio.wait_for(fake.cancel_seen.wait(), 10)
            assert len(fake.calls) == 2 and fake.cancelled == 1
            assert _counted("hit") == hits + 1 and _counted("used") == used + 1
        finally:
            fake.hold.set()
            fake.hold = None


async def test_a_single_flight_follower_stops_its_generation_at_the_first_token(
    upstreams: Upstreams, replica: tuple[FakeInference, str], tenant: Tenant
) -> None:
    fake, address = replica
    hold = fake.hold = asyncio.Event()  # every stream stops after its first word until set
    fake.cancel_seen.clear()
    text = f"one producer {uuid.uuid4().hex}"
    async with serve_gateway(_settings(upstreams, address, tenant)) as gw:
        leader = asyncio.ensure_future(_stream(gw, tenant, text))
        follower: asyncio.Future[tuple[str, str]] | None = None
        try:
            await asyncio.wait_for(fake.called.wait(), 10)
            calls, cancelled, late = len(fake.calls), fake.cancelled, _counted("late")
            follower = asyncio.ensure_future(_stream(gw, tenant, text))
            # The follower's lookup waits on the leader's lease; its speculation got a first
            # word meanwhile and was stopped there.
            await asyncio.wait_for(fake.cancel_seen.wait(), 10)
            assert len(fake.calls) == calls + 1 and fake.cancelled == cancelled + 1
            assert not follower.done()
            hold.set()
            (lead, lead_status), (follow, follow_status) = await asyncio.gather(leader, follower)
            assert (lead_status, follow_status) == ("MISS", "HIT")
            assert lead == follow == f"echo: {text}"
            assert len(fake.calls) == calls + 1  # the follower generated nothing more
            assert _counted("late") == late + 1
        finally:
            hold.set()
            fake.hold = None
            # A failed assertion leaves no client waiting on the gateway as it stops.
            for request in (leader, follower):
                if request is not None:
                    request.cancel()
            await asyncio.gather(leader, *([follower] if follower else []), return_exceptions=True)


async def test_no_speculation_while_lookups_hit(
    upstreams: Upstreams, replica: tuple[FakeInference, str], tenant: Tenant
) -> None:
    fake, address = replica
    text = f"no speculation {uuid.uuid4().hex}"
    async with serve_gateway(_settings(upstreams, address, tenant)) as gw:
        await _stream(gw, tenant, text)
        gate = gw.gateway.pipeline.speculation
        for _ in range(20):
            gate.record(missed=False)  # recent lookups hit: speculating would only cost
        assert not gate.open()
        calls = len(fake.calls)
        assert await _stream(gw, tenant, text) == (f"echo: {text}", "HIT")
        assert len(fake.calls) == calls
        for _ in range(40):
            gate.record(missed=True)
        assert gate.open()


def _hold_lookups(gw: RunningGateway) -> tuple[asyncio.Event, asyncio.Event]:
    """Every cache lookup of ``gw`` answers only once the first returned event is set; the
    second is set when a lookup's answer came back from the cache service."""
    stage = gw.gateway.pipeline.cache
    lookup = stage.lookup
    answer, looked = asyncio.Event(), asyncio.Event()

    async def held(key: Any, before_remote: Any = None) -> Any:
        found = await lookup(key, before_remote=before_remote)
        looked.set()
        await answer.wait()
        return found

    stage.lookup = held  # type: ignore[method-assign]
    return answer, looked


async def test_with_a_policy_service_the_generation_starts_once_the_check_passed(
    upstreams: Upstreams, replica: tuple[FakeInference, str], tenant: Tenant
) -> None:
    fake, address = replica
    async with serve_gateway(_settings(upstreams, address, tenant, policy=True)) as gw:
        answer, looked = _hold_lookups(gw)
        used = _counted("used")
        # A blocked input: no engine sees it, though its lookup went out beside the check.
        calls = len(fake.calls)
        blocked = asyncio.ensure_future(
            _stream(gw, tenant, f"how to build a pipe bomb at home {uuid.uuid4().hex}")
        )
        request: asyncio.Future[tuple[str, str]] | None = None
        try:
            await asyncio.wait_for(looked.wait(), 10)
            answer.set()
            with pytest.raises(openai.BadRequestError):
                await blocked
            assert len(fake.calls) == calls
            # An input that passed: its generation starts while the lookup is still held.
            answer.clear()
            fake.called.clear()
            text = f"checked then speculated {uuid.uuid4().hex}"
            request = asyncio.ensure_future(_stream(gw, tenant, text))
            await asyncio.wait_for(fake.called.wait(), 10)
            assert not request.done() and fake.calls[-1].messages[-1].content == text
            answer.set()
            assert await request == (f"echo: {text}", "MISS")
            assert _counted("used") == used + 1 and len(fake.calls) == calls + 1
            # Moderated: two engine steps per message once the first word is out.
            assert fake.stream_intervals[-1] == 2
        finally:
            answer.set()
            for pending in (blocked, request):
                if pending is not None:
                    pending.cancel()
            await asyncio.gather(blocked, *([request] if request else []), return_exceptions=True)
        # A redacted input: the engine gets the redacted messages only (a lookup of those, with the
        # generation beside it).
        secret = f"mail jane.{uuid.uuid4().hex[:8]}@example.com about my boots"
        await _stream(gw, tenant, secret)
        sent = fake.calls[-1].messages[-1].content
        assert len(fake.calls) == calls + 2 and "@example.com" not in sent and "<EMAIL_1>" in sent
        assert _counted("used") == used + 2


def _hold_checks(gw: RunningGateway) -> asyncio.Event:
    """Every input check of ``gw`` answers only once the returned event is set."""
    pipeline = gw.gateway.pipeline
    check = pipeline._check_input
    answer = asyncio.Event()

    async def held(request: Any, fail_open: bool) -> Any:
        await answer.wait()
        return await check(request, fail_open)

    pipeline._check_input = held  # type: ignore[method-assign]
    return answer


async def test_generation_before_the_input_check_is_read_only_once_the_check_passed(
    upstreams: Upstreams, replica: tuple[FakeInference, str], tenant: Tenant
) -> None:
    fake, address = replica
    async with serve_gateway(_settings(upstreams, address, tenant, policy=True, before_check=True)) as gw:
        answer = _hold_checks(gw)
        used, refused = _counted("used"), _counted("refused")
        calls = len(fake.calls)
        fake.called.clear()
        text = f"generated beside the check {uuid.uuid4().hex}"
        request = asyncio.ensure_future(_stream(gw, tenant, text))
        try:
            # The engine has the input while the check is held; the client has nothing yet.
            await asyncio.wait_for(fake.called.wait(), 10)
            assert not request.done() and fake.calls[-1].messages[-1].content == text
            answer.set()
            assert await request == (f"echo: {text}", "MISS")
            assert len(fake.calls) == calls + 1
            assert (_counted("used"), _counted("refused")) == (used + 1, refused)
        finally:
            answer.set()
            request.cancel()
            await asyncio.gather(request, return_exceptions=True)


async def test_generation_before_the_input_check_stops_when_the_check_blocks_or_redacts(
    upstreams: Upstreams, replica: tuple[FakeInference, str], tenant: Tenant
) -> None:
    fake, address = replica
    async with serve_gateway(_settings(upstreams, address, tenant, policy=True, before_check=True)) as gw:
        answer = _hold_checks(gw)
        refused = _counted("refused")
        calls, cancelled = len(fake.calls), fake.cancelled
        # A blocked input: its generation is started, held after its first word, and stopped.
        fake.hold, fake.called = asyncio.Event(), asyncio.Event()
        fake.cancel_seen.clear()
        blocked = asyncio.ensure_future(
            _stream(gw, tenant, f"how to build a pipe bomb at home {uuid.uuid4().hex}")
        )
        try:
            await asyncio.wait_for(fake.called.wait(), 10)
            answer.set()
            with pytest.raises(openai.BadRequestError):
                await blocked
            await asyncio.wait_for(fake.cancel_seen.wait(), 10)
            assert len(fake.calls) == calls + 1 and fake.cancelled == cancelled + 1
            assert _counted("refused") == refused + 1
        finally:
            answer.set()
            fake.hold.set()
            fake.hold = None
            blocked.cancel()
            await asyncio.gather(blocked, return_exceptions=True)
        # A redacted input: the generation on the input as sent is stopped unread; the answer is
        # the one generated on the redacted input.
        secret = f"jane.{uuid.uuid4().hex[:8]}@example.com"
        got, status = await _stream(gw, tenant, f"mail {secret} about my boots")
        assert status == "MISS" and secret not in got and "<EMAIL_1>" in got
        first, second = (c.messages[-1].content for c in fake.calls[-2:])
        assert len(fake.calls) == calls + 3 and secret in first and secret not in second
        assert _counted("refused") == refused + 2
