"""Two gateways route a prompt alike to the replica that reports holding its prefix (issue 17).

The replicas are fakes whose WatchPrefixes streams the test writes; the real engine's reports
are tested in tests/integration/inference/test_kv_prefixes.py and, through the gateway, in
tests/e2e/test_mesh.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable

import httpx
import pytest_asyncio
from llmesh.v1 import common_pb2, inference_pb2
from prometheus_client import REGISTRY

from gateway.pipeline import _prompt_text
from gateway.routing.prefix import prefix_blocks
from services.runtime.server import RunningServer
from tests.fixtures.fake_inference import MODEL, FakeInference, start_fake
from tests.fixtures.gateway import RunningGateway, serve_gateway
from tests.integration.gateway.conftest import Tenant, Upstreams, make_settings

EVICTED_ROUTES = "llmesh_gateway_route_choices_total"


class Replicas:
    def __init__(self, fakes: list[FakeInference], servers: list[RunningServer]) -> None:
        self.fakes = fakes
        self.servers = servers
        self.by_address = {s.address: f for s, f in zip(servers, fakes, strict=True)}


@pytest_asyncio.fixture(loop_scope="session")
async def replicas() -> AsyncIterator[Replicas]:
    fakes = [FakeInference(f"r{i}", reports=[]) for i in range(2)]
    servers = [await start_fake(f) for f in fakes]
    yield Replicas(fakes, servers)
    for server in servers:
        await server.stop(0)


@pytest_asyncio.fixture(loop_scope="session")
async def gateways(
    upstreams: Upstreams, tenant: Tenant, replicas: Replicas
) -> AsyncIterator[list[RunningGateway]]:
    settings = make_settings(upstreams, tenant).model_copy(
        update={"inference_addresses": [s.address for s in replicas.servers]}
    )
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(serve_gateway(settings)) for _ in range(2)]


async def until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Waits (bounded) for the gateways to have applied what the replicas reported."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "the reports never reached the gateways"
        await asyncio.sleep(0.02)


def keys_of(gateway: RunningGateway, system: str, question: str) -> list[int]:
    text = _prompt_text(
        [
            common_pb2.ChatMessage(role=common_pb2.ROLE_SYSTEM, content=system),
            common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=question),
        ],
        [],
    )
    settings = gateway.gateway.settings
    return prefix_blocks(text, settings.route_block_chars, settings.route_max_blocks)


def owned_by_replica_0(gateway: RunningGateway, replicas: Replicas, word: str) -> tuple[str, list[int]]:
    """A new system prompt (and its keys) whose owner on the gateway's hash ring is replica 0."""
    addresses = [s.address for s in replicas.servers]
    while True:
        system = f"{word.title()} {uuid.uuid4().hex}. " + f"Answer from the {word} only. " * 100
        keys = keys_of(gateway, system, "q")
        if gateway.gateway.inference.balancer.ring.lookup(keys[0], lambda _: 0, addresses) == addresses[0]:
            return system, keys


async def ask(gateway: RunningGateway, tenant: Tenant, system: str, question: str) -> None:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        reply = await http.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
                "temperature": 0,
            },
            headers={"authorization": f"Bearer {tenant.key}", "cache-control": "no-store"},
        )
    assert reply.status_code == 200, reply.text


async def every_gateway_sends(
    gateways: list[RunningGateway], tenant: Tenant, system: str, to: FakeInference, question: str
) -> None:
    """Each gateway, asked ``question`` on ``system``, sends it to the replica ``to``."""
    for n, gateway in enumerate(gateways):
        before = len(to.calls)
        await ask(gateway, tenant, system, question)
        assert len(to.calls) == before + 1, f"gateway {n} sent the prompt elsewhere"


async def test_every_gateway_routes_a_prefix_to_the_replica_reporting_it(
    gateways: list[RunningGateway], tenant: Tenant, replicas: Replicas
) -> None:
    addresses = [s.address for s in replicas.servers]
    # A system prompt the ring gives to replica 0, so a report for replica 1 must move it.
    system, keys = owned_by_replica_0(gateways[0], replicas, "handbook")
    holder, owner = replicas.fakes[1], replicas.fakes[0]
    holder.report(inference_pb2.WatchPrefixesResponse(reset=True, held=keys[:10]))
    await until(lambda: all(g.gateway.inference.balancer.held.held_by(addresses[1]) == 10 for g in gateways))

    for n, gateway in enumerate(gateways):
        # Another question on the same system prompt: its first 10 keys are the reported ones.
        question = f"question {n}"
        assert keys_of(gateway, system, question)[:10] == keys[:10]
        gateway.gateway.inference.balancer.recent_s = 0.0  # only the reports count
        before = len(holder.calls)
        await ask(gateway, tenant, system, question)
        assert len(holder.calls) == before + 1, f"gateway {n} sent the prompt elsewhere"
        sent = holder.calls[-1].route_prefix
        assert list(sent.keys)[:10] == keys[:10] and sent.block_chars == 256 and sent.text_chars > 2560

    # Evicted: the replica releases the keys, and both gateways go back to the ring owner.
    holder.report(inference_pb2.WatchPrefixesResponse(released=keys[:10]))
    await until(lambda: all(g.gateway.inference.balancer.held.held_by(addresses[1]) == 0 for g in gateways))
    await every_gateway_sends(gateways, tenant, system, owner, "question after")


