"""The request pipeline of a chat or text completion (ARCHITECTURE.md, "The path of a chat request").

rate limit -> policy input (beside the session read, or beside the response-cache
lookup without a session) -> response cache -> RAG ->
inference (routed, streamed) -> policy output (streamed) -> cache store +
session append -> audit. Authentication happens in the front end (HTTP or gRPC),
which hands a :class:`~gateway.auth.Principal` in. Every stage is a span.

Both front ends call :meth:`ChatPipeline.prepare`, then either
:meth:`ChatPipeline.complete` or :meth:`ChatPipeline.stream`; everything up to
the first generated token happens in ``prepare``, so an HTTP stream can still
answer an error with its proper status code.

The pipeline owns the admission slot (:mod:`gateway.admission`): ``prepare`` takes
it, the prepared request holds it, and ``complete`` or the stream that ``stream``
returns gives it back; the front ends never touch it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmesh.v1 import cache_pb2, chat_pb2, common_pb2, embeddings_pb2, inference_pb2
from opentelemetry import trace

from gateway.admission import Admission, Slot, SlotStream
from gateway.answers import (
    ChoiceBuilder,
    assistant_turn,
    cache_entry,
    response_from_entry,
    stream_from_entry,
)
from gateway.auth import Principal
from gateway.config import GatewaySettings, TenantSettings
from gateway.errors import PolicyBlocked
from gateway.ratelimit import Limiter
from gateway.routing.prefix import conversation_text, prefix_blocks
from gateway.speculation import OUTCOMES as SPECULATIONS
from gateway.speculation import Speculation, SpeculationGate
from gateway.stages.cache import CacheStage, Lookup
from gateway.stages.output import ChoiceStream, moderate_choice
from gateway.stages.policy import PolicyGate, moderation_skipped
from gateway.stages.rag import RagStage, inject, last_user_text
from gateway.upstream_inference import InferencePool, ModelInfo, resumed_count
from gateway.usage import NoUsage, Outcome, UsageRecorder
from services.runtime import context as rc
from services.runtime import namespaces
from services.runtime.cache_status import CacheStatus, status_pb
from services.runtime.errors import InvalidArgument, Unavailable
from services.runtime.interceptors import start_span
from services.runtime.limits import MAX_CHOICES, MAX_SESSION_ID_CHARS

log = logging.getLogger(__name__)
audit_log = logging.getLogger("llmesh.audit")
_tracer = trace.get_tracer("llmesh.gateway")

MAX_N = MAX_CHOICES
MAX_MESSAGES = 2048
_CACHE_OWNED = namespaces.CACHE_OWNED_PREFIXES


@dataclass
class Prepared:
    """A request after every stage that runs before generation."""

    request: chat_pb2.CompleteRequest
    principal: Principal
    model: ModelInfo
    generate: inference_pb2.GenerateRequest
    blocks: list[int]
    new_turns: list[common_pb2.ChatMessage]
    lookup: Lookup
    # Held from prepare() until complete() ends or stream()'s stream ends or is closed.
    slot: Slot
    started: float = field(default_factory=time.perf_counter)
    # The generation started beside the cache lookup, still running (gateway/speculation.py).
    speculation: Speculation[inference_pb2.GenerateStreamResponse] | None = None

    async def discard(self) -> None:
        """Stops a speculative generation nobody will read (idempotent)."""
        if self.speculation is not None:
            await self.speculation.cancel()


def _validate(request: chat_pb2.CompleteRequest) -> None:
    if bool(request.messages) == bool(request.prompt):
        raise InvalidArgument("exactly one of messages and prompt must be given")
    if len(request.messages) > MAX_MESSAGES:
        raise InvalidArgument(f"messages: at most {MAX_MESSAGES} messages")
    if request.prompt and (request.session_id or request.rag.collections):
        raise InvalidArgument("session_id and rag apply to chat messages, not to a raw prompt")
    sampling = request.sampling
    if not 0 <= sampling.n <= MAX_N:
        raise InvalidArgument(f"n must be between 1 and {MAX_N}")
    if sampling.HasField("max_tokens") and sampling.max_tokens < 1:
        raise InvalidArgument("max_tokens must be at least 1")
    if len(request.session_id) > MAX_SESSION_ID_CHARS:
        raise InvalidArgument(f"session_id is longer than {MAX_SESSION_ID_CHARS} characters")


def _generation_fields(request: chat_pb2.CompleteRequest) -> dict[str, Any]:
    """What decides the answer besides the prompt: the same in the cache key and the generation."""
    return {
        "tools": request.tools,
        "tool_choice": request.tool_choice,
        "response_format": request.response_format,
        "sampling": request.sampling,
    }


def _response_key(
    request: chat_pb2.CompleteRequest,
    model: ModelInfo,
    messages: Sequence[common_pb2.ChatMessage],
    prompt: str,
    scope: str,
) -> cache_pb2.ResponseKey:
    return cache_pb2.ResponseKey(
        model=model.name,
        model_revision=model.revision,
        messages=messages,
        prompt=prompt,
        scope=scope,
        **_generation_fields(request),
    )


def rag_settings(rag: chat_pb2.RagOptions, tenant: TenantSettings) -> tuple[list[str], int]:
    """The collections a request with ``rag`` searches and its top_k (the tenant's defaults
    where the request names none)."""
    return list(rag.collections) or list(tenant.rag_collections), rag.top_k or tenant.rag_top_k


def rag_response_scope(rag: chat_pb2.RagOptions, tenant: TenantSettings) -> str:
    """The response-cache scope of a request with ``rag`` ("" when it searches nothing)."""
    collections, top_k = rag_settings(rag, tenant)
    if not collections:
        return ""
    return namespaces.rag_scope(collections, top_k, rag.min_score)


def _prompt_text(
    messages: Sequence[common_pb2.ChatMessage], tools: Sequence[common_pb2.ToolDefinition]
) -> str:
    head = json.dumps(sorted(t.function.name for t in tools)) if tools else ""
    return head + conversation_text((str(m.role), m.content) for m in messages)


async def _answered(
    lookup: Awaitable[Lookup], started: list[Speculation[inference_pb2.GenerateStreamResponse]]
) -> Lookup:
    """The lookup's answer; when it fails, the generations started beside it are stopped."""
    try:
        return await lookup
    except BaseException:
        for speculation in started:
            await speculation.cancel()
        raise


