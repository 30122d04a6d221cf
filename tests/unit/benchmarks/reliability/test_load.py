"""The load generator's outcome records, against scripted HTTP answers (httpx.MockTransport)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx

from benchmarks.reliability.balancer import GatewayBalancer
from benchmarks.reliability.load import LoadConfig, LoadGenerator, Outcome, summarize


def _sse(*events: str) -> bytes:
    return b"".join(f"{e}\n\n".encode() for e in events)


def _chunk(text: str) -> str:
    return "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]})


def _run(handler: Callable[[httpx.Request], httpx.Response], **config: object) -> list[Outcome]:
    settings = LoadConfig(clients=1, duration_s=60, max_requests=1, session_every=0, **config)  # type: ignore[arg-type]
    gen = LoadGenerator("http://gw", settings, transport=httpx.MockTransport(handler))
    return asyncio.run(gen.run())


def test_a_complete_stream_is_ok() -> None:
    body = _sse(_chunk("Hel"), _chunk("lo"), ": x-cache-status=MISS x-cache-version=", "data: [DONE]")
    [outcome] = _run(lambda r: httpx.Response(200, content=body, headers={"x-cache-status": "MISS"}))
    assert outcome.ok and outcome.error is None
    assert outcome.chunks == 2 and outcome.cache_status == "MISS" and outcome.ttft is not None


def test_an_http_error_keeps_status_and_message() -> None:
    error = {"error": {"message": "the policy service is unavailable; retry shortly", "type": "x"}}
    [outcome] = _run(lambda r: httpx.Response(503, json=error))
    assert not outcome.ok
    assert outcome.error == "http 503" and outcome.status == 503
    assert outcome.message == "the policy service is unavailable; retry shortly"


def test_an_error_event_in_the_stream_fails_the_request() -> None:
    error = json.dumps(
        {"error": {"message": "replica lost", "type": "service_unavailable", "code": "unavailable"}}
    )
    body = _sse(_chunk("Hel"), "data: " + error, "data: [DONE]")
    [outcome] = _run(lambda r: httpx.Response(200, content=body))
    assert not outcome.ok
    assert outcome.error == "stream error unavailable" and outcome.message == "replica lost"


def test_a_stream_without_done_is_truncated() -> None:
    [outcome] = _run(lambda r: httpx.Response(200, content=_sse(_chunk("Hel"))))
    assert not outcome.ok and outcome.error == "truncated"


def test_a_refused_connection_is_a_transport_failure() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    [outcome] = _run(refuse)
    assert not outcome.ok and outcome.error == "transport ConnectError"


def test_sessions_send_their_version_and_check_it_grows() -> None:
    seen: list[str | None] = []
    answers = iter([5, 9, 9])

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(request.headers.get("x-cache-version"))
        version = next(answers)
        trailer = f": x-cache-status=MISS x-cache-version=session:{body['session_id']}={version}"
        return httpx.Response(200, content=_sse(_chunk("a"), trailer, "data: [DONE]"))

    settings = LoadConfig(clients=1, duration_s=60, max_requests=3, session_every=1)
    gen = LoadGenerator("http://gw", settings, transport=httpx.MockTransport(handler))
    outcomes = asyncio.run(gen.run())
    assert [o.version_ok for o in outcomes] == [True, True, False]
    assert seen[0] is None
    assert seen[1] is not None and seen[1].endswith("=5")
    assert summarize(outcomes)["version_violations"] == 1


def test_summary_counts_failures_by_kind() -> None:
    outcomes = [
        Outcome(0, 0, "unique", 0.0, 1.0, ok=True, cache_status="MISS"),
        Outcome(1, 0, "unique", 0.0, 2.0, error="http 503", cache_status="BYPASS"),
        Outcome(2, 0, "unique", 0.0, 3.0, error="http 503"),
    ]
    summary = summarize(outcomes)
    assert summary["requests"] == 3 and summary["ok"] == 1 and summary["failed"] == 2
    assert summary["errors"] == {"http 503": 2}
    assert summary["cache_status"] == {"MISS": 1, "BYPASS": 1, "-": 1}


def _balanced(handler: Callable[[httpx.Request], httpx.Response], requests: int) -> list[Outcome]:
    transport = httpx.MockTransport(handler)
    settings = LoadConfig(clients=1, duration_s=60, max_requests=requests, session_every=0)

    async def run() -> list[Outcome]:
        balancer = GatewayBalancer(["http://gw-a", "http://gw-b"], period_s=0.01, transport=transport)
        balancer.start()
        try:
            return await LoadGenerator("", settings, transport=transport, balancer=balancer).run()
        finally:
            await balancer.stop()

    return asyncio.run(run())


_OK = _sse(_chunk("Hi"), "data: [DONE]")


def test_balancer_sends_new_requests_only_to_ready_gateways() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/readyz":
            return httpx.Response(503 if request.url.host == "gw-a" else 200)
        return httpx.Response(200, content=_OK)

    outcomes = _balanced(handler, 6)
    assert all(o.ok for o in outcomes)
    assert {o.gateway for o in outcomes} == {"http://gw-b"}


def test_balancer_retries_a_refused_connection_on_the_other_gateway_only() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/readyz":
            return httpx.Response(200)  # both look ready: gw-a refuses connections anyway
        if request.url.host == "gw-a":
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, content=_OK)

    outcomes = _balanced(handler, 4)
    assert all(o.ok and o.gateway == "http://gw-b" for o in outcomes)
    assert sum(o.refused for o in outcomes) >= 1


def test_balancer_does_not_retry_a_request_a_gateway_failed() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/readyz":
            return httpx.Response(200)
        if request.url.host == "gw-a":
            return httpx.Response(503, json={"error": {"message": "busy"}})
        return httpx.Response(200, content=_OK)

    outcomes = _balanced(handler, 4)
    failed = [o for o in outcomes if not o.ok]
    assert failed and all(o.gateway == "http://gw-a" and o.error == "http 503" for o in failed)