async def test_a_prompt_no_replica_holds_goes_to_the_one_reporting_room(
    gateways: list[RunningGateway], tenant: Tenant, replicas: Replicas
) -> None:
    addresses = [s.address for s in replicas.servers]
    system, _ = owned_by_replica_0(gateways[0], replicas, "manual")
    owner, roomy = replicas.fakes
    # The ring owner holds three prompts' worth of other keys, the other replica one.
    owner.report(inference_pb2.WatchPrefixesResponse(reset=True, held=range(10_000, 10_048)))
    roomy.report(inference_pb2.WatchPrefixesResponse(reset=True, held=range(20_000, 20_016)))

    def applied(a: int, b: int) -> bool:
        return all(
            (
                g.gateway.inference.balancer.held.held_by(addresses[0]),
                g.gateway.inference.balancer.held.held_by(addresses[1]),
            )
            == (a, b)
            for g in gateways
        )

    try:
        await until(lambda: applied(48, 16))
        for n, gateway in enumerate(gateways):
            gateway.gateway.inference.balancer.recent_s = 0.0  # only the reports count
            before = len(roomy.calls)
            await ask(gateway, tenant, system, f"question {n}")
            assert len(roomy.calls) == before + 1, f"gateway {n} sent the prompt to the full replica"
        # Within one prompt's worth of keys (route_max_blocks, 16): the ring owner keeps it.
        roomy.report(inference_pb2.WatchPrefixesResponse(held=range(20_016, 20_040)))
        await until(lambda: applied(48, 40))
        await every_gateway_sends(gateways, tenant, system, owner, "question after")
    finally:
        owner.report(inference_pb2.WatchPrefixesResponse(reset=True))
        roomy.report(inference_pb2.WatchPrefixesResponse(reset=True))
        await until(lambda: applied(0, 0))


async def test_a_prompt_its_holder_evicted_most_of_moves_to_the_other_replica(
    gateways: list[RunningGateway], tenant: Tenant, replicas: Replicas
) -> None:
    addresses = [s.address for s in replicas.servers]
    system, keys = owned_by_replica_0(gateways[0], replicas, "guide")
    less, more = (len(keys) - 1) // 2, (len(keys) + 2) // 2  # of the prompt's keys: < and > half
    assert less >= 1 and less * 2 < len(keys) <= more * 2
    full, other = replicas.fakes

    def held(n: int) -> bool:
        return all(
            g.gateway.inference.balancer.held.held_by(addresses[0]) == n
            and set(addresses) <= g.gateway.inference.balancer.watched
            for g in gateways
        )

    try:
        other.report(inference_pb2.WatchPrefixesResponse(reset=True))  # its reports are known
        # The ring owner held the prompt, then evicted more than half of it (its cache too full).
        full.report(inference_pb2.WatchPrefixesResponse(reset=True, held=keys))
        full.report(inference_pb2.WatchPrefixesResponse(released=keys[less:]))
        await until(lambda: held(less))
        moved = REGISTRY.get_sample_value(EVICTED_ROUTES, {"reason": "evicted"}) or 0.0
        for n, gateway in enumerate(gateways):
            gateway.gateway.inference.balancer.recent_s = 0.0  # only the reports count
            before = len(other.calls)
            await ask(gateway, tenant, system, f"question {n}")
            assert len(other.calls) == before + 1, f"gateway {n} sent the prompt back to the full replica"
        # Operators see why (both gateways count in this process's registry).
        assert REGISTRY.get_sample_value(EVICTED_ROUTES, {"reason": "evicted"}) == moved + 2
        # Evicting only the tail leaves the prompt where it is: more than half is still a hit.
        full.report(inference_pb2.WatchPrefixesResponse(held=keys[less:more]))
        await until(lambda: held(more))
        await every_gateway_sends(gateways, tenant, system, full, "question after")
    finally:
        full.report(inference_pb2.WatchPrefixesResponse(reset=True))
        await until(lambda: held(0))