async def _stopped(started: list[Speculation[inference_pb2.GenerateStreamResponse]], outcome: str) -> None:
    """Stops the generations started before the input check answered (it refused or changed
    the input they were started on)."""
    for speculation in started:
        await speculation.cancel()
        SPECULATIONS.labels(outcome).inc()
    started.clear()


class ChatPipeline:
    """Runs the stages in order with the degradation rules of ARCHITECTURE.md ("Failure behaviour")."""

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        inference: InferencePool,
        policy: PolicyGate,
        cache: CacheStage,
        rag: RagStage,
        limiter: Limiter,
        usage: UsageRecorder | None = None,
    ) -> None:
        self.settings = settings
        self.inference = inference
        self.policy = policy
        self.cache = cache
        self.rag = rag
        self.limiter = limiter
        # Usage counters (gateway/usage.py): written once per answered request, in _finish
        # (or where an input block ends it); read by the token budget check.
        self.usage: UsageRecorder = usage or NoUsage()
        self.admission = Admission(settings.max_inflight, settings.tenant_max_inflight_share)
        # Whether a stream's generation starts beside its cache lookup (gateway/speculation.py).
        self.speculation = SpeculationGate(settings.speculative_generation)
        # Response-cache writes still running after their response ended (see _finish).
        self._writes: set[asyncio.Task[None]] = set()

    # -- before generation ----------------------------------------------------------------------

    async def prepare(
        self, request: chat_pb2.CompleteRequest, principal: Principal, *, stream: bool = False
    ) -> Prepared:
        """Every stage before generation, holding an admission slot (503 when there is none).

        ``stream``: the caller will call :meth:`stream`, so the generation may start beside
        the cache lookup (gateway/speculation.py).
        """
        return (await self.prepare_all([request], principal, stream=stream))[0]

    async def prepare_all(
        self, requests: Sequence[chat_pb2.CompleteRequest], principal: Principal, *, stream: bool = False
    ) -> list[Prepared]:
        """A batch (one generation per request): a slot each, taken together, and every request
        prepared before any is generated, so a refused one fails the batch with nothing started.

        Each slot is held by its prepared request; a failure gives back all of them.
        """
        slots = self.admission.acquire(
            len(requests), tenant=principal.tenant, tenant_limit=principal.settings.max_inflight
        )
        # Only a lone request speculates: a batch starts nothing before all are prepared.
        speculate = stream and len(requests) == 1
        try:
            return [
                await self._prepare(r, principal, slot, speculate)
                for r, slot in zip(requests, slots, strict=True)
            ]
        except BaseException as exc:
            for slot in slots:
                slot.release()
            if isinstance(exc, PolicyBlocked):
                await self._record_blocked(requests, principal)
            raise

    async def _record_blocked(
        self, requests: Sequence[chat_pb2.CompleteRequest], principal: Principal
    ) -> None:
        """Counts the input block that ended a batch (one request: the batch stops there)."""
        try:
            model = (await self.inference.model_info(requests[0].model)).name
        except Exception:  # the block is the answer; the model is only the usage row's label
            model = requests[0].model
        await self.usage.record(principal, Outcome(model=model, blocked=True))

    async def _prepare(
        self, request: chat_pb2.CompleteRequest, principal: Principal, slot: Slot, speculate: bool = False
    ) -> Prepared:
        _validate(request)
        with start_span(_tracer, "gateway.auth") as span:
            span.set_attribute("llmesh.tenant", principal.tenant)
            model = await self.inference.model_info(request.model)
            if request.model not in principal.settings.models:
                principal.check_model(model.name)
        with start_span(_tracer, "gateway.rate_limit"):
            await self.limiter.admit(principal)
        fail_open = principal.settings.policy_fail_open
        # Before the cache lookup: its scope names the collections (gateway/stages/rag.py).
        await self.rag.check_named(request.rag.collections)
        scope = self._rag_scope(request, principal)
        if request.session_id or not self.cache.enabled or not self.policy.enabled:
            if request.session_id:
                new_turns, prompt, history = await self._check_beside_session(request, model, fail_open)
                messages = (history or []) + list(new_turns)
            else:
                new_turns, prompt = await self._check_input(request, fail_open)
                messages = list(new_turns)
            key = _response_key(request, model, messages, prompt, scope)
            if (
                speculate
                and self.speculation.enabled
                and not self.policy.enabled
                and not request.session_id
                and self.cache.enabled
                and not self._rag_settings(request, principal)[0]
            ):
                # Nothing but the lookup before generation: the two may run side by side.
                return await self._prepare_beside_lookup(
                    request, principal, model, slot, messages=messages, prompt=prompt, key=key
                )
            with start_span(_tracer, "gateway.cache.lookup"):
                # max-age 0 (no-cache) still goes to the cache: it answers MISS/STALE and the
                # fresh answer replaces the entry.
                lookup = await self.cache.lookup(key)
        elif speculate and self.speculation.enabled and not self._rag_settings(request, principal)[0]:
            return await self._check_beside_lookup(
                request, principal, model, slot, scope=scope, fail_open=fail_open
            )
        else:
            new_turns, prompt, lookup = await self._check_and_lookup(request, model, scope, fail_open)
            messages = list(new_turns)
        if lookup.status == CacheStatus.HIT and lookup.entry is not None:
            # Answered from the cache: nothing is generated, so no generation request is built.
            return Prepared(
                request, principal, model, inference_pb2.GenerateRequest(), [], new_turns, lookup, slot
            )
        if lookup.status != CacheStatus.HIT:
            collections, top_k = self._rag_settings(request, principal)
            if collections:
                with start_span(_tracer, "gateway.rag"):
                    hits = await self.rag.search(
                        collections, last_user_text(messages), top_k, request.rag.min_score
                    )
                    if hits:
                        with start_span(_tracer, "gateway.policy.documents"):
                            await self.policy.check_input([], fail_open, [h.text for h in hits])
                    messages = inject(messages, hits)
        generate, blocks = self._generation(request, model, messages, prompt)
        return Prepared(request, principal, model, generate, blocks, new_turns, lookup, slot)

    def _generate_stream(
        self, generate: inference_pb2.GenerateRequest, blocks: Sequence[int]
    ) -> AsyncGenerator[inference_pb2.GenerateStreamResponse, None]:
        """The streamed generation; a moderated stream asks for ``moderated_stream_interval``
        engine steps per message once its first word is out (services/inference/coalesce.py)."""
        interval = self.settings.moderated_stream_interval if self.policy.enabled else 0
        return self.inference.stream(generate, blocks, interval)

    def _generation(
        self,
        request: chat_pb2.CompleteRequest,
        model: ModelInfo,
        messages: Sequence[common_pb2.ChatMessage],
        prompt: str,
    ) -> tuple[inference_pb2.GenerateRequest, list[int]]:
        """The inference request and the prefix blocks it is routed on."""
        generate = inference_pb2.GenerateRequest(
            model=model.name,
            messages=messages,
            prompt=prompt,
            **_generation_fields(request),
        )
        text = prompt or _prompt_text(messages, request.tools)
        blocks = prefix_blocks(text, self.settings.route_block_chars, self.settings.route_max_blocks)
        # The replica reports which of these keys its KV cache holds (WatchPrefixes).
        generate.route_prefix.keys.extend(blocks)
        generate.route_prefix.block_chars = self.settings.route_block_chars
        generate.route_prefix.text_chars = len(text)
        return generate, blocks

    async def _prepare_beside_lookup(
        self,
        request: chat_pb2.CompleteRequest,
        principal: Principal,
        model: ModelInfo,
        slot: Slot,
        *,
        messages: list[common_pb2.ChatMessage],
        prompt: str,
        key: cache_pb2.ResponseKey,
    ) -> Prepared:
        """The cache lookup with the stream's generation started beside it once the lookup
        leaves this gateway (gateway/speculation.py): kept on a miss, cancelled on a hit."""
        generate, blocks = self._generation(request, model, messages, prompt)
        # The generation's spans and routing attributes belong to the request, not the lookup.
        outside = contextvars.copy_context()
        started: list[Speculation[inference_pb2.GenerateStreamResponse]] = []
        remote = False

        def start() -> None:
            nonlocal remote
            remote = True
            if self.speculation.open():
                started.append(outside.run(Speculation, self._generate_stream(generate, blocks)))

        with start_span(_tracer, "gateway.cache.lookup"):
            lookup = await _answered(self.cache.lookup(key, before_remote=start), started)
        prepared = Prepared(request, principal, model, generate, blocks, messages, lookup, slot)
        return await self._settle(prepared, started, remote)

    async def _check_beside_lookup(
        self,
        request: chat_pb2.CompleteRequest,
        principal: Principal,
        model: ModelInfo,
        slot: Slot,
        *,
        scope: str,
        fail_open: bool,
    ) -> Prepared:
        """A stream's input check and cache lookup side by side (:meth:`_check_and_lookup`), and
        its generation started as soon as the check let the messages through unchanged while the
        lookup is still out: no engine sees input before the check passed it. A redaction
        means a lookup of the redacted messages, with the generation beside that one.

        With ``generate_before_input_check`` the generation starts beside the check instead, on
        the messages as sent, and is stopped when the check refuses or changes them."""
        outside = contextvars.copy_context()
        started: list[Speculation[inference_pb2.GenerateStreamResponse]] = []
        early: tuple[inference_pb2.GenerateRequest, list[int]] | None = None
        if self.settings.generate_before_input_check and self.speculation.open():
            # The operator's trade (off by default): the engine starts on the input as sent while
            # the check runs; nothing it generates is read before the check passed that input
            # unchanged, and a block, a redaction or a failed check stops it.
            early = self._generation(request, model, list(request.messages), request.prompt)
            started.append(outside.run(Speculation, self._generate_stream(*early)))
        with start_span(_tracer, "gateway.policy.input+cache.lookup"):
            try:
                messages, prompt, lookup_task, changed = await self._check_while_looking_up(
                    request, model, scope, fail_open, looked_up=started[0].looked_up if started else None
                )
            except BaseException:
                await _stopped(started, "refused")
                raise
            if changed:
                await _stopped(started, "refused")
                await self.cache.release(await lookup_task)
                key = _response_key(request, model, messages, prompt, scope)
                return await self._prepare_beside_lookup(
                    request, principal, model, slot, messages=messages, prompt=prompt, key=key
                )
            # Still out once the check answered: the lookup went to the cache service.
            remote = early is not None or not lookup_task.done()
            if early is not None:
                generate, blocks = early
            else:
                generate, blocks = self._generation(request, model, messages, prompt)
                if remote and self.speculation.open():
                    started.append(outside.run(Speculation, self._generate_stream(generate, blocks)))
            lookup = await _answered(lookup_task, started)
        prepared = Prepared(request, principal, model, generate, blocks, messages, lookup, slot)
        return await self._settle(prepared, started, remote)

    async def _settle(
        self,
        prepared: Prepared,
        started: list[Speculation[inference_pb2.GenerateStreamResponse]],
        remote: bool,
    ) -> Prepared:
        """The lookup has answered: a generation started beside it is kept on a miss (unless it
        gave up) and cancelled otherwise; a hit needs no generation request."""
        lookup = prepared.lookup
        for speculation in started:
            if lookup.status is not CacheStatus.HIT and speculation.settle():
                prepared.speculation = speculation
                outcome = "used"
            else:
                outcome = "late" if speculation.abandoned else "hit"
                await speculation.cancel()
            SPECULATIONS.labels(outcome).inc()
        if remote:
            # Whether a speculation would have been (or was) used: a miss it did not give up on.
            abandoned = any(s.abandoned for s in started)
            self.speculation.record(lookup.status is not CacheStatus.HIT and not abandoned)
        if lookup.status is CacheStatus.HIT and lookup.entry is not None:
            prepared.generate, prepared.blocks = inference_pb2.GenerateRequest(), []
        return prepared

    async def _check_input(
        self, request: chat_pb2.CompleteRequest, fail_open: bool
    ) -> tuple[list[common_pb2.ChatMessage], str]:
        """Policy on the new messages (or the raw prompt): what may be sent on, redacted."""
        with start_span(_tracer, "gateway.policy.input"):
            if request.prompt:
                checked = await self.policy.check_input(
                    [common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=request.prompt)], fail_open
                )
                return [], checked[0].content if checked else request.prompt
            messages, tools = await self.policy.check_request(
                list(request.messages), list(request.tools), fail_open
            )
            if tools != list(request.tools):
                # A redacted tool definition is what the model, and the cache key, get.
                del request.tools[:]
                request.tools.extend(tools)
            return messages, ""

    async def _check_beside_session(
        self, request: chat_pb2.CompleteRequest, model: ModelInfo, fail_open: bool
    ) -> tuple[list[common_pb2.ChatMessage], str, list[common_pb2.ChatMessage] | None]:
        """The input check and the session read side by side: neither needs the other (the
        session holds turns that passed the check when they were appended). A failed check wins
        over whatever the read answers, and stops it."""
        reading = asyncio.ensure_future(self._read_session(request, model))
        try:
            new_turns, prompt = await self._check_input(request, fail_open)
        except BaseException:
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
            raise
        return new_turns, prompt, await reading

    async def _read_session(
        self, request: chat_pb2.CompleteRequest, model: ModelInfo
    ) -> list[common_pb2.ChatMessage] | None:
        with start_span(_tracer, "gateway.session") as span:
            span.set_attribute("session.id", request.session_id)
            budget = max(0, model.max_model_len - self._answer_budget(request))
            return await self.cache.session(request.session_id, budget, model.name)

    async def _check_and_lookup(
        self, request: chat_pb2.CompleteRequest, model: ModelInfo, scope: str, fail_open: bool
    ) -> tuple[list[common_pb2.ChatMessage], str, Lookup]:
        """Without a session, the cache lookup runs beside the policy check instead of after it.

        The lookup is speculative: its answer is used only when the policy let the
        messages through unchanged. A redaction means a second lookup with the redacted
        messages; a block (or any error) gives back a lease the lookup may have taken.
        Either way nothing is served that the policy did not allow.
        """
        with start_span(_tracer, "gateway.policy.input+cache.lookup"):
            new_turns, prompt, lookup_task, changed = await self._check_while_looking_up(
                request, model, scope, fail_open
            )
            lookup = await lookup_task
            if changed:
                await self.cache.release(lookup)
                lookup = await self.cache.lookup(_response_key(request, model, new_turns, prompt, scope))
        return new_turns, prompt, lookup

    async def _check_while_looking_up(
        self,
        request: chat_pb2.CompleteRequest,
        model: ModelInfo,
        scope: str,
        fail_open: bool,
        looked_up: Callable[[], None] | None = None,
    ) -> tuple[list[common_pb2.ChatMessage], str, asyncio.Future[Lookup], bool]:
        """The input check with the lookup of the request as sent running beside it: the checked
        messages and prompt, the lookup (maybe still out), and whether the check changed what the
        lookup's key was made of (then its answer does not apply). A failed check gives back a
        lease the lookup may have taken. ``looked_up`` is called when the lookup answered."""
        first_key = _response_key(request, model, list(request.messages), request.prompt, scope)
        lookup_task = asyncio.ensure_future(self.cache.lookup(first_key))
        if looked_up is not None:
            lookup_task.add_done_callback(lambda _: looked_up())
        try:
            new_turns, prompt = await self._check_input(request, fail_open)
        except BaseException:
            with contextlib.suppress(Exception):
                await self.cache.release(await lookup_task)
            raise
        messages = list(new_turns)
        changed = (
            messages != list(request.messages)
            or prompt != request.prompt
            or list(first_key.tools) != list(request.tools)
        )
        return messages, prompt, lookup_task, changed

    def _answer_budget(self, request: chat_pb2.CompleteRequest) -> int:
        sampling = request.sampling
        if sampling.HasField("max_tokens"):
            return sampling.max_tokens
        return self.settings.session_reserve_tokens

    def _rag_settings(self, request: chat_pb2.CompleteRequest, principal: Principal) -> tuple[list[str], int]:
        return rag_settings(request.rag, principal.settings)

    def _rag_scope(self, request: chat_pb2.CompleteRequest, principal: Principal) -> str:
        return rag_response_scope(request.rag, principal.settings)

    # -- generation -----------------------------------------------------------------------------

    async def complete(self, prepared: Prepared) -> chat_pb2.CompleteResponse:
        """The whole answer (HIT: from the cache); gives back the request's slot."""
        try:
            await prepared.discard()  # prepared for a stream: generated here in one call
            return await self._complete(prepared)
        finally:
            prepared.slot.release()

    async def complete_all(self, prepared: Sequence[Prepared]) -> list[chat_pb2.CompleteResponse]:
        """A batch's answers, generated side by side; the first failure fails the batch and
        stops the other generations, so no slot is given back while its generation runs."""
        tasks = [asyncio.ensure_future(self.complete(p)) for p in prepared]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()
            try:
                await asyncio.gather(*tasks, return_exceptions=True)
            finally:
                # A task cancelled before it started never ran complete()'s finally.
                for p in prepared:
                    p.slot.release()

    async def _complete(self, prepared: Prepared) -> chat_pb2.CompleteResponse:
        ctx = rc.current()
        if prepared.lookup.status == CacheStatus.HIT and prepared.lookup.entry is not None:
            response = response_from_entry(ctx.request_id, prepared.lookup.entry, prepared.model.name)
            await self._finish(prepared, list(response.choices), response.usage, hit=True)
            return response
        ok = False
        try:
            with start_span(_tracer, "gateway.inference"):
                reply = await self.inference.generate(prepared.generate, prepared.blocks)
            fail_open = prepared.principal.settings.policy_fail_open
            with start_span(_tracer, "gateway.policy.output"):
                # Every choice, every field (text, tool calls, logprobs): see gateway/stages/output.py.
                choices = [await moderate_choice(self.policy, choice, fail_open) for choice in reply.choices]
            blocked = any(c.finish_reason == common_pb2.FINISH_REASON_CONTENT_FILTER for c in choices)
            timings = reply.timings
            timings.e2e_ms = (time.perf_counter() - prepared.started) * 1000
            await self._finish(prepared, choices, reply.usage, blocked=blocked)
            ok = True
            return chat_pb2.CompleteResponse(
                id=ctx.request_id,
                model=reply.model or prepared.model.name,
                choices=choices,
                usage=reply.usage,
                timings=timings,
                cache_status=_status_pb(ctx.cache_status),
            )
        finally:
            if not ok:
                await self.cache.release(prepared.lookup)

    def stream(self, prepared: Prepared) -> SlotStream[chat_pb2.CompleteStreamResponse]:
        """Stream messages; the last one carries usage and timings.

        The stream owns the request's slot from this call on: it is given back when the stream
        ends, fails or is cancelled, or when it is closed, even if it never started.
        """
        return SlotStream(self._stream(prepared), prepared.slot, prepared.discard)

    async def _stream(self, prepared: Prepared) -> AsyncGenerator[chat_pb2.CompleteStreamResponse, None]:
        ctx = rc.current()
        model = prepared.model.name
        if prepared.lookup.status == CacheStatus.HIT and prepared.lookup.entry is not None:
            entry = prepared.lookup.entry
            for message in stream_from_entry(ctx.request_id, entry, model):
                yield message
            await self._finish(prepared, list(entry.choices), entry.usage, hit=True)
            return
        fail_open = prepared.principal.settings.policy_fail_open
        # One moderated stream per choice (text, logprobs, tool calls: gateway/stages/output.py).
        moderated: dict[int, ChoiceStream] = {}
        builders: dict[int, ChoiceBuilder] = {}
        expected = max(1, prepared.request.sampling.n)
        usage = common_pb2.Usage()
        timings = common_pb2.Timings()
        ok = False
        blocked = False
        span = _tracer.start_span("gateway.inference")
        try:
            upstream = (
                prepared.speculation.messages()
                if prepared.speculation is not None
                else self._generate_stream(prepared.generate, prepared.blocks)
            )
            async for generated in upstream:
                out: list[common_pb2.CompletionDelta] = []
                for delta in generated.deltas:
                    choice = moderated.get(delta.index)
                    if choice is None:
                        choice = moderated[delta.index] = ChoiceStream(delta.index, self.policy, fail_open)
                        builders[delta.index] = ChoiceBuilder(delta.index)
                    if choice.done:
                        continue
                    piece = await choice.feed(delta)
                    builders[delta.index].add(piece, piece.text)
                    blocked = blocked or choice.blocked
                    # A delta the policy held back entirely carries nothing: skip it.
                    if piece.text or piece.tool_calls or piece.finish_reason or piece.logprobs:
                        out.append(piece)
                if generated.HasField("usage"):
                    usage.CopyFrom(generated.usage)
                if generated.HasField("timings"):
                    timings.CopyFrom(generated.timings)
                if out:
                    yield chat_pb2.CompleteStreamResponse(
                        id=ctx.request_id, model=generated.model or model, deltas=out
                    )
                if blocked and sum(c.done for c in moderated.values()) >= expected:
                    break  # every choice ended; leaving the loop cancels the engine request
            timings.e2e_ms = (time.perf_counter() - prepared.started) * 1000
            choices = [builders[i].build() for i in sorted(builders)]
            await self._finish(prepared, choices, usage, blocked=blocked)
            ok = True
            yield chat_pb2.CompleteStreamResponse(
                id=ctx.request_id,
                model=model,
                usage=usage,
                timings=timings,
                cache_status=_status_pb(ctx.cache_status),
                resumed=resumed_count(ctx),
            )
        finally:
            span.end()
            for choice in moderated.values():
                choice.close()
            await prepared.discard()
            if not ok:
                await self.cache.release(prepared.lookup)

    # -- after generation -----------------------------------------------------------------------

    async def _finish(
        self,
        prepared: Prepared,
        choices: Sequence[common_pb2.Completion],
        usage: common_pb2.Usage,
        *,
        hit: bool = False,
        blocked: bool = False,
    ) -> None:
        """Cache store, session append, token charge, audit record.

        An answer served without moderation (the policy service was down and the tenant fails
        open, :func:`~gateway.stages.policy.moderation_skipped`) is neither stored nor appended
        to the session: it must not outlive the outage as a HIT or as history.
        The response-cache store (or lease release) runs in the background: nothing in the
        response depends on it, so the end of the response does not wait on the cache (a
        request for the same key meanwhile waits on the single-flight lease, then hits). The
        session append is awaited (bounded by ``cache_write_timeout_s``): the response's last
        message carries the session version it produced, so the next turn can read its own
        write; a cache that does not answer in time makes the response ``BYPASS``.
        """
        ctx = rc.current()
        unmoderated = moderation_skipped(ctx)
        if unmoderated and not hit:
            ctx.set_cache_status(CacheStatus.BYPASS)
        with start_span(_tracer, "gateway.store"):
            if (
                not hit
                and not blocked
                and not unmoderated
                and not any(c.finish_reason == common_pb2.FINISH_REASON_ABORT for c in choices)
            ):
                derived = {
                    ns: v for ns, v in ctx.observed.items() if not ns.startswith(_CACHE_OWNED) and v > 0
                }
                entry = cache_entry(choices, usage, prepared.model.name, derived)
                self._in_background(self.cache.store(prepared.lookup, entry))
            elif not hit:
                self._in_background(self.cache.release(prepared.lookup))
            if prepared.request.session_id and choices and not blocked and not unmoderated:
                await self.cache.append(
                    prepared.request.session_id, [*prepared.new_turns, assistant_turn(choices[0])]
                )
        if not hit:
            await self.limiter.charge_tokens(prepared.principal, usage.total_tokens)
        await self.usage.record(
            prepared.principal,
            Outcome(
                model=prepared.model.name,
                input_tokens=0 if hit else usage.prompt_tokens,
                output_tokens=0 if hit else usage.completion_tokens,
                cache_hit=hit,
                blocked=blocked,
            ),
        )
        audit_log.info(
            "request %s tenant=%s model=%s cache=%s blocked=%s unmoderated=%s prompt_tokens=%d "
            "completion_tokens=%d",
            ctx.request_id,
            prepared.principal.tenant,
            prepared.model.name,
            ctx.cache_status or "-",
            blocked,
            unmoderated,
            usage.prompt_tokens,
            usage.completion_tokens,
        )

    def _in_background(self, write: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(write)  # runs in a copy of the request's context
        self._writes.add(task)
        task.add_done_callback(self._write_done)

    def _write_done(self, task: asyncio.Task[None]) -> None:
        self._writes.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("background cache write failed", exc_info=task.exception())

    async def drain(self) -> None:
        """Waits (bounded) for the cache writes still running; called at shutdown."""
        if self._writes:
            await asyncio.wait(set(self._writes), timeout=2 * self.settings.cache_write_timeout_s + 1)
        for task in set(self._writes):
            task.cancel()

    # -- embeddings -----------------------------------------------------------------------------

    async def embed(
        self, request: embeddings_pb2.EmbedRequest, principal: Principal, stub: object | None
    ) -> embeddings_pb2.EmbedResponse:
        """Embeddings under an admission slot, the rate limit and the token charge."""
        with self.admission.slot(tenant=principal.tenant, tenant_limit=principal.settings.max_inflight):
            return await self._embed(request, principal, stub)

    async def _embed(
        self, request: embeddings_pb2.EmbedRequest, principal: Principal, stub: object | None
    ) -> embeddings_pb2.EmbedResponse:
        if stub is None:
            raise Unavailable("no embeddings service is configured")
        if not request.texts:
            raise InvalidArgument("input must not be empty")
        await self.limiter.admit(principal)
        with start_span(_tracer, "gateway.embed"):
            reply: embeddings_pb2.EmbedResponse = await stub.Embed(request)  # type: ignore[attr-defined]
        await self.limiter.charge_tokens(principal, reply.total_tokens)
        await self.usage.record(principal, Outcome(model=reply.model, input_tokens=reply.total_tokens))
        return reply


def _status_pb(status: CacheStatus | None) -> common_pb2.CacheStatus:
    return status_pb(status)
