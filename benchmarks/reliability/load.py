"""Streaming chat clients against the gateway's HTTP API, one outcome record per request.

Each client loops (until the duration or request budget is spent) over
``POST /v1/chat/completions`` with ``stream=true`` and reads the server-sent
events to the end. A request is OK only with status 200, no error event and a
``[DONE]``. Clients mix three kinds of request: a unique prompt (inference on
every call), a prompt from a small shared pool (response-cache hits), and
multi-turn sessions that send back the ``X-Cache-Version`` they got, which
checks the versions protocol from the outside: every answered turn appends to
the session, so the version it returns must be above the floor it sent (a
version issued twice, e.g. after Redis restarts empty, shows up as
``version_ok=False``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from benchmarks.reliability.balancer import GatewayBalancer
from services.runtime.context import parse_versions

REPEATED_PROMPTS = [
    "Name a primary colour.",
    "What is two plus two?",
    "Say hello in French.",
    "Name a planet.",
    "What is the capital of Italy?",
    "Give me a synonym for quick.",
    "Name a fruit that is yellow.",
    "What animal says moo?",
]
TOPICS = ["rivers", "bridges", "owls", "clocks", "tea", "glaciers", "violins", "lighthouses", "moss", "kites"]
SESSION_TURNS = 4
MAX_RETRY_PAUSE_S = 1.0


@dataclass
class Outcome:
    """What happened to one request (times in seconds since the load started)."""

    rid: int
    client: int
    kind: str
    start: float
    end: float = 0.0
    ttft: float | None = None
    status: int | None = None
    ok: bool = False
    error: str | None = None
    message: str | None = None
    chunks: int = 0
    cache_status: str | None = None
    session: str | None = None
    version_sent: int | None = None
    version_got: int | None = None
    version_ok: bool | None = None
    retry_after: float | None = None
    gateway: str | None = None
    # Connections refused before any byte was sent, each tried again on another gateway.
    refused: int = 0

    @property
    def latency(self) -> float:
        return self.end - self.start

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LoadConfig:
    clients: int = 8
    duration_s: float = 30.0
    max_requests: int | None = None
    max_tokens: int = 24
    # A request not finished after this long is recorded as a hang (and cancelled).
    hang_s: float = 120.0
    # Every Nth client runs sessions (0 = none); of the others, this share asks a pooled prompt.
    session_every: int = 5
    repeat_share: float = 0.3
    # Each client runs at least this many requests, even past the duration.
    min_per_client: int = 0
    api_key: str | None = None
    seed: int = 0


@dataclass
class _SessionState:
    session_id: str = ""
    turns: int = 0
    versions: dict[str, int] = field(default_factory=dict)


def _session_version(versions: dict[str, int], session_id: str) -> int | None:
    for namespace, version in versions.items():
        if namespace.endswith("session:" + session_id):
            return version
    return None


class LoadGenerator:
    """``clients`` concurrent streaming clients; ``outcomes`` grows as requests finish."""

    def __init__(
        self,
        base_url: str,
        config: LoadConfig | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        balancer: GatewayBalancer | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # Several gateways: each request goes where the balancer says (base_url unused).
        self.balancer = balancer
        self._transport = transport
        self.config = config or LoadConfig()
        self.outcomes: list[Outcome] = []
        self.inflight: dict[int, Outcome] = {}
        self._next_id = 0
        self._stop = asyncio.Event()
        self._changed = asyncio.Event()
        self._t0 = time.monotonic()
        self._run_id = uuid.uuid4().hex[:8]

    def now(self) -> float:
        return time.monotonic() - self._t0

    async def until(self, predicate: Callable[[], bool], limit_s: float) -> bool:
        """Waits until ``predicate()`` holds, re-checked whenever a request finishes; False on timeout."""
        deadline = time.monotonic() + limit_s
        while not predicate():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)
        return True

    def stop(self) -> None:
        """Clients finish the request they are on and stop."""
        self._stop.set()

    def _budget_left(self, done_by_client: int = 0) -> bool:
        if self._stop.is_set():
            return False
        if self.now() >= self.config.duration_s and done_by_client >= self.config.min_per_client:
            return False
        limit = self.config.max_requests
        return limit is None or self._next_id < limit

    async def run(self) -> list[Outcome]:
        self._t0 = time.monotonic()
        limits = httpx.Limits(
            max_connections=self.config.clients + 4, max_keepalive_connections=self.config.clients
        )
        timeout = httpx.Timeout(self.config.hang_s, connect=10.0)
        headers = {"authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        async with httpx.AsyncClient(
            base_url=self.base_url, limits=limits, timeout=timeout, headers=headers, transport=self._transport
        ) as http:
            await asyncio.gather(*(self._client(http, i) for i in range(self.config.clients)))
        return self.outcomes

    async def _client(self, http: httpx.AsyncClient, index: int) -> None:
        rng = random.Random(self.config.seed * 1000 + index)
        sessions = self.config.session_every > 0 and index % self.config.session_every == 0
        state = _SessionState()
        done = 0
        while self._budget_left(done):
            done += 1
            rid = self._next_id
            self._next_id += 1
            semantic = False
            if sessions:
                if not state.session_id or state.turns >= SESSION_TURNS:
                    state = _SessionState(session_id=f"rel-{self._run_id}-{index}-{rid}")
                outcome = Outcome(rid, index, "session", self.now(), session=state.session_id)
                body = self._body(f"Turn {state.turns + 1}: tell me one fact about {rng.choice(TOPICS)}.")
                body["session_id"] = state.session_id
            elif rng.random() < self.config.repeat_share:
                outcome = Outcome(rid, index, "repeat", self.now())
                body = self._body(rng.choice(REPEATED_PROMPTS))
                # Semantic lookups make the cache call the embeddings service too.
                semantic = True
            else:
                outcome = Outcome(rid, index, "unique", self.now())
                body = self._body(
                    f"Request {self._run_id}-{rid}: write one sentence about {rng.choice(TOPICS)} "
                    f"and the number {rng.randrange(10**6)}."
                )
            extra: dict[str, str] = {"x-semantic-cache": "on"} if semantic else {}
            if sessions and state.versions:
                extra["x-cache-version"] = ",".join(
                    f"{ns}={v}" if ns else str(v) for ns, v in sorted(state.versions.items())
                )
                outcome.version_sent = _session_version(state.versions, state.session_id)
            self.inflight[rid] = outcome
            try:
                async with asyncio.timeout(self.config.hang_s):
                    await self._one(http, body, extra, outcome)
            except TimeoutError:
                outcome.error, outcome.message = "hang", f"no end of stream after {self.config.hang_s:.0f} s"
            except httpx.HTTPError as exc:
                outcome.error, outcome.message = f"transport {type(exc).__name__}", str(exc)[:300]
            finally:
                outcome.end = self.now()
                self.inflight.pop(rid, None)
                self.outcomes.append(outcome)
                self._changed.set()
            if outcome.retry_after is not None or (outcome.error or "").startswith("transport"):
                # As the OpenAI SDK does: the next try after a failed-closed, shed or refused
                # request waits a moment (the failure itself is recorded, never retried away).
                await asyncio.sleep(min(outcome.retry_after or MAX_RETRY_PAUSE_S, MAX_RETRY_PAUSE_S))
            if sessions and outcome.ok:
                state.turns += 1
                if outcome.version_got is not None:
                    state.versions = {
                        ns: v
                        for ns, v in state.versions.items()
                        if not ns.endswith("session:" + state.session_id)
                    }
                    state.versions[f"session:{state.session_id}"] = outcome.version_got

    def _body(self, text: str) -> dict[str, Any]:
        return {
            "model": "",
            "messages": [{"role": "user", "content": text}],
            "max_tokens": self.config.max_tokens,
            "temperature": 0,
            "stream": True,
        }

    async def _one(
        self, http: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str], outcome: Outcome
    ) -> None:
        if self.balancer is None:
            await self._send(http, "/v1/chat/completions", body, headers, outcome)
            return
        tried: set[str] = set()
        while True:
            url = await self.balancer.choose(frozenset(tried))
            outcome.gateway = url
            try:
                await self._send(http, url + "/v1/chat/completions", body, headers, outcome)
                return
            except httpx.ConnectError:
                # Refused before any byte of the request left: another gateway may take it.
                tried.add(url)
                outcome.refused += 1
                self.balancer.refused(url)
                if len(tried) == len(self.balancer.base_urls):
                    raise

    async def _send(
        self,
        http: httpx.AsyncClient,
        url: str,
        body: dict[str, Any],
        headers: dict[str, str],
        outcome: Outcome,
    ) -> None:
        async with http.stream("POST", url, json=body, headers=headers) as response:
            outcome.status = response.status_code
            outcome.cache_status = response.headers.get("x-cache-status")
            if response.status_code != 200:
                raw = await response.aread()
                outcome.error = f"http {response.status_code}"
                outcome.message = _error_message(raw)
                with contextlib.suppress(ValueError):
                    outcome.retry_after = float(response.headers.get("retry-after", ""))
                return
            done = False
            trailer_version: str | None = None
            async for line in response.aiter_lines():
                if line.startswith(":"):
                    # The gateway's trailer comment: ": x-cache-status=S x-cache-version=V"
                    for part in line[1:].split():
                        key, _, value = part.partition("=")
                        if key == "x-cache-version" and value:
                            trailer_version = value
                        if key == "x-cache-status" and value:
                            outcome.cache_status = value
                    continue
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                payload = json.loads(data)
                if "error" in payload:
                    outcome.error = (
                        f"stream error {payload['error'].get('code') or payload['error'].get('type')}"
                    )
                    outcome.message = str(payload["error"].get("message"))[:300]
                    continue
                if outcome.ttft is None:
                    outcome.ttft = self.now() - outcome.start
                outcome.chunks += 1
            if outcome.error is None and not done:
                outcome.error, outcome.message = "truncated", "the stream ended without [DONE]"
            outcome.ok = outcome.error is None
            if outcome.session and trailer_version:
                got = _session_version(parse_versions(trailer_version), outcome.session)
                outcome.version_got = got
                # A turn the cache saw (not BYPASS) was appended: its version must be new.
                if outcome.ok and got is not None and outcome.cache_status != "BYPASS":
                    outcome.version_ok = outcome.version_sent is None or got > outcome.version_sent


def _error_message(raw: bytes) -> str:
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        return str(json.loads(raw)["error"]["message"])[:300]
    return raw[:300].decode(errors="replace")


def summarize(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """Counts, failures by kind, cache statuses and latency percentiles of a set of outcomes."""
    from benchmarks.harness import percentile

    ok = [o for o in outcomes if o.ok]
    failed = [o for o in outcomes if not o.ok]
    latencies = [o.latency for o in ok]
    ttfts = [o.ttft for o in ok if o.ttft is not None]
    return {
        "requests": len(outcomes),
        "ok": len(ok),
        "failed": len(failed),
        "errors": dict(Counter(o.error or "?" for o in failed)),
        "cache_status": dict(Counter(o.cache_status or "-" for o in outcomes)),
        "latency_p50_s": round(percentile(latencies, 50), 3) if latencies else None,
        "latency_p99_s": round(percentile(latencies, 99), 3) if latencies else None,
        "latency_max_s": round(max((o.latency for o in outcomes), default=0.0), 3),
        "ttft_p50_s": round(percentile(ttfts, 50), 3) if ttfts else None,
        "version_checks": sum(1 for o in outcomes if o.version_ok is not None),
        "version_violations": sum(1 for o in outcomes if o.version_ok is False),
    }
