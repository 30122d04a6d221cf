"""The policy service's core: checks with audit and versions, ruleset reloads, the file watch.

No gRPC here: the servicer converts protos to these calls. The tenant and the
request id come from the request context; every decision appends an audit record
before it is returned (``Unavailable`` if the audit buffer is full), and every
check reports the tenant's ``policy`` namespace version through
``ctx.observe`` so that cached answers can be tied to the ruleset they passed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from policy import metrics
from policy.audit import AuditRecord, AuditSink
from policy.engine import Decision, Finding, Redactor, Segment, check_segments
from policy.memo import ScanMemo
from policy.rules import Action, Ruleset, RulesetDocument, RulesetError, Scope, parse_ruleset
from policy.share import RulesetShare
from policy.store import FileStamp, RulesetStore
from policy.stream import StreamModerator, StreamStep
from services.runtime import context as rc
from services.runtime import namespaces
from services.runtime.errors import (
    InvalidArgument,
    LlmeshError,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
)
from services.runtime.interceptors import stream_span
from services.runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)

# How long a tenant's policy version is reused before it is read from Redis again.
VERSION_TTL_S = 1.0

NAMESPACE = namespaces.POLICY
TENANTS_KEY = "llmesh:policy:tenants"
# The span of one check of a CheckInputs call (the call's own span covers them all).
CHECK_SPAN = "llmesh.v1.PolicyService/CheckInputs.check"


class VersionSource(Protocol):
    """``services.runtime.versions.VersionStore`` (or a fake)."""

    async def bump(self, tenant: str, namespace: str) -> int: ...

    async def get(self, tenant: str, namespace: str) -> int: ...


class TenantRegistry(Protocol):
    """Remembers which tenants exist, so a global ruleset change bumps all of them."""

    async def add(self, tenant: str) -> None: ...

    async def all(self) -> set[str]: ...


class RedisTenantRegistry:
    """Tenants in a Redis set (shared by every policy replica)."""

    def __init__(self, redis: Any, key: str = TENANTS_KEY) -> None:
        self._redis = redis
        self._key = key

    async def add(self, tenant: str) -> None:
        await self._redis.sadd(self._key, tenant)

    async def all(self) -> set[str]:
        members = await self._redis.smembers(self._key)
        return {m.decode() if isinstance(m, bytes) else str(m) for m in members}


@dataclass(frozen=True)
class ChatText:
    role: str
    content: str


@dataclass(frozen=True)
class InputText:
    """A client-written text of a request besides message contents: a participant name, a tool
    call's name or arguments, a tool definition's name, description or parameter schema."""

    # Where it is, e.g. "messages[2].tool_calls[0].function.arguments", "tools[0].function.name".
    field: str
    text: str
    # The message it belongs to; -1 for a tool definition.
    message_index: int = -1
    role: str = ""
    # JSON text (arguments, schemas): a redaction that breaks the JSON blocks the request.
    json: bool = False


# Entity type of the finding that blocks a request whose JSON field a redaction would break.
UNREDACTABLE = "UNREDACTABLE_JSON"


def _json_ok(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _guard_json(decision: Decision, texts: Sequence[InputText], first: int) -> Decision:
    """Blocks instead of sending a JSON field that its redaction made unparsable."""
    broken: list[Finding] = []
    for i, item in enumerate(texts):
        redacted = decision.redacted[first + i]
        if item.json and redacted != item.text and _json_ok(item.text) and not _json_ok(redacted):
            rules = sorted({f.rule_id for f in decision.findings if f.field == item.field})
            broken.extend(
                Finding(
                    rule_id,
                    "policy",
                    Action.BLOCK,
                    f"a redaction would leave {item.field} invalid JSON; the request is blocked",
                    UNREDACTABLE,
                    item.message_index,
                    0,
                    len(item.text),
                    1.0,
                    field=item.field,
                )
                for rule_id in rules
            )
    if not broken:
        return decision
    return replace(decision, action=Action.BLOCK, findings=(*decision.findings, *broken))


@dataclass(frozen=True)
class InputRequest:
    """One request's input check in a batch (CheckInputs): whose it is, and what
    :meth:`PolicyService.check_input` checks."""

    tenant: str
    request_id: str
    messages: Sequence[ChatText]
    documents: Sequence[str] = ()
    texts: Sequence[InputText] = ()
    # The caller's span for the request (W3C traceparent; "" none): the check's span is its child.
    traceparent: str = ""


@dataclass(frozen=True)
class InputResult:
    """One check's decision and the tenant's ``policy`` version (None: Redis unreachable), or
    why the check was refused (``error``)."""

    decision: Decision | None = None
    policy_version: int | None = None
    error: LlmeshError | None = None


@dataclass(frozen=True)
class OutputCheck:
    decision: Decision
    # What the caller may release: the redacted answer, or "" when blocked.
    released: str
    text_sha256: str
    response_sha256: str


@dataclass(frozen=True)
class ReloadResult:
    version: str
    rule_count: int
    policy_version: int


def count_findings(decision: Decision) -> None:
    for f in decision.findings:
        metrics.FINDINGS.labels(f.rule_id, f.entity_type).inc()


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class OutputStream:
    """One moderated answer stream; audits itself when it ends, is blocked, or is abandoned."""

    def __init__(
        self, service: PolicyService, ruleset: Ruleset, tenant: str, request_id: str, *, trailer: bool = True
    ) -> None:
        self._service = service
        self._tenant = tenant
        self._request_id = request_id
        # Whether the final step's response_sha256 also goes into the call's trailers (one
        # answer per call; a multiplexed call has it in each answer's final step only).
        self._trailer = trailer
        self.ruleset = ruleset
        self.moderator = StreamModerator(ruleset, tenant=tenant)
        self._audited = False

    @property
    def done(self) -> bool:
        return self.moderator.done

    def feed(self, delta: str, *, ahead_taken: bool = False) -> StreamStep:
        self._service.check_length(len(delta) + self.moderator.checked_chars)
        if ahead_taken and not self.moderator.done and not self.moderator.ahead_offered(delta):
            raise InvalidArgument(
                "ahead_taken is set on a delta whose first character the previous step offered no "
                "ahead step for"
            )
        return self._step(lambda: self.moderator.feed(delta, ahead_taken=ahead_taken))

    def finish(self) -> StreamStep:
        return self._step(self.moderator.finish)

    def close(self) -> None:
        """Audits a stream that ended without ``end`` or a block (cancelled, broken)."""
        if self._audited:
            return
        try:
            self._audit("stream_abandoned", "")
        except Unavailable:
            # Cleanup of a stream that is already over: nobody to refuse any more, so say it loudly.
            log.error(
                "stream %s of tenant %s ended unaudited: the audit buffer is full",
                self._request_id,
                self._tenant,
            )

    def _step(self, run: Callable[[], StreamStep]) -> StreamStep:
        if self.moderator.done:
            raise InvalidArgument("the stream has already ended; send nothing after end or a block")
        step: StreamStep = run()
        metrics.STREAM_HELD_BACK.observe(step.held_back)
        for f in step.findings:
            metrics.FINDINGS.labels(f.rule_id, f.entity_type).inc()
        if step.final:
            self._audit("stream", step.response_sha256)
            if self._trailer:
                rc.current().add_trailer(rc.RESPONSE_SHA256, step.response_sha256)
        return step

    def _audit(self, kind: str, response_sha256: str) -> None:
        self._audited = True
        m = self.moderator
        self._service.audit_decision(
            kind=kind,
            tenant=self._tenant,
            request_id=self._request_id,
            ruleset=self.ruleset,
            action=m.action,
            rule_ids=(f.rule_id for f in m.findings),
            text_sha256=m.checked.hexdigest(),
            response_sha256=response_sha256 or m.released.hexdigest(),
        )


class PolicyService:
    """Checks, streams, rulesets and reloads (see module doc)."""

    def __init__(
        self,
        store: RulesetStore,
        audit: AuditSink,
        versions: VersionSource | None,
        tenants: TenantRegistry | None,
        *,
        max_text_chars: int = 1_000_000,
        max_streams_per_call: int = 10_000,
        max_checks_per_call: int = 256,
        admin_tenants: Iterable[str] = (),
        redis_retry_s: float = 2.0,
        share: RulesetShare | None = None,
        scan_memo: ScanMemo | None = None,
    ) -> None:
        self.store = store
        self.audit = audit
        self.versions = versions
        self.tenants = tenants
        self.max_text_chars = max_text_chars
        self.max_streams_per_call = max_streams_per_call
        self.max_checks_per_call = max_checks_per_call
        self.admin_tenants = frozenset(admin_tenants)
        self.redis_retry_s = redis_retry_s
        self.share = share
        # Matches of input texts checked before, per tenant (policy/memo.py); None = none kept.
        self.scan_memo = scan_memo
        # Digest of a shared ruleset that failed to parse (reported once, not every tick).
        self._rejected_share: str | None = None
        # tenant -> (policy version, monotonic time it was read).
        self._policy_versions: dict[str, tuple[int, float]] = {}
        self._redis_down_until = 0.0
        self._reload_lock = asyncio.Lock()
        self._watch_task: asyncio.Task[None] | None = None

    # --- checks ---

    def ruleset_for(self, tenant: str) -> Ruleset:
        return self.store.document.for_tenant(tenant)

    def check_length(self, chars: int) -> None:
        if chars > self.max_text_chars:
            raise InvalidArgument(f"the text is {chars} characters long; the limit is {self.max_text_chars}")

    async def check_input(
        self, messages: Sequence[ChatText], documents: Sequence[str], texts: Sequence[InputText] = ()
    ) -> Decision:
        """Checks every client text of a request (message contents, then ``texts``: names, tool
        calls, tool definitions) and retrieved documents (indirect injection) with the input rules.

        ``Decision.redacted`` holds the messages' contents, then the ``texts``, in order.
        """
        ctx = rc.current()
        self.check_length(
            sum(len(m.content) for m in messages) + sum(len(t.text) for t in texts) + sum(map(len, documents))
        )
        ruleset = self.ruleset_for(ctx.tenant)
        segments = [Segment(m.content, i, role=m.role, field="content") for i, m in enumerate(messages)]
        segments.extend(Segment(t.text, t.message_index, role=t.role, field=t.field) for t in texts)
        segments.extend(Segment(d, i, document=True) for i, d in enumerate(documents))
        checked = check_segments(ruleset, Scope.INPUT, segments, memo=self.scan_memo, tenant=ctx.tenant)
        decision = _guard_json(checked, texts, len(messages))
        count_findings(decision)
        self.audit_decision(
            kind="input",
            tenant=ctx.tenant,
            request_id=ctx.request_id,
            ruleset=ruleset,
            action=decision.action,
            rule_ids=(f.rule_id for f in decision.findings),
            text_sha256=decision.text_sha256,
            response_sha256="",
            text="\n".join([*(m.content for m in messages), *(t.text for t in texts)]),
        )
        await self._observe(ctx)
        return decision

    def check_count(self, checks: int) -> None:
        """InvalidArgument for more checks in one call than allowed (before any is checked)."""
        if checks > self.max_checks_per_call:
            raise InvalidArgument(
                f"{checks} checks in one call; the limit is {self.max_checks_per_call}: send fewer per call"
            )

    async def check_inputs(self, checks: Sequence[InputRequest]) -> AsyncIterator[InputResult]:
        """Many requests' input checks, each result as soon as its check is done, in order; each
        as :meth:`check_input` in a context of its own (its tenant and request id: the audit
        record, the rules, the version). A refused check (bad tenant, past the text limit, audit
        log unavailable) leaves the others answered."""
        self.check_count(len(checks))
        for check in checks:
            try:
                if not check.tenant:
                    raise InvalidArgument("a check names no tenant (InputCheck.tenant)")
                ctx = rc.new_context(
                    tenant=rc.tenant_name(check.tenant), request_id=rc.request_id_value(check.request_id)
                )
                token = rc.activate(ctx)
                try:
                    with stream_span(CHECK_SPAN, check.traceparent):
                        decision = await self.check_input(check.messages, check.documents, check.texts)
                finally:
                    rc.deactivate(token)
            except LlmeshError as exc:
                yield InputResult(error=exc)
                continue
            yield InputResult(decision, ctx.observed.get(NAMESPACE))

    async def check_output(self, text: str) -> OutputCheck:
        """Checks a whole answer: the decision, the text to release and their SHA-256s."""
        ctx = rc.current()
        self.check_length(len(text))
        ruleset = self.ruleset_for(ctx.tenant)
        decision = check_segments(ruleset, Scope.OUTPUT, [Segment(text, 0)], Redactor())
        count_findings(decision)
        released = "" if decision.action == Action.BLOCK else decision.redacted[0]
        response_sha = sha256_text(released)
        self.audit_decision(
            kind="output",
            tenant=ctx.tenant,
            request_id=ctx.request_id,
            ruleset=ruleset,
            action=decision.action,
            rule_ids=(f.rule_id for f in decision.findings),
            text_sha256=sha256_text(text),
            response_sha256=response_sha,
            text=text,
        )
        await self._observe(ctx)
        ctx.add_trailer(rc.RESPONSE_SHA256, response_sha)
        return OutputCheck(decision, released, sha256_text(text), response_sha)

    async def open_stream(self) -> OutputStream:
        """A moderated output stream bound to the ruleset active now."""
        ctx = rc.current()
        stream, version = await self.open_stream_for(ctx.tenant, ctx.request_id)
        if version is not None:
            ctx.observe(NAMESPACE, version)
        return stream

    async def open_stream_for(
        self, tenant: str, request_id: str, *, trailer: bool = True
    ) -> tuple[OutputStream, int | None]:
        """A moderated output stream of ``tenant`` bound to the ruleset active now, and the
        tenant's ``policy`` version (None while Redis is unreachable)."""
        ruleset = self.ruleset_for(tenant)
        if not self.audit.accepting:
            raise Unavailable("the audit log is unavailable; streams are refused rather than left unaudited")
        version = await self.policy_version(tenant)
        return OutputStream(self, ruleset, tenant, request_id, trailer=trailer), version

    def stream_set(self) -> StreamSet:
        """The answers of one multiplexed moderation call (ModerateStreams)."""
        return StreamSet(self, self.max_streams_per_call)

    def audit_decision(
        self,
        *,
        kind: str,
        tenant: str,
        request_id: str,
        ruleset: Ruleset,
        action: Action,
        rule_ids: Iterable[str],
        text_sha256: str,
        response_sha256: str,
        text: str | None = None,
    ) -> None:
        metrics.DECISIONS.labels(kind, action.name.lower()).inc()
        self.audit.append(
            AuditRecord(
                request_id=request_id,
                tenant=tenant,
                ruleset_version=ruleset.version,
                rule_ids=tuple(sorted(set(rule_ids))),
                action=action.name.lower(),
                kind=kind,
                text_sha256=text_sha256,
                response_sha256=response_sha256,
                text=text if ruleset.audit_store_text else None,
            )
        )

    # --- versions ---

    async def _observe(self, ctx: rc.RequestContext) -> None:
        version = await self.policy_version(ctx.tenant)
        if version is not None:
            ctx.observe(NAMESPACE, version)

    async def policy_version(self, tenant: str) -> int | None:
        """The tenant's ``policy`` version (cached for ``VERSION_TTL_S``; None while Redis is
        unreachable). The cache bounds how long a bump made elsewhere (another replica, an
        Invalidate, a Redis restart) goes unseen; meanwhile answers carry the older version,
        which the response cache refuses to store — a miss, never a stale hit."""
        cached = self._policy_versions.get(tenant)
        if cached is not None and time.monotonic() - cached[1] < VERSION_TTL_S:
            return cached[0]
        if self.versions is None or time.monotonic() < self._redis_down_until:
            return None
        try:
            if self.tenants is not None:
                await self.tenants.add(tenant)
            version = await self.versions.get(tenant, NAMESPACE)
        except Exception as exc:  # any Redis failure: checks go on without a version
            self._redis_down_until = time.monotonic() + self.redis_retry_s
            log.warning("cannot read the policy version of tenant %s: %s", tenant, exc)
            return None
        self._policy_versions[tenant] = (version, time.monotonic())
        return version

    # --- rulesets ---

    def get_ruleset(self) -> Ruleset:
        return self.ruleset_for(rc.current().tenant)

    async def reload(self, yaml_text: str) -> ReloadResult:
        """Validates and swaps in a ruleset (the YAML given, or the file again), then bumps versions."""
        # Who may reload is the runtime's admin check (services.runtime.authz: admin identity or
        # admin token); a tenant is no credential. admin_tenants only narrows the tenants named.
        ctx = rc.current()
        if self.admin_tenants and ctx.tenant not in self.admin_tenants:
            raise PermissionDenied(f"tenant {ctx.tenant!r} may not replace the ruleset (admin_tenants)")
        tenant = ctx.tenant or rc.DEFAULT_TENANT
        try:
            if yaml_text:
                document, file_stamp = self.store.parse_api(yaml_text), None
            else:
                document, file_stamp = self.store.read_file()
        except RulesetError as exc:
            metrics.RULESET_RELOADS.labels("api" if yaml_text else "file", "invalid").inc()
            raise InvalidArgument(f"invalid ruleset ({exc}); the active ruleset is unchanged") from exc
        except OSError as exc:
            raise InvalidArgument(f"cannot read the ruleset file {self.store.path}: {exc}") from exc
        bumped = await self._apply(document, file_stamp, extra_tenants=[tenant], shared_yaml=yaml_text)
        version = bumped.get(tenant, 0)
        if version:
            ctx.observe(NAMESPACE, version)
        return ReloadResult(document.version, len(document.for_tenant(tenant).rules), version)

    async def _apply(
        self,
        document: RulesetDocument,
        file_stamp: FileStamp | None,
        extra_tenants: Sequence[str] = (),
        shared_yaml: str = "",
    ) -> dict[str, int]:
        """Swaps, bumps the versions, then shares the ruleset with the other replicas ("" = the file)."""
        async with self._reload_lock:
            old, old_stamp = self.store.document, self.store.applied_stamp
            # Swap first, then bump: a check between the two uses the new rules under the old
            # version, which only costs a cache miss later; the other order could cache an answer
            # checked by the old rules under the new version.
            self.store.swap(document, file_stamp)
            try:
                bumped = await self._bump_all(document, extra_tenants)
                if self.share is not None:
                    if shared_yaml:
                        await self.share.publish(shared_yaml, document.digest)
                    else:
                        await self.share.clear()
            except Exception as exc:
                self.store.restore(old, old_stamp)
                metrics.RULESET_RELOADS.labels("api" if shared_yaml else "file", "failed").inc()
                log.error(
                    "ruleset %s rolled back: the policy version could not be bumped or shared: %s",
                    document.version,
                    exc,
                )
                raise Unavailable(
                    f"the ruleset could not be recorded in Redis ({exc}); ruleset {old.version} stays "
                    "active so that cached answers and the other replicas stay consistent"
                ) from exc
            metrics.RULESET_RELOADS.labels("api" if shared_yaml else "file", "ok").inc()
            return bumped

    async def _bump_all(self, document: RulesetDocument, extra: Sequence[str]) -> dict[str, int]:
        if self.versions is None:
            return {}
        tenants = {rc.DEFAULT_TENANT, *document.tenants, *extra, *self._policy_versions}
        if self.tenants is not None:
            tenants |= await self.tenants.all()
        bumped: dict[str, int] = {}
        for tenant in sorted(tenants):
            bumped[tenant] = await self.versions.bump(tenant, NAMESPACE)
        now = time.monotonic()
        self._policy_versions.update({t: (v, now) for t, v in bumped.items()})
        self._redis_down_until = 0.0
        return bumped

    # --- file watch ---

    async def reload_file_if_changed(self) -> bool:
        """One watch tick: reloads the file if it changed; True if a new ruleset became active."""
        new_stamp = self.store.file_changed()
        if new_stamp is None:
            return False
        try:
            document, file_stamp = self.store.read_file()
        except (RulesetError, OSError) as exc:
            metrics.RULESET_RELOADS.labels("file", "invalid").inc()
            self.store.rejected_stamp = new_stamp
            log.error("ruleset file %s rejected (%s); the active ruleset is unchanged", self.store.path, exc)
            return False
        try:
            await self._apply(document, file_stamp)
        except Unavailable as exc:
            log.error("ruleset file %s not applied yet: %s", self.store.path, exc)
            return False
        return True

    async def sync_shared(self) -> bool:
        """Adopts the ruleset another replica shared (or its return to the file); True if swapped.

        No version bump: the replica that took the reload already bumped before sharing.
        """
        if self.share is None:
            return False
        try:
            digest = await self.share.digest()
            active = self.store.document
            if digest is None:
                if active.source != "api":
                    return False
                document, file_stamp = self.store.read_file()
            elif digest in (active.digest, self._rejected_share):
                return False
            else:
                shared = await self.share.fetch()
                if shared is None:
                    return False
                document, file_stamp = parse_ruleset(shared[0], "api"), None
        except RulesetError as exc:
            metrics.RULESET_RELOADS.labels("shared", "invalid").inc()
            self._rejected_share = digest
            log.error("shared ruleset %s rejected (%s); the active ruleset is unchanged", digest, exc)
            return False
        except Exception as exc:  # Redis or the file unreachable: try again next tick
            log.warning("cannot sync the shared ruleset: %s", exc)
            return False
        metrics.RULESET_RELOADS.labels("shared", "ok").inc()
        async with self._reload_lock:
            self.store.swap(document, file_stamp)
            # Versions may have moved on in Redis: read them again rather than report stale ones.
            self._policy_versions.clear()
        return True

    def start_watch(self, interval_s: float) -> None:
        if self._watch_task is None and interval_s > 0:
            self._watch_task = asyncio.get_running_loop().create_task(
                self._watch(interval_s), name="ruleset-watch"
            )

    async def _watch(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.reload_file_if_changed()
                await self.sync_shared()
            except Exception:  # the watcher must survive anything one tick does
                log.exception("ruleset watch tick failed")

    async def stop_watch(self) -> None:
        if self._watch_task is not None:
            await cancel_and_wait(self._watch_task)
            self._watch_task = None


@dataclass(frozen=True)
class StreamEvent:
    """One event of one answer of a multiplexed call: ``kind`` is delta, end or cancel;
    ``open`` (tenant, request id) on the answer's first event."""

    stream: int
    kind: str
    delta: str = ""
    open: tuple[str, str] | None = None
    # The delta begins with the character of one of its previous step's ahead steps.
    ahead_taken: bool = False


@dataclass(frozen=True)
class StreamSetStep:
    """What one event let out (``step``), or why it was refused (``error``: the answer is closed)."""

    stream: int
    step: StreamStep | None = None
    ruleset_version: str = ""
    # On the answer's first step: the tenant's policy version (None: Redis unreachable).
    policy_version: int | None = None
    error: LlmeshError | None = None


class StreamSet:
    """The answers of one ModerateStreams call, by the caller's numbers: each is an
    :class:`OutputStream` with the rules of a call of its own, and a refused event closes only
    its answer. Answers still open when the call ends are audited as abandoned (:meth:`close`)."""

    def __init__(self, service: PolicyService, limit: int) -> None:
        self._service = service
        self._limit = limit
        self._open: dict[int, OutputStream] = {}

    def __len__(self) -> int:
        return len(self._open)

    async def apply(self, events: Sequence[StreamEvent]) -> list[StreamSetStep]:
        """Each event in order; one step per delta or end (none for a cancel)."""
        steps: list[StreamSetStep] = []
        for event in events:
            try:
                step = await self._apply(event)
            except LlmeshError as exc:
                self._drop(event.stream)
                steps.append(StreamSetStep(event.stream, error=exc))
                continue
            if step is not None:
                steps.append(step)
        return steps

    async def _apply(self, event: StreamEvent) -> StreamSetStep | None:
        if event.kind == "cancel":
            self._drop(event.stream)
            return None
        version: int | None = None
        stream = self._open.get(event.stream)
        if event.open is not None:
            if stream is not None:
                raise InvalidArgument(f"stream {event.stream} is open already: only its first event opens it")
            if len(self._open) >= self._limit:
                raise ResourceExhausted(
                    f"{self._limit} answers are open on this call already; end some or open another call"
                )
            tenant, request_id = event.open
            if not tenant:
                raise InvalidArgument(f"stream {event.stream} names no tenant (StreamOpen.tenant)")
            stream, version = await self._service.open_stream_for(
                rc.tenant_name(tenant), rc.request_id_value(request_id), trailer=False
            )
            self._open[event.stream] = stream
        elif stream is None:
            raise InvalidArgument(
                f"stream {event.stream} is not open: its first event carries open, and an ended "
                "or refused stream takes no more events"
            )
        if event.kind == "end":
            step = stream.finish()
        elif event.kind == "delta":
            step = stream.feed(event.delta, ahead_taken=event.ahead_taken)
        else:
            raise InvalidArgument(f"the event of stream {event.stream} has neither delta, end nor cancel")
        if step.final:
            del self._open[event.stream]
        return StreamSetStep(event.stream, step, stream.ruleset.version, version)

    def _drop(self, stream_id: int) -> None:
        stream = self._open.pop(stream_id, None)
        if stream is not None:
            stream.close()

    def close(self) -> None:
        """Audits every answer still open as abandoned."""
        open_, self._open = self._open, {}
        for stream in open_.values():
            stream.close()
