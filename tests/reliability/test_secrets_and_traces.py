"""One trace across the services of a request, exported over real OTLP; no API key in any
span attribute or log line."""

from __future__ import annotations

import uuid

import httpx

from tests.fixtures.otlp import Collector, ReceivedSpan
from tests.reliability.conftest import KEYS, Gateway


def _services_in_trace(spans: list[ReceivedSpan], trace_id: str) -> set[str]:
    return {s.service for s in spans if s.trace_id == trace_id}


async def test_one_trace_spans_the_services_and_holds_no_secret(gateway: Gateway, otlp: Collector) -> None:
    request_id = f"trace-{uuid.uuid4().hex[:12]}"
    async with httpx.AsyncClient(base_url=gateway.url, timeout=120) as http:
        reply = await http.post(
            "/v1/chat/completions",
            json={
                "model": "",
                "messages": [{"role": "user", "content": f"Say hello. {request_id}"}],
                "max_tokens": 4,
            },
            headers={"Authorization": f"Bearer {KEYS['alpha']}", "X-Request-Id": request_id},
        )
    assert reply.status_code == 200, reply.text
    spans = otlp.wait_for(
        lambda got: any(s.attributes.get("llmesh.request_id") == request_id for s in got), timeout=60
    )
    trace_id = next(s.trace_id for s in spans if s.attributes.get("llmesh.request_id") == request_id)
    # The gateway, the policy and cache services took part in this one trace.
    spans = otlp.wait_for(
        lambda got: {"llmesh-gateway", "llmesh-policy", "llmesh-cache"} <= _services_in_trace(got, trace_id),
        timeout=60,
    )
    assert len({s.span_id for s in spans if s.trace_id == trace_id}) >= 4
    exported = b"".join(otlp.raw)
    log = gateway.log_path.read_bytes()
    for key in KEYS.values():
        assert key.encode() not in exported, "an API key reached a trace"
        assert key.encode() not in log, "an API key reached the gateway's log"
    assert b"Bearer " not in exported
