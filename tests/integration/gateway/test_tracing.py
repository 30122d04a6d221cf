"""One trace covers a request: the caller's traceparent, the gateway's stages and the
server spans of the cache and policy services all share its trace id."""

from __future__ import annotations

import httpx

from tests.fixtures.fake_inference import MODEL
from tests.fixtures.gateway import RunningGateway
from tests.fixtures.spans import capture_spans
from tests.integration.gateway.conftest import Tenant

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


async def test_one_trace_across_services(gateway: RunningGateway, tenant: Tenant) -> None:
    exporter = capture_spans()
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        reply = await http.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "trace me"}], "temperature": 0},
            headers={
                "authorization": f"Bearer {tenant.key}",
                "traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01",
            },
        )
    assert reply.status_code == 200
    spans = {s.name: s for s in exporter.get_finished_spans() if f"{s.context.trace_id:032x}" == TRACE_ID}
    assert "POST /v1/chat/completions" in spans
    assert "gateway.inference" in spans
    # A check alone goes in a CheckInput call of its own (gateway/stages/input_batch.py; the
    # batched ones' spans: tests/integration/gateway/test_input_batch.py).
    check = spans["llmesh.v1.PolicyService/CheckInput"]
    assert check.parent is not None
    assert check.parent.span_id == spans["gateway.policy.input"].context.span_id
    assert "llmesh.v1.ContextCacheService/LookupResponse" in spans
    assert "llmesh.v1.InferenceService/Generate" in spans


async def test_the_session_read_runs_beside_the_input_check(gateway: RunningGateway, tenant: Tenant) -> None:
    """Neither needs the other: their spans overlap (one after the other, they would not)."""
    exporter = capture_spans()
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        for n in range(2):  # the second request reads a session that has a turn
            reply = await http.post(
                "/v1/chat/completions",
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"remember {n}"}],
                    "temperature": 0,
                    "session_id": "beside",
                },
                headers={
                    "authorization": f"Bearer {tenant.key}",
                    "traceparent": f"00-{TRACE_ID[:-1]}{n}-00f067aa0ba902b7-01",
                },
            )
            assert reply.status_code == 200, reply.text
    for n in range(2):
        trace_id = f"{TRACE_ID[:-1]}{n}"
        spans = {s.name: s for s in exporter.get_finished_spans() if f"{s.context.trace_id:032x}" == trace_id}
        session, check = spans["gateway.session"], spans["gateway.policy.input"]
        assert session.start_time is not None and session.end_time is not None
        assert check.start_time is not None and check.end_time is not None
        assert session.start_time < check.end_time and check.start_time < session.end_time
